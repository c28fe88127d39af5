"""What both commands share: the one-line error convention and how outputs are written.

Errors are `PROG: error: MESSAGE` on stderr and exit status 1, one line (a message with newlines
is folded).

The output rule (python/README.md, "Outputs"): no tool writes over a file it did not make for
this purpose, and a refusal comes before the work. So, before anything is loaded or tokenised,
check_output refuses an output path that
  - is a folder, or lies in a folder that is missing or not a folder;
  - lies in a folder the run reads (a model or tokenizer folder): a new file there can change
    what the folder loads (a model.safetensors beside pytorch_model.bin), so none is made;
  - is one of the run's input files or of the files in a folder the run reads, compared with
    os.path.samefile (the same inode), which also catches a symbolic or hard link to one;
  - exists and is a symbolic link, not a regular file, or a file that `ours` does not recognise
    as one the tool itself wrote (each tool passes its own recogniser);
and reserve() then makes the temporary file beside it, which finds a read-only folder before the
work too. The output is written to that temporary and renamed over the path once complete
(commit), so a failed run leaves neither a partial file nor the temporary behind (discard).
"""
import argparse
import json
import os
import stat
import sys
import tempfile


class Fail(Exception):
    """A user-facing error: main() prints it as one line and exits 1."""


def die(prog, msg):
    line = " ".join(str(msg).split())
    sys.stderr.write("%s: error: %s\n" % (prog, line))
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors follow the convention too: one line, exit status 1 (argparse
    itself prints the usage and exits 2)."""

    def error(self, message):
        die(self.prog, "%s (see --help)" % message)


def first_line(e):
    """An exception as the one line an error message can hold."""
    s = str(e).strip()
    return "%s: %s" % (type(e).__name__, s.splitlines()[0] if s else "(no message)")


def _folder_files(folder):
    """The paths of the entries directly in folder (what from_pretrained reads: its top level)."""
    try:
        return [os.path.join(folder, n) for n in sorted(os.listdir(folder))]
    except OSError:
        return []


def _same(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, files=(), folders=(), ours=None, flag="-o"):
    """Refuses (Fail) an output path that the rule above forbids. files: the input files;
    folders: (what, folder) pairs for the folders the run reads, e.g. ("model folder", DIR);
    ours: (recognise(path) -> bool, what such a file is), for an existing file the tool made.
    An existing output that passes is replaced when the run succeeds."""
    if path.endswith(os.sep) or os.path.isdir(path):
        raise Fail("%s %s is a folder; give a file name" % (flag, path))
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise Fail("%s %s: the output folder '%s' does not exist" % (flag, path, parent))
    if not os.path.isdir(parent):
        raise Fail("%s %s: '%s' is not a folder" % (flag, path, parent))
    for what, folder in folders:
        if _same(parent, folder):
            raise Fail("%s %s is in the %s %s, which this run reads; write it elsewhere"
                       % (flag, path, what, folder))
    if not os.path.lexists(path):
        return
    for f in files:
        if _same(f, path):
            raise Fail("%s %s is the input %s; it is left as it is" % (flag, path, f))
    for what, folder in folders:
        for f in _folder_files(folder):
            if _same(f, path):
                raise Fail("%s %s is %s of the %s %s; it is left as it is"
                           % (flag, path, f, what, folder))
    if os.path.islink(path):
        raise Fail("%s %s exists and is a symbolic link, not a file this tool wrote; it is left "
                   "as it is" % (flag, path))
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise Fail("%s %s: %s" % (flag, path, e.strerror or e))
    if not stat.S_ISREG(mode):
        raise Fail("%s %s exists and is not a regular file; it is left as it is" % (flag, path))
    if ours is not None:
        fn, what = ours
        if not fn(path):
            raise Fail("%s %s exists and is not %s; it is left as it is (remove it or choose "
                       "another name)" % (flag, path, what))


def check_inputs(paths):
    """Every input file exists and can be opened for reading, checked before the work."""
    for p in paths:
        if os.path.isdir(p):
            raise Fail("cannot read %s: it is a folder" % p)
        try:
            with open(p, "rb"):
                pass
        except OSError as e:
            raise Fail("cannot read %s: %s" % (p, e.strerror or e))


def is_sbp_dataset(path):
    """Whether path is a safetensors file whose metadata says format sbp-dataset (what
    sbp-prepare writes). Only the header is read, and a header that claims more than 100 MB or
    more than the file holds is not one."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            h = f.read(8)
            if len(h) < 8:
                return False
            n = int.from_bytes(h, "little")
            if n > min(size - 8, 100 << 20):
                return False
            head = json.loads(f.read(n).decode("utf-8"))
        meta = head.get("__metadata__") if isinstance(head, dict) else None
        return isinstance(meta, dict) and meta.get("format") == "sbp-dataset"
    except (OSError, ValueError):
        return False


def _varint(f):
    x, shift = 0, 0
    while True:
        b = f.read(1)
        if not b or shift > 63:
            return None
        x |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            return x


def onnx_producer(path):
    """The `sbp.producer` metadata of an ONNX file, or None (not an ONNX file, or none). Walks
    the top-level protobuf fields and reads only metadata_props (field 14): the graph, which
    holds the weights, is skipped over, so a 2 GB model costs a few reads."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while f.tell() < size:
                tag = _varint(f)
                if tag is None:
                    return None
                field, wire = tag >> 3, tag & 7
                if wire == 0:
                    if _varint(f) is None:
                        return None
                elif wire in (1, 5):
                    f.seek(8 if wire == 1 else 4, 1)
                elif wire == 2:
                    n = _varint(f)
                    if n is None or f.tell() + n > size:
                        return None
                    if field != 14:
                        f.seek(n, 1)
                        continue
                    kv = _strings(f.read(n))
                    if kv is None:
                        return None
                    if kv.get(1) == "sbp.producer":
                        return kv.get(2)
                else:
                    return None
            return None
    except (OSError, UnicodeDecodeError):
        return None


def _strings(buf):
    """A StringStringEntryProto's fields {1: key, 2: value}, or None when malformed."""
    import io
    f, out = io.BytesIO(buf), {}
    while f.tell() < len(buf):
        tag = _varint(f)
        if tag is None or tag & 7 != 2:
            return None
        n = _varint(f)
        if n is None or f.tell() + n > len(buf):
            return None
        out[tag >> 3] = f.read(n).decode("utf-8")
    return out


def reserve(path, suffix=".tmp", folder=False):
    """Makes the temporary beside path (same file system, so the rename is atomic) now, before
    the work, so that a folder that cannot be written is found first. Returns its name; the
    file (or, folder=True, the folder) exists, empty."""
    d = os.path.dirname(os.path.abspath(path))
    prefix = "." + os.path.basename(path) + "."
    try:
        if folder:
            return tempfile.mkdtemp(dir=d, prefix=prefix, suffix=suffix)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=prefix, suffix=suffix)
    except OSError as e:
        raise Fail("cannot write in the output folder '%s': %s" % (d, e.strerror or e))
    os.close(fd)
    return tmp


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
    if tmp and os.path.lexists(tmp) and not os.path.isdir(tmp):
        os.remove(tmp)
