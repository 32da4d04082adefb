#!/usr/bin/env python3
"""server_deps.py [--max N] [ROOT] — the dependency graph of server/*.c.

A file depends on another when it includes (directly or through other
server headers) a header declaring a function the other file defines, and
uses that function. Reports the strongly connected components (circles of
files that depend on each other) and the DFS back-edges (the edges that
close circles). With --max N, exits 1 when a circle holds more than N
files; tests/style runs it with 3.
"""
import os
import re
import sys

CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined", "typedef",
            "void", "int", "char", "bool", "struct", "const", "static", "_Atomic"}


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def main(argv):
    limit = None
    if len(argv) > 1 and argv[0] == "--max":
        limit, argv = int(argv[1]), argv[2:]
    root = argv[0] if argv else os.path.join(os.path.dirname(__file__), "..", "..")
    sdir = os.path.join(root, "server")
    files = sorted(f for f in os.listdir(sdir) if f.endswith((".c", ".h")))
    raw = {f: open(os.path.join(sdir, f), encoding="utf-8").read() for f in files}
    code = {f: strip(t) for f, t in raw.items()}
    incs = {f: [h for h in re.findall(r'#include\s+"([^"]+)"', raw[f]) if h in raw] for f in files}
    # Functions each .c defines (external linkage: not static).
    defines = {}
    for f in files:
        if not f.endswith(".c"):
            continue
        for line in code[f].splitlines():
            if line[:1].isalpha() and not line.startswith(("static", "typedef", "#")) and \
                    not line.rstrip().endswith(";"):
                m = re.search(r"\b([A-Za-z_]\w*)\s*\(", line)
                if m:
                    defines.setdefault(m.group(1), set()).add(f)
    declared = {h: {n for n in CALL.findall(code[h]) if n not in KEYWORDS} for h in files
                if h.endswith(".h")}

    def reach(f, seen=None):
        seen = set() if seen is None else seen
        for h in incs[f]:
            if h not in seen:
                seen.add(h)
                reach(h, seen)
        return seen

    cfiles = [f for f in files if f.endswith(".c")]
    edges = {f: set() for f in cfiles}
    for a in cfiles:
        used = set(re.findall(r"\b[A-Za-z_]\w*\b", code[a]))
        for h in reach(a):
            for n in declared[h] & used:
                for b in defines.get(n, ()):
                    if b != a:
                        edges[a].add(b)
    if os.environ.get("TY_DEPS_EDGES"):  # every edge, for a look by hand
        for a in cfiles:
            print(a, "->", " ".join(sorted(edges[a])))
    # Tarjan's strongly connected components.
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in cfiles:
        if v not in index:
            strong(v)
    # DFS back-edges: edges to a file still on the DFS path.
    state, back = {}, []

    def dfs(v):
        state[v] = 1
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                back.append((v, w))
            elif w not in state:
                dfs(w)
        state[v] = 2

    for v in cfiles:
        if v not in state:
            dfs(v)
    circles = sorted((c for c in sccs if len(c) > 1), key=len, reverse=True)
    nedges = sum(len(e) for e in edges.values())
    print(f"server: {len(cfiles)} .c files, {nedges} dependency edges")
    print(f"circles: {len(circles)}, largest {max((len(c) for c in circles), default=0)} files, "
          f"{sum(len(c) for c in circles)} files in circles, {len(back)} back-edges")
    for c in circles:
        print(f"  circle of {len(c)}: {' '.join(c)}")
    for a, b in back:
        print(f"  back-edge {a} -> {b}")
    if limit is not None and any(len(c) > limit for c in circles):
        print(f"server_deps: a circle of more than {limit} files", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
