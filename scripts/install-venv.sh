#!/usr/bin/env bash
# install-venv.sh — makes .venv-hf, the pinned Python environment (tests/fixtures/hf/
# requirements.txt: torch, transformers, PEFT, onnxruntime) in which the cross-checks against
# PyTorch and PEFT run. CMake finds it when it configures (tests/export, tests/lora): without it
# those checks are ctest skips. Nothing at build or run time needs it; fixtures are regenerated
# with it.
#
#   scripts/install-venv.sh        (from the repository root; python3 -m venv must work: Debian's
#                                   python3-venv, which scripts/install-deps.sh installs)
#
# An existing .venv-hf that already holds exactly the pinned versions is kept, so a second run
# costs seconds; otherwise it is made anew. PyPI's torch wheel brings its CUDA libraries (about
# 6 GB in all); nothing here needs a GPU. Either way the venv gets this checkout's python/
# package (sbp-export, sbp-prepare: python/README.md), installed again so that it is current.
set -euo pipefail
cd "$(dirname "$0")/.."
req=tests/fixtures/hf/requirements.txt
venv=.venv-hf
# python/ (sbp_tools): reinstalled each run so the venv has this checkout's version; its
# dependencies are already pinned above (pip fetches a current setuptools to build it: the one
# a fresh venv of Python 3.11 holds cannot build a wheel)
install_sbp_tools() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --force-reinstall ./python
  rm -rf python/build python/*.egg-info
  echo "install-venv: sbp-export and sbp-prepare installed in $venv/bin"
}
want=$(grep -E '^[A-Za-z0-9_.-]+==' "$req" | tr 'A-Z_' 'a-z-' | sort)
if [ -x "$venv/bin/python" ]; then
  have=$("$venv/bin/python" -m pip freeze 2>/dev/null | tr 'A-Z_' 'a-z-' | sort || true)
  missing=$(comm -23 <(echo "$want") <(echo "$have"))
  if [ -z "$missing" ]; then
    echo "install-venv: $venv holds the pinned versions"
    install_sbp_tools
    exit 0
  fi
  echo "install-venv: $venv lacks $(echo "$missing" | tr '\n' ' '): making it anew"
  rm -rf "$venv"
fi
start=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
install_sbp_tools
"$venv/bin/python" -c 'import torch, transformers, peft, onnxruntime; print("install-venv: torch", torch.__version__, "transformers", transformers.__version__, "peft", peft.__version__)'
echo "install-venv: $venv made in $(( $(date +%s) - start )) s"
