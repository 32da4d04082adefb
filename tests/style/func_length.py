#!/usr/bin/env python3
"""func_length.py [--max N] [ROOT] — functions of server/*.c over N lines.

A function is a definition starting in column 0 whose body opens with a
"{" line in column 0 and ends at the next "}" line in column 0 (the shape
clang-format gives every definition here); its length counts the lines
from the signature's first to the closing brace. Functions in LONG, which
predate the limit, may not grow past the length they had then; every other
function must stay within N (60 unless given). Exits 1 naming each
offender, its file and line, and its length.
"""
import os
import re
import sys

# Longer than the limit already: each may shrink, none may grow.
LONG = {
    "cli.c:cmd_generate": 74,
    "cli.c:cmd_watch": 81,
    "cli.c:cli_main": 69,
    "cli_ops.c:cmd_patch": 62,
    "cli_ops.c:cmd_usage": 68,
    "config.c:srv_config_parse": 73,
    "demo.c:demo_main": 105,
    "exec_local.c:spawn_rank": 70,
    "exec_mpirun.c:mpirun_start": 103,
    "exec_slurm.c:slurm_start": 86,
    "queue.c:ops_get_queue": 99,
    "routes.c:get_metrics_of_job": 66,
    "serve.c:srv_serve_main": 76,
    "sse.c:events_cb": 63,
    "token.c:srv_token_main": 63,
    "upload.c:do_export": 64,
    "usage.c:ops_get_usage": 96,
}

SIG = re.compile(r"^[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\(")


def functions(path):
    """(name, first line, length) of each definition in the file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, start, name = [], None, None
    for i, line in enumerate(lines):
        if start is None:
            m = SIG.match(line)
            if m and not line.startswith(("typedef", "#", "static const", "const ")) \
                    and not line.rstrip().endswith(";"):
                start, name = i, m.group(1)
            continue
        if line.startswith("{"):
            continue
        if line.rstrip().endswith(";") and not line.startswith((" ", "\t", "}")):
            start = None  # a prototype split over lines
        elif line.startswith("}"):
            out.append((name, start + 1, i - start + 1))
            start = None
    return out


def main(argv):
    limit = 60
    if len(argv) > 1 and argv[0] == "--max":
        limit, argv = int(argv[1]), argv[2:]
    root = argv[0] if argv else os.path.join(os.path.dirname(__file__), "..", "..")
    sdir = os.path.join(root, "server")
    bad = 0
    for f in sorted(os.listdir(sdir)):
        if not f.endswith(".c"):
            continue
        for name, line, n in functions(os.path.join(sdir, f)):
            cap = max(limit, LONG.get(f"{f}:{name}", 0))
            if f"{f}:{name}" in LONG and n <= limit:
                print(f"server/{f}:{line}: {name} is {n} lines now: drop it from LONG")
            if n > cap:
                print(f"server/{f}:{line}: {name} is {n} lines (at most {cap})")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
