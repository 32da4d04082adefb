#!/usr/bin/env python3
"""jobspec_openapi.py DUMP OPENAPI — openapi.yaml's JobSpec is the field table.

DUMP is tests/common's jobspec_schema_dump (common/jobspec.c's FIELDS as
JSON). Every property of the JobSpec schema, followed into its sections
and through $refs, must be a row with the same type, required flag, enum
values, bounds (minimum, maximum, their exclusive forms, minLength,
maxLength, maxItems) and default, and every row a property. A data path
row is a DataPath and a DataPath is a data path row; every section refuses
unknown properties as the parser does. Exit 77 (skipped) without PyYAML.
"""
import json
import subprocess
import sys

try:
    import yaml
except ImportError:
    print("PyYAML missing: skipped")
    sys.exit(77)

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
          "maxLength", "maxItems")


def resolve(schemas, node):
    """The schema a property names (through $ref), and the ref's name."""
    ref = None
    while "$ref" in node:
        ref = node["$ref"].rsplit("/", 1)[-1]
        node = schemas[ref]
    return node, ref


def properties(schemas, node, prefix=""):
    """{dotted path: (schema, ref name, required)} of node's properties, recursively."""
    out = {}
    required = set(node.get("required", []))
    for name, child in node.get("properties", {}).items():
        path = prefix + name
        child, ref = resolve(schemas, child)
        out[path] = (child, ref, name in required)
        if child.get("type") == "object" and "properties" in child:
            out.update(properties(schemas, child, path + "."))
    return out


def same(a, b):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return not isinstance(b, bool) and float(a) == float(b) and (a == b or abs(a) < 2**53)
    return a == b


def compare(row, schema, ref, required):
    """The differences between one table row and its openapi property."""
    p, bad = row["path"], []
    if schema.get("type") != row["type"]:
        bad.append(f"{p}: type {schema.get('type')!r} in openapi.yaml, {row['type']!r} in the table")
    if required != row["required"]:
        bad.append(f"{p}: required {required} in openapi.yaml, {row['required']} in the table")
    if (ref == "DataPath") != (row.get("kind") == "path"):
        bad.append(f"{p}: a data path in {'openapi.yaml' if ref == 'DataPath' else 'the table'} only")
    if schema.get("enum") != row.get("enum"):
        bad.append(f"{p}: enum {schema.get('enum')} in openapi.yaml, {row.get('enum')} in the table")
    for k in BOUNDS:
        if (k in schema) != (k in row) or (k in row and not same(schema[k], row[k])):
            bad.append(f"{p}: {k} {schema.get(k)} in openapi.yaml, {row.get(k)} in the table")
    if ("default" in schema) != ("default" in row) or not same(schema.get("default"), row.get("default")):
        bad.append(f"{p}: default {schema.get('default')!r} in openapi.yaml, "
                   f"{row.get('default')!r} in the table")
    if row["type"] == "object" and "properties" in schema and schema.get("additionalProperties") is not False:
        bad.append(f"{p}: openapi.yaml allows unknown properties; the parser refuses them")
    return bad


def main(argv):
    if len(argv) != 2:
        print("usage: jobspec_openapi.py DUMP OPENAPI")
        return 2
    rows = json.loads(subprocess.run([argv[0]], check=True, capture_output=True, text=True).stdout)
    with open(argv[1], encoding="utf-8") as f:
        schemas = yaml.safe_load(f)["components"]["schemas"]
    spec = schemas["JobSpec"]
    props = properties(schemas, spec)
    bad = [] if spec.get("additionalProperties") is False else ["JobSpec allows unknown properties"]
    paths = set()
    for row in rows:
        paths.add(row["path"])
        if row["path"] not in props:
            bad.append(f"{row['path']}: in the table, not in openapi.yaml's JobSpec")
            continue
        bad += compare(row, *props[row["path"]])
    bad += [f"{p}: in openapi.yaml's JobSpec, not in the table" for p in sorted(set(props) - paths)]
    for b in bad:
        print(b)
    print(f"jobspec_openapi: {len(rows)} rows, {len(props)} properties, {len(bad)} differences")
    return 1 if bad or len(rows) < 10 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
