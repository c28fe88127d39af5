#!/usr/bin/env python3
"""run-doc-recipes.py — every command block of the docs, run as written, so a recipe that stops
working fails a test instead of a reader.

The convention, for README.md and docs/*.md:

  - a fenced block opened with ```sh (or ```bash) is a recipe: this script runs it verbatim;
  - ```text, ```console, other fences and indented blocks are shown, never run (output, formats,
    sketches);
  - an HTML comment on the line before a ```sh block changes that one block:
      <!-- recipe: skip REASON -->   not run: listed with REASON by --not-run, a ctest skip
                                      (a block that builds the project, needs a GPU, the network
                                      or a large model);
    and one right after its closing fence adds a check the block's comments promise:
      <!-- recipe: check COMMAND --> COMMAND runs after the block in the same shell and must
                                      exit 0 (e.g. the loss fell, a file exists).

A page's recipes run in order, in one bash (set -eo pipefail), in a fresh scratch folder that
holds what a reader of the page has (the "small case" the tests already use):

  build -> BUILD (the tree under test), .venv-hf -> the Python environment, examples/ and
  scripts/ -> the checkout's; train.jsonl, dpo.jsonl, grpo.jsonl (copies of
  tests/fixtures/frontend/data: TRL's SFT messages, DPO pairs, GRPO rollouts); and
  MODEL_DIR, a transformers model folder: a small Qwen3 (2 layers, d=32, 256 positions, random
  weights, saved with save_pretrained) with tests/fixtures/frontend/tok_chatml's tokenizer.

For docs/*.md, build/tools and the environment's bin are on PATH (the pages say "with the tools
on PATH"); README.md gets neither, since its own recipe puts them there. OMP_NUM_THREADS=1 and
mpirun's root and oversubscribe switches are set (a shared 2-core machine, a container).

  scripts/run-doc-recipes.py --build BUILD --work DIR [--python PY] PAGE...
        run the pages' recipes (PAGE relative to the checkout, e.g. docs/lora.md); exit 0 when
        every one ran and its checks passed, 1 otherwise (the failing block's file:line, its
        output), 77 when a page needs the Python environment and there is none (a ctest skip)
  scripts/run-doc-recipes.py --not-run
        print every block marked skip, with its reason; exit 77 when there is any (a ctest skip,
        so that a recipe not run is visible and never counted as passed), else 0
  scripts/run-doc-recipes.py --work DIR [--python PY] --make-model
        make DIR/model alone (ctest's fixture docs.recipes.model, which the pages' tests share;
        77 without the Python environment)
  scripts/run-doc-recipes.py --list
        the pages with recipes, one a line (tests/CMakeLists.txt makes a test of each)

Standard library only (the model folder is made by PY, the environment's python).
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE_OPEN = re.compile(r"^```(\w*)\s*$")
SKIP = re.compile(r"^<!--\s*recipe:\s*skip\s+(.*?)\s*-->\s*$")
CHECK = re.compile(r"^<!--\s*recipe:\s*check\s+(.*?)\s*-->\s*$")
RUN_LANGS = ("sh", "bash")
DATA = {"train.jsonl": "sft_messages.jsonl", "dpo.jsonl": "dpo.jsonl", "grpo.jsonl": "grpo.jsonl"}
NEEDS_PYTHON = re.compile(r"MODEL_DIR|sbp-export|sbp-prepare|\.venv-hf")


def pages(root):
    return ["README.md"] + sorted(os.path.relpath(p, root)
                                  for p in glob.glob(os.path.join(root, "docs", "*.md")))


def blocks(path):
    """The page's ```sh blocks: dicts of line (1-based, the fence's), text, skip, checks."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in RUN_LANGS:
            prev = lines[i - 1] if i > 0 else ""
            skip = SKIP.match(prev)
            checks, k = [], j + 1
            while k < len(lines) and CHECK.match(lines[k]):
                checks.append(CHECK.match(lines[k]).group(1))
                k += 1
            out.append({"line": i + 1, "text": "\n".join(lines[i + 1:j]),
                        "skip": skip.group(1) if skip else None, "checks": checks})
        i = j + 1
    return out


def make_model(py, work):
    """The model folder every page shares, made once per work folder."""
    model = os.path.join(work, "model")
    if not os.path.isfile(os.path.join(model, "config.json")):
        subprocess.run([py, os.path.join(ROOT, "scripts", "make-example-model.py"),
                        os.path.join(ROOT, "tests", "fixtures", "frontend", "tok_chatml"), model],
                       check=True, stdout=subprocess.DEVNULL)
    return model


def run_page(page, args, venv):
    recipes = [b for b in blocks(os.path.join(ROOT, page)) if not b["skip"]]
    if not recipes:
        print(f"{page}: no recipe to run")
        return 0
    needs_py = any(NEEDS_PYTHON.search(b["text"]) for b in recipes)
    if needs_py and venv is None:
        print(f"SKIPPED: {page}'s recipes need the Python environment (sbp-export, "
              f"sbp-prepare, transformers) and {args.python} is not one: "
              f"scripts/install-venv.sh makes it")
        return 77
    scratch = os.path.join(args.work, os.path.splitext(page.replace("/", "_"))[0])
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    os.symlink(os.path.abspath(args.build), os.path.join(scratch, "build"))
    for name in ("examples", "scripts"):
        os.symlink(os.path.join(ROOT, name), os.path.join(scratch, name))
    for name, src in DATA.items():
        shutil.copy(os.path.join(ROOT, "tests", "fixtures", "frontend", "data", src),
                    os.path.join(scratch, name))
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    env.pop("VIRTUAL_ENV", None)
    if venv:
        os.symlink(venv, os.path.join(scratch, ".venv-hf"))
        env["MODEL_DIR"] = make_model(os.path.join(venv, "bin", "python"), args.work)
    if page != "README.md":
        extra = [os.path.join(os.path.abspath(args.build), "tools")]
        if venv:
            extra.append(os.path.join(venv, "bin"))
        env["PATH"] = os.pathsep.join(extra + [env.get("PATH", "")])
    script = ["set -eo pipefail"]
    for b in recipes:
        where = f"{page}:{b['line']}"
        script.append(f"printf '\\n=== %s\\n' {sh_quote(where)}")
        script.append(f"echo {sh_quote(where)} > .recipe-at; SECONDS=0")
        script.append(b["text"])
        for c in b["checks"]:
            script.append(f"echo {sh_quote(where + ': check: ' + c)} > .recipe-at")
            script.append(f"{c} || {{ echo 'check failed: {c.replace(chr(39), '')}'; exit 1; }}")
        script.append(f"echo \"=== {where}: ok ($SECONDS s)\"; rm -f .recipe-at")
    with open(os.path.join(scratch, ".recipes.sh"), "w") as f:
        f.write("\n".join(script) + "\n")
    t0 = time.time()
    p = subprocess.run(["bash", ".recipes.sh"], cwd=scratch, env=env, stdin=subprocess.DEVNULL)
    at = os.path.join(scratch, ".recipe-at")
    if p.returncode != 0:
        failed = open(at).read().strip() if os.path.exists(at) else page
        print(f"FAILED: {failed} (exit {p.returncode}); the scratch folder: {scratch}")
        return 1
    print(f"{page}: {len(recipes)} recipe(s) ran in {time.time() - t0:.0f} s")
    return 0


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def find_venv(py):
    """The environment PY belongs to when it has what the recipes use, else None."""
    if not py:
        return None
    venv = os.path.dirname(os.path.dirname(os.path.abspath(py)))
    need = [os.path.join(venv, "bin", n) for n in ("activate", "sbp-export", "sbp-prepare")]
    if not all(os.path.exists(n) for n in need):
        return None
    ok = subprocess.run([py, "-c", "import torch, transformers, sbp_tools"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
    return venv if ok else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build")
    ap.add_argument("--work")
    ap.add_argument("--python", default=os.path.join(ROOT, ".venv-hf", "bin", "python"))
    ap.add_argument("--not-run", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--make-model", action="store_true")
    ap.add_argument("pages", nargs="*")
    args = ap.parse_args()
    if args.list:
        for page in pages(ROOT):
            if any(not b["skip"] for b in blocks(os.path.join(ROOT, page))):
                print(page)
        return 0
    if args.not_run:
        n = 0
        for page in pages(ROOT):
            for b in blocks(os.path.join(ROOT, page)):
                if b["skip"]:
                    print(f"not run: {page}:{b['line']}: {b['skip']}")
                    n += 1
        if n:
            print(f"SKIPPED: {n} recipe block(s) not run, each for the reason above")
            return 77
        return 0
    if args.make_model:
        venv = find_venv(args.python)
        if venv is None:
            print(f"SKIPPED: {args.python} is not the Python environment (torch, transformers, "
                  f"sbp_tools): scripts/install-venv.sh makes it")
            return 77
        print("model folder:", make_model(os.path.join(venv, "bin", "python"), args.work))
        return 0
    if not args.build or not args.work or not args.pages:
        ap.error("give --build, --work and the pages (or --not-run, --list)")
    venv = find_venv(args.python)
    os.makedirs(args.work, exist_ok=True)
    rcs = [run_page(page, args, venv) for page in args.pages]
    return 1 if 1 in rcs else 77 if 77 in rcs else 0


if __name__ == "__main__":
    sys.exit(main())
