"""The OpenBLAS kernel choice shared by the CPU benchmarks (bench_train.py, bench_stream.py).

Debian's OpenBLAS 0.3.21 does not recognise some virtual CPUs and falls back to its SSE3
("Prescott") kernels at a third of the speed. Both sides (sbpc and PyTorch) link OpenBLAS, so a
benchmark names the kernel for both when the CPU has AVX2 and the caller did not choose. Child
processes inherit the environment; importing this module is enough.
"""
import os

if "OPENBLAS_CORETYPE" not in os.environ:
    try:
        with open("/proc/cpuinfo") as _f:
            if " avx2" in _f.read():
                os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    except OSError:
        pass
