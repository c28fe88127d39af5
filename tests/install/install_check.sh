#!/usr/bin/env bash
# install_check.sh — `cmake --install` into a fresh prefix, then the example through the
# installed tools alone: sbpc -o step.so (which must say what it wrote and leave only the .so),
# sbp-shard, and three sbp-train steps whose loss lines must be there. The C compiler is a
# wrapper that logs its arguments, so the test sees that the step was compiled against the
# prefix's headers and runtime (PREFIX/include/sbpc, PREFIX/lib/sbpc/libsbprt.a), not the build
# tree's; the prefix is moved once before use, so nothing may depend on where it was installed.
#   install_check.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
fail() { echo "install_check: FAIL: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/first" >"$work/install.log"
mv "$work/first" "$work/prefix"
p=$work/prefix
for f in bin/sbpc bin/sbp-train bin/sbp-shard include/sbpc/sbp_step.h include/sbpc/sbprt.h \
         lib/sbpc/libsbprt.a; do
  [ -e "$p/$f" ] || fail "cmake --install did not install $f"
done
real_cc=$(command -v clang || command -v cc)
cat >"$work/cc" <<WRAP
#!/bin/sh
printf '%s\n' "\$@" >>"$work/cc.args"
exec "$real_cc" "\$@"
WRAP
chmod +x "$work/cc"
cd "$work"
CC="$work/cc" "$p/bin/sbpc" "$src/examples/tiny_llama.onnx" --batch 2 --seq-len 32 \
  -o step.so 2>sbpc.err || fail "the installed sbpc failed: $(cat sbpc.err)"
grep -q "^sbpc: wrote step.so: " sbpc.err || fail "sbpc did not say what it wrote: $(cat sbpc.err)"
leftover=$(ls -A | grep '^step' | grep -v '^step\.so$' || true)
[ -z "$leftover" ] || fail "sbpc -o step.so left $leftover beside it"
grep -qx -- "-I$p/bin/../include/sbpc" cc.args || fail "the step was not compiled against $p/include/sbpc: $(tr '\n' ' ' <cc.args)"
grep -qx -- "$p/bin/../lib/sbpc/libsbprt.a" cc.args || fail "the step was not linked against $p/lib/sbpc/libsbprt.a: $(tr '\n' ' ' <cc.args)"
# the build tree's headers and archive (WORK_DIR may itself lie in the build folder)
for tree in "-I$src/codegen" "-I$src/runtime" "$build/runtime/libsbprt.a"; do
  if grep -qx -- "$tree" cc.args; then fail "the installed sbpc still reads the build tree: $tree"; fi
done
CC="$work/cc" "$p/bin/sbpc" "$src/examples/tiny_llama.onnx" --batch 2 --seq-len 32 \
  -o kept.so --keep-c 2>/dev/null || fail "sbpc --keep-c failed"
for f in kept.so kept.c kept.h; do [ -f "$f" ] || fail "--keep-c did not keep $f"; done
"$p/bin/sbp-shard" /usr/share/common-licenses/GPL-3 -o gpl3.bin >/dev/null
"$p/bin/sbp-train" step.so --model "$src/examples/tiny_llama.onnx" --data gpl3.bin --steps 3 \
  --lr 3e-3 >train.log 2>&1 || fail "the installed sbp-train failed: $(tail -3 train.log)"
[ "$(grep -c '^step [0-9]* loss ' train.log)" = 3 ] || fail "expected 3 loss lines: $(cat train.log)"
echo "install_check: the installed sbpc, sbp-shard and sbp-train ran from a moved prefix"
