#!/usr/bin/env python3
"""spec_reads.py [ROOT] — server code reads a job's spec only parsed.

common/jobspec.c is the one place that knows the spec's layout: the server
reads a job's spec through srv_job_spec (server/state.h) and struct
jobspec, never as JSON by field name. This fails when a daemon file of
server/ calls json_object_get*/json_unpack* with the name of a top-level
spec field or section (taken from jobspec.c's FIELDS table, so a new
section is covered at once), or json_loads* a variable named like a
stored spec (j.spec, spec_json). The client files (cli*.c, demo.c) read
the API's answers, not the stored row, and are left out. Before the tree,
the checker runs on built-in snippets and must flag the bad ones, so it
cannot pass by matching nothing.
"""
import glob
import os
import re
import sys

CLIENT = re.compile(r"^(cli\w*|demo)\.c$")
CALL = re.compile(r"\bjson_(?:object_get\w*|unpack\w*)\s*\(([^;]*)")
LOAD = re.compile(r"\bjson_load\w*\s*\(\s*[\w.>-]*(?:\.|->|\b)spec(?:_json|_text)?\s*[,)]")
LITERAL = re.compile(r'"((?:\\.|[^"\\])*)"')


def strip_comments(text):
    """Comments out, their line breaks kept so line numbers stay right."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n") or " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def spec_names(jobspec_c):
    """The top-level names of FIELDS rows ("model", "checkpoint", ...)."""
    with open(jobspec_c, encoding="utf-8") as f:
        text = f.read()
    start = text.find("static const field FIELDS[]")
    end = text.find("};", start)
    if start < 0 or end < 0:
        return set()
    rows = re.findall(r'\{\s*"([a-z_][a-z0-9_]*)"\s*,', text[start:end])
    return set(rows)


def faults(name, text, names):
    """(line, message) for every raw spec read in one file's text."""
    out = []
    body = strip_comments(text)
    for m in CALL.finditer(body):
        hits = sorted(set(LITERAL.findall(m.group(1))) & names)
        if hits:
            line = body.count("\n", 0, m.start()) + 1
            out.append((line, f"{name}:{line}: reads spec field {', '.join(hits)} from JSON; "
                              "use srv_job_spec and struct jobspec"))
    for m in LOAD.finditer(body):
        line = body.count("\n", 0, m.start()) + 1
        out.append((line, f"{name}:{line}: loads a stored spec as JSON; use srv_job_spec"))
    return out


def self_test(names):
    bad = [
        'const char *s = json_string_value(json_object_get(\n    json_object_get(spec, "checkpoint"), "store"));',
        'json_t *w = json_object_get(job_spec, "webhooks");',
        'json_t *spec = json_loads(j.spec, 0, NULL);',
        'json_unpack(spec, "{s:{s:i}}", "resources", "gpus", &g);',
    ]
    good = [
        'json_t *m = json_object_get(o, "step"); /* "checkpoint" in a comment */',
        'char *t = jobspec_to_json(&spec);',
    ]
    ok = all(faults("bad.c", b, names) for b in bad) and not any(faults("good.c", g, names) for g in good)
    if not ok:
        print("spec_reads: the checker's self-test failed")
    return ok


def main(argv):
    root = argv[0] if argv else os.path.join(os.path.dirname(__file__), "..", "..")
    names = spec_names(os.path.join(root, "common", "jobspec.c"))
    if not {"checkpoint", "resources", "webhooks", "hyperparameters"} <= names:
        print(f"spec_reads: cannot read the field table of common/jobspec.c (found {sorted(names)})")
        return 1
    if not self_test(names):
        return 1
    found = []
    for path in sorted(glob.glob(os.path.join(root, "server", "*.c"))):
        base = os.path.basename(path)
        if CLIENT.match(base):
            continue
        with open(path, encoding="utf-8") as f:
            found += [m for _, m in faults("server/" + base, f.read(), names)]
    for m in found:
        print(m)
    print(f"spec_reads: {len(found)} raw spec reads in server/ ({len(names)} spec names checked)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
