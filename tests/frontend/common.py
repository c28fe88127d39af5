"""Helpers of the tests/frontend checks: running the tools, expecting failures, reading the
dataset file, and the visible skip (exit 77) where torch or transformers is missing.

The tools run from the source tree (python/ on PYTHONPATH), so the tests check this checkout's
package, not a copy installed earlier.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures", "frontend")
DATA = os.path.join(FIX, "data")
SKIP = 77


def need(*mods):
    for m in mods:
        try:
            __import__(m)
        except ImportError:
            print("SKIP: python module '%s' is not installed in %s (scripts/install-venv.sh makes "
                  ".venv-hf with it, taken by the next cmake configure)" % (m, sys.executable))
            sys.exit(SKIP)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def tool(name, *args):
    """Runs sbp-prepare / sbp-export as `python -m`; returns (rc, stdout, stderr)."""
    mod = {"sbp-prepare": "sbp_tools.prepare", "sbp-export": "sbp_tools.export"}[name]
    p = subprocess.run([sys.executable, "-m", mod] + [str(a) for a in args], env=env(),
                       capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def run(cmd):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


class Checks:
    """Counts failed checks; each failure is printed with what was expected."""

    def __init__(self):
        self.failed = 0
        self.passed = 0

    def ok(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL: %s" % what, flush=True)
        return cond

    def done(self):
        print("%d checks passed, %d failed" % (self.passed, self.failed))
        sys.exit(1 if self.failed else 0)


def error_lines(stderr):
    return [l for l in stderr.splitlines() if "error:" in l]


def load_dataset(path):
    from safetensors import safe_open
    with safe_open(path, "np") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    return t, meta


def examples(t):
    o = t["offsets"]
    return [(t["input_ids"][o[i]:o[i + 1]].tolist(), t["labels"][o[i]:o[i + 1]].tolist())
            for i in range(len(o) - 1)]


def shift(ids, scored):
    """The doc's shifted labels from per-token scored flags."""
    return [ids[t + 1] if scored[t + 1] else -100 for t in range(len(ids) - 1)] + [-100]
