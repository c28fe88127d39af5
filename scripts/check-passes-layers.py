#!/usr/bin/env python3
"""check-passes-layers.py — passes/ has no circle of files: no two files call each other,
directly or through others.

The call graph is read from the compiled objects of the sbppasses library (nm: the symbols each
object defines and the ones it needs), so it is the real one, macros and function-pointer tables
included. Each object's file is a node; an edge f -> g means f uses a symbol g defines. Any
strongly connected component of more than one file is a circle: it is printed with the symbols
that close it, and the exit status is 1. Without a circle the files are printed by layer
(layer 0 calls nothing else in passes/; layer k calls only layers below k).

The quoted #includes among passes/*.h are checked the same way when --headers DIR is given.

  scripts/check-passes-layers.py OBJ... [--headers passes/]     (ctest: passes_layers)
  scripts/check-passes-layers.py --self-test                     (the checker finds a circle)
"""
import collections
import os
import re
import subprocess
import sys


def sccs(graph):
    """Tarjan's strongly connected components of {node: set(successors)}."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layers(graph):
    """Layer of each node of an acyclic graph: 0 for no successors, else 1 + the max below."""
    memo = {}

    def level(v):
        if v not in memo:
            memo[v] = 1 + max((level(w) for w in graph.get(v, ())), default=-1)
        return memo[v]

    for v in graph:
        level(v)
    return memo


def check(graph, why, what):
    circles = [c for c in sccs(graph) if len(c) > 1]
    for c in circles:
        print(f"check-passes-layers: {what}: circle of files: {' <-> '.join(c)}")
        for f in c:
            for g in sorted(graph[f]):
                if g in c:
                    print(f"    {f} -> {g}: {', '.join(sorted(why[(f, g)]))}")
    if circles:
        return False
    by = collections.defaultdict(list)
    for f, k in layers(graph).items():
        by[k].append(f)
    print(f"{what}: no circle; layers, bottom up:")
    for k in sorted(by):
        print(f"  {k}: {' '.join(sorted(by[k]))}")
    return True


def call_graph(objs):
    defs, uses = {}, collections.defaultdict(set)
    for o in objs:
        f = os.path.basename(o).split(".")[0]
        r = subprocess.run(["nm", o], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"check-passes-layers: nm {o} failed: {r.stderr.strip()}")
        for line in r.stdout.splitlines():
            p = line.split()
            if len(p) == 3 and p[1] in "TDRBC":
                defs[p[2]] = f
            elif len(p) == 2 and p[0] == "U":
                uses[f].add(p[1])
        uses.setdefault(f, set())
    graph, why = {f: set() for f in uses}, collections.defaultdict(set)
    for f, us in uses.items():
        for s in us:
            g = defs.get(s)
            if g and g != f:
                graph[f].add(g)
                why[(f, g)].add(s)
    return graph, why


def include_graph(d):
    graph, why = {}, collections.defaultdict(set)
    for h in sorted(os.listdir(d)):
        if not h.endswith(".h"):
            continue
        graph.setdefault(h, set())
        with open(os.path.join(d, h)) as fh:
            for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', fh.read(), re.M):
                inc = os.path.basename(m.group(1))
                if os.path.exists(os.path.join(d, inc)):
                    graph[h].add(inc)
                    why[(h, inc)].add("#include")
    return graph, why


def self_test():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    why = collections.defaultdict(set, {("a", "b"): {"f"}, ("b", "c"): {"g"}, ("c", "a"): {"h"}})
    if check(g, why, "self-test (a circle a -> b -> c -> a)"):
        print("check-passes-layers: self-test: the circle was NOT found")
        return 1
    if not check({"a": {"b"}, "b": set()}, why, "self-test (no circle)"):
        return 1
    print("check-passes-layers: self-test passed")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    headers = None
    objs = []
    it = iter(argv)
    for a in it:
        if a == "--headers":
            headers = next(it, None)
        else:
            objs += [o for o in a.split(";") if o.endswith(".o")]  # ctest passes a ;-list
    if not objs:
        print("check-passes-layers: no object files given")
        return 1
    ok = check(*call_graph(objs), f"passes/ call graph ({len(objs)} objects)")
    if headers:
        ok = check(*include_graph(headers), "passes/ headers") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
