#!/usr/bin/env python3
"""check-passes-layers.py — passes/ is layered: no circle of files (no two files call each other,
directly or through others), and its folders in order: graph/ (graph -> graph rewrites) below
train/ (the training program) below the top (pipeline.c, the flow).

The call graph is read from the compiled objects of the sbppasses library (nm: the symbols each
object defines and the ones it needs), so it is the real one, macros and function-pointer tables
included. Each object's source file (graph/fold, train/autodiff, pipeline) is a node; an edge
f -> g means f uses a symbol g defines. Any strongly connected component of more than one file
is a circle: it is printed with the symbols that close it. An edge from a folder to one above it
(graph/ -> train/, anything -> pipeline) breaks the folder order: printed the same way. Either
makes the exit status 1. Otherwise the files are printed by layer (layer 0 calls nothing else in
passes/; layer k calls only layers below k).

With --headers DIR (passes/) the quoted #includes of DIR's files, its folders included, are
checked the same way: no circle among the headers, and no file (.c or .h) that includes a
header of a folder above its own.

  scripts/check-passes-layers.py OBJ... [--headers passes/]     (ctest: passes_layers)
  scripts/check-passes-layers.py OBJ... --name ir/              (ctest: ir.layers: the same
                                                                  check on another folder's
                                                                  objects; ir/ has no folders)
  scripts/check-passes-layers.py --self-test                     (the checker finds a circle
                                                                  and a folder-order break)
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


# The folders of passes/, bottom up; a file outside them (pipeline.c, flow.h) is the top.
FOLDERS = ["graph", "train"]


def rank(f):
    """The folder order of file f ("graph/fold", "train/memplan.h", "pipeline")."""
    top = f.split("/")[0] if "/" in f else None
    return FOLDERS.index(top) if top in FOLDERS else len(FOLDERS)


def folder(f):
    return f.split("/")[0] + "/" if rank(f) < len(FOLDERS) else "the top (passes/)"


def check(graph, why, what):
    ok = True
    for c in [c for c in sccs(graph) if len(c) > 1]:
        print(f"check-passes-layers: {what}: circle of files: {' <-> '.join(c)}")
        for f in c:
            for g in sorted(graph[f]):
                if g in c:
                    print(f"    {f} -> {g}: {', '.join(sorted(why[(f, g)]))}")
        ok = False
    for f in sorted(graph):
        for g in sorted(graph[f]):
            if rank(g) > rank(f):
                print(f"check-passes-layers: {what}: {f} (in {folder(f)}) uses {g}, which is in "
                      f"{folder(g)}, above it: {', '.join(sorted(why[(f, g)]))}")
                ok = False
    if not ok:
        return False
    by = collections.defaultdict(list)
    for f, k in layers(graph).items():
        by[k].append(f)
    print(f"{what}: no circle, folders in order; layers, bottom up:")
    for k in sorted(by):
        print(f"  {k}: {' '.join(sorted(by[k]))}")
    return True


def source_of(obj):
    """The source file an object was compiled from, relative to passes/ and without its
    extension: CMake writes passes/graph/fold.c to .../sbppasses.dir/graph/fold.c.o."""
    o = obj.replace(os.sep, "/")
    m = re.search(r"\.dir/(.+?)(\.c)?\.o(bj)?$", o)
    return m.group(1) if m else os.path.basename(o).split(".")[0]


def call_graph(objs):
    defs, uses = {}, collections.defaultdict(set)
    for o in objs:
        f = source_of(o)
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
    """The quoted #includes among the files under d (relative names: graph/passes.h). The
    include path is flat (passes/, graph/, train/ are all on it), so an include names a header
    by its file name; one that is not under d (ir.h) is not an edge. Sources (.c) only include:
    they are checked for the folder order, and cannot close a circle."""
    files = []
    for root, _, names in os.walk(d):
        for n in names:
            if n.endswith((".h", ".c", ".def")):
                files.append(os.path.relpath(os.path.join(root, n), d).replace(os.sep, "/"))
    by_name = {}
    for f in files:
        if not f.endswith(".c"):
            by_name[os.path.basename(f)] = f
    graph, why = {}, collections.defaultdict(set)
    for f in sorted(files):
        graph.setdefault(f, set())
        with open(os.path.join(d, f)) as fh:
            for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', fh.read(), re.M):
                inc = by_name.get(os.path.basename(m.group(1)))
                if inc and inc != f:
                    graph[f].add(inc)
                    why[(f, inc)].add("#include")
    return graph, why


def self_test():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    why = collections.defaultdict(set, {("a", "b"): {"f"}, ("b", "c"): {"g"}, ("c", "a"): {"h"}})
    if check(g, why, "self-test (a circle a -> b -> c -> a)"):
        print("check-passes-layers: self-test: the circle was NOT found")
        return 1
    if not check({"a": {"b"}, "b": set()}, why, "self-test (no circle)"):
        return 1
    up = {"graph/fold": {"train/autodiff"}, "train/autodiff": set()}
    if check(up, collections.defaultdict(set, {("graph/fold", "train/autodiff"): {"s"}}),
             "self-test (graph/ uses train/)"):
        print("check-passes-layers: self-test: graph/ -> train/ was NOT found")
        return 1
    if check({"train/plan": {"pipeline"}, "pipeline": set()}, collections.defaultdict(set),
             "self-test (train/ uses the top)"):
        print("check-passes-layers: self-test: train/ -> pipeline was NOT found")
        return 1
    down = {"pipeline": {"train/plan", "graph/fold"}, "train/plan": {"graph/fold"},
            "graph/fold": set()}
    if not check(down, collections.defaultdict(set), "self-test (folders in order)"):
        return 1
    print("check-passes-layers: self-test passed")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    headers, name = None, "passes/"
    objs = []
    it = iter(argv)
    for a in it:
        if a == "--headers":
            headers = next(it, None)
        elif a == "--name":
            name = next(it, name)
        else:
            objs += [o for o in a.split(";") if o.endswith(".o")]  # ctest passes a ;-list
    if not objs:
        print("check-passes-layers: no object files given")
        return 1
    ok = check(*call_graph(objs), f"{name} call graph ({len(objs)} objects)")
    if headers:
        ok = check(*include_graph(headers), f"{name} #includes") and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
