"""toolrun.py — subprocess.run for the Python cross-checks' tool calls, with LeakSanitizer's
tracer crash told apart from a failure.

Under AddressSanitizer (the CI's second build) LeakSanitizer stops the process's threads at exit
to scan for leaks; its tracer sometimes dies of its own SIGSEGV ("Tracer caught signal 11" then
"LeakSanitizer has encountered a fatal error", google/sanitizers#1353), after the program has
finished and printed everything, and the process ends with status 134 or 1. That is not a leak
report (which says "detected memory leaks") and not the tool's failure, but a suite that runs a
few hundred sanitized processes meets it now and then. run() runs such a command once more,
saying so on stderr; every other outcome, a real leak report included, is returned as it came.
"""
import subprocess
import sys

TRACER_CRASH = ("Tracer caught signal", "LeakSanitizer has encountered a fatal error")


def tracer_crashed(p):
    text = "".join(s for s in (p.stdout, p.stderr) if isinstance(s, str))
    return (p.returncode != 0 and all(m in text for m in TRACER_CRASH)
            and "detected memory leaks" not in text)


def run(cmd, **kw):
    """subprocess.run(cmd, **kw) (text output, captured: the marker must be visible), once
    more if LeakSanitizer's tracer crashed at exit."""
    p = subprocess.run(cmd, **kw)
    if tracer_crashed(p):
        sys.stderr.write("note: LeakSanitizer's tracer crashed at the exit of %s (a sanitizer "
                         "fault, not a leak report); running it once more\n"
                         % " ".join(str(c) for c in cmd))
        p = subprocess.run(cmd, **kw)
    return p
