"""What both commands share: the one-line error convention and atomic output files.

Errors are `PROG: error: MESSAGE` on stderr and exit status 1, one line (a message with newlines
is folded). An output is written beside its final path under a temporary name and renamed over
it once complete, so a failed run never leaves a partial file where the output should be.
"""
import os
import sys
import tempfile


class Fail(Exception):
    """A user-facing error: main() prints it as one line and exits 1."""


def die(prog, msg):
    line = " ".join(str(msg).split())
    sys.stderr.write("%s: error: %s\n" % (prog, line))
    sys.exit(1)


def temp_beside(path):
    """A fresh temporary file name in path's folder (same file system, so rename is atomic).
    Returns the name; the file exists, empty."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise Fail("the output folder '%s' does not exist" % d)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    return tmp


def check_output_path(path, inputs=()):
    """Refuses an output that is a directory or one of the run's inputs."""
    if os.path.isdir(path):
        raise Fail("-o %s is a directory" % path)
    if os.path.exists(path):
        for p in inputs:
            if os.path.exists(p) and os.path.samefile(p, path):
                raise Fail("-o %s is one of the inputs" % path)


def commit(tmp, path):
    """Makes the finished temporary the output: fsync, then rename over path."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644 & ~_umask())
    os.replace(tmp, path)


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def discard(tmp):
    if tmp and os.path.exists(tmp):
        os.remove(tmp)
