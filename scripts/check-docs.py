#!/usr/bin/env python3
"""check-docs.py — the README stays a front page and the documentation stays whole.

The README is what a newcomer reads first, so it is kept short and everything else lives in
docs/ pages; pages get moved and renamed, so their links are checked here rather than found
dead by a reader. Checks, over README.md, docs/*.md and python/README.md:

  - README.md has at most 150 lines;
  - every relative Markdown link [text](path) names a file or folder that exists (the #anchor
    is dropped; http(s), mailto and in-page #links are not checked);
  - each pair of markers around a generated table (<!-- hf-table --> ... <!-- /hf-table -->,
    which tests/fixtures/hf/table.py --write rewrites, and the benches' tables pasted between
    <!-- dist-bench -->, <!-- offload-bench -->, <!-- seqpar-bench --> and
    <!-- ref-logps-bench --> pairs) is there exactly once, in README.md or docs/, so that the
    next run of the script or bench finds where its figures go;
  - README.md and docs/ never cite a tracker item as "issue" plus a number.

Prints FILE:LINE: message for each failure and exits 1; exits 0 with a one-line summary.

  scripts/check-docs.py [ROOT]       (ctest: docs.front_page; ROOT defaults to the checkout)
  scripts/check-docs.py --selftest   (ctest: docs.front_page_selftest: a bad tree must fail)

Standard library only.
"""
import glob
import os
import re
import sys
import tempfile

MAX_README_LINES = 150
MARKERS = ("hf-table", "dist-bench", "offload-bench", "seqpar-bench", "ref-logps-bench")
# [text](target): the target up to the first space or ")"; an image ![alt](target) too
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
ISSUE = re.compile(r"\bissue\s[0-9]", re.I)


def pages(root):
    """The files checked, as paths relative to root, those that exist."""
    names = ["README.md"] + sorted(os.path.relpath(p, root)
                                   for p in glob.glob(os.path.join(root, "docs", "*.md")))
    names.append(os.path.join("python", "README.md"))
    return [n for n in names if os.path.isfile(os.path.join(root, n))]


def prose(lines):
    """Each line with code taken out (fenced and indented blocks, inline spans): code shows
    text, it links nothing."""
    out, fence = [], False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
            out.append("")
        elif fence or line.startswith("    "):
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", "", line))
    return out


def check_links(root, name, lines, errors):
    text = prose(lines) + [""]
    for n, line in enumerate(text[:-1], 1):
        # a link's text may wrap onto the next line: match over both, keep those starting here
        both = line + " " + text[n]
        for m in LINK.finditer(both):
            if m.start() >= len(line):
                continue
            target = m.group(1)
            if re.match(r"^(https?:|mailto:|#)", target):
                continue
            path = target.split("#", 1)[0]
            full = os.path.normpath(os.path.join(root, os.path.dirname(name), path))
            if not os.path.exists(full):
                errors.append(f"{name}:{n}: dead link to {target}")


def check(root):
    """The list of failures under root, each 'FILE:LINE: message'."""
    errors, count = [], {}
    names = pages(root)
    if "README.md" not in names:
        return ["README.md:0: missing"], 0
    for name in names:
        with open(os.path.join(root, name), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if name == "README.md" and len(lines) > MAX_README_LINES:
            errors.append(f"README.md:{len(lines)}: {len(lines)} lines, more than "
                          f"{MAX_README_LINES}: move the detail to a docs/ page")
        check_links(root, name, lines, errors)
        in_docs = name == "README.md" or name.startswith("docs" + os.sep)
        for n, line in enumerate(lines, 1):
            if in_docs and ISSUE.search(line):
                errors.append(f"{name}:{n}: cites an issue number: {line.strip()[:80]}")
            for mk in MARKERS:
                for tag in (f"<!-- {mk} -->", f"<!-- /{mk} -->"):
                    if tag in line:
                        count.setdefault(tag, []).append(f"{name}:{n}")
    for mk in MARKERS:
        for tag in (f"<!-- {mk} -->", f"<!-- /{mk} -->"):
            where = count.get(tag, [])
            if len(where) != 1:
                at = where[1] if len(where) > 1 else "docs/"
                errors.append(f"{at}: the marker {tag} is there {len(where)} times, not once"
                              + (f" ({', '.join(where)})" if where else ""))
    return errors, len(names)


def selftest():
    """A tree with a long README, a dead link, a lost marker and an issue number must fail with
    each of them named; the same tree repaired must pass."""
    with tempfile.TemporaryDirectory(prefix="check-docs.") as root:
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# x\n\nSee [the page](docs/page.md) and [a page\nthat is gone](docs/gone.md#part).\n")
            f.write("Fixed in %s %d.\n" % ("issue", 12))  # built, so that a grep finds none here
            f.write("\n" * MAX_README_LINES)
        with open(os.path.join(root, "docs", "page.md"), "w") as f:
            f.write("[home](../README.md) `[code](nowhere.md)`\n\n    [block](nowhere.md)\n")
            f.write("<!-- hf-table -->\n<!-- /hf-table -->\n<!-- dist-bench -->\n")
            for mk in MARKERS[2:]:
                f.write("<!-- %s -->\n<!-- /%s -->\n" % (mk, mk))
        errors, _ = check(root)
        want = ["more than 150", "dead link to docs/gone.md#part", "issue number",
                "<!-- /dist-bench --> is there 0 times"]
        missed = [w for w in want if not any(w in e for e in errors)]
        extra = [e for e in errors if not any(w in e for w in want)]
        if missed or extra:
            print("check-docs selftest: FAILED: missed %s, unexpected %s" % (missed, extra))
            return 1
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("# x\n\nSee [the page](docs/page.md#top) and [web](https://example.org).\n")
        with open(os.path.join(root, "docs", "page.md"), "a") as f:
            f.write("<!-- /dist-bench -->\n")
        errors, _ = check(root)
        if errors:
            print("check-docs selftest: FAILED: a good tree fails: %s" % errors)
            return 1
    print("check-docs selftest: ok (a bad tree fails with its %d faults named, a good one passes)"
          % len(want))
    return 0


def main(argv):
    if argv[1:] in (["--selftest"], ["--self-test"]):
        return selftest()
    if len(argv) > 2 or (len(argv) == 2 and argv[1].startswith("-")):
        print("usage: check-docs.py [ROOT] | --selftest", file=sys.stderr)
        return 2
    root = argv[1] if len(argv) == 2 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errors, n = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check-docs: {len(errors)} problem(s)")
        return 1
    with open(os.path.join(root, "README.md"), encoding="utf-8") as f:
        readme = len(f.read().splitlines())
    print(f"check-docs: ok: README.md {readme} lines (at most {MAX_README_LINES}), {n} pages, "
          f"every relative link alive, {2 * len(MARKERS)} markers once each")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
