#!/usr/bin/env python3
"""check-trainer-size.py — the trainer stays a library with a thin command line: no function in
train/*.c is longer than 80 lines, and tools/sbp_train.c (the CLI) is under 500 lines.

A function's body is what lies between a "{" and a "}" that open and close a line at column 0
(the project's style puts a function's braces there and nothing else); the function starts at
its signature, the last line at column 0 before the "{" (a signature's continuation lines are
indented), and its length counts every line from there to the "}", both included: what a
reader scrolls through. Prints each offender and exits 1; exit 0 when all are within bounds.

  scripts/check-trainer-size.py ROOT          (ctest: layout.trainer_size)
  scripts/check-trainer-size.py --self-test   (the checker finds a long function)
"""
import glob
import os
import sys
import tempfile

MAX_FUNCTION, MAX_CLI = 80, 500


def long_functions(path, limit=MAX_FUNCTION):
    out, start, name, head, head_n = [], None, None, "", 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.startswith("{"):
                start, name = head_n or n, head.strip()
            elif line.startswith("}") and start is not None:
                if n - start + 1 > limit:
                    out.append((n - start + 1, name))
                start = None
            elif start is None and line[:1].strip() and not line.startswith(("/*", "#", "}")):
                head, head_n = line, n  # a candidate signature's first line
            elif start is None and not line.strip():
                head, head_n = "", 0
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
            # f: 81 lines, its signature on two; g: 80 lines, at the limit; h: short
            f.write("/* f */\nint f(int a,\n      int b)\n{\n" + "    ;\n" * 77 + "}\n\n"
                    "int g(void)\n{\n" + "    ;\n" * 77 + "}\nint h(void)\n{\n    ;\n}\n")
        found = long_functions(p)
        if found != [(81, "int f(int a,")]:
            print("self-test: expected f alone (81 lines), found", found)
            return 1
    print("self-test: the long function is found (its signature counted), the others are not")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1]))
