#!/usr/bin/env python3
"""check-trainer-size.py — the trainer stays a library with a thin command line: no function in
train/*.c is longer than 80 lines, and tools/sbp_train.c (the CLI) is under 500 lines.

A function is what lies between a "{" and a "}" that open and close a line at column 0 (the
project's style puts a function's braces there and nothing else); its length is the lines
between them. Prints each offender and exits 1; exit 0 when all are within bounds.

  scripts/check-trainer-size.py ROOT          (ctest: layout.trainer_size)
  scripts/check-trainer-size.py --self-test   (the checker finds a long function)
"""
import glob
import os
import sys
import tempfile

MAX_FUNCTION, MAX_CLI = 80, 500


def long_functions(path, limit=MAX_FUNCTION):
    out, start, name, prev = [], None, None, ""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("{"):
                start, name = n, prev.strip()
            elif line.startswith("}") and start is not None:
                if n - start > limit:
                    out.append((n - start, name))
                start = None
            prev = line
    return out


def check(root):
    bad = 0
    for path in sorted(glob.glob(os.path.join(root, "train", "*.c"))):
        for length, name in long_functions(path):
            print(f"{os.path.relpath(path, root)}: {length} lines (over {MAX_FUNCTION}): {name}")
            bad += 1
    cli = os.path.join(root, "tools", "sbp_train.c")
    with open(cli, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    if lines >= MAX_CLI:
        print(f"tools/sbp_train.c: {lines} lines (the CLI stays under {MAX_CLI})")
        bad += 1
    if not glob.glob(os.path.join(root, "train", "*.c")):
        print("no train/*.c found under", root)
        bad += 1
    return 1 if bad else 0


def self_test():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "x.c")
        with open(p, "w") as f:
            f.write("int f(void)\n{\n" + "    ;\n" * 90 + "}\nint g(void)\n{\n    ;\n}\n")
        found = long_functions(p)
        if found != [(91, "int f(void)")]:
            print("self-test: expected f alone, found", found)
            return 1
    print("self-test: the long function is found, the short one is not")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1]))
