#!/usr/bin/env python3
"""gen_npy.py — writes the tiny .npy files that tests/io/test_npy.c reads, with NumPy itself.

The values are simple closed forms that the C test recomputes, so no expectations file is
needed. Run from anywhere (needs numpy; the outputs are committed):

    /usr/bin/python3 tests/io/data/gen_npy.py
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, a, version=None):
    path = os.path.join(HERE, name)
    if version is None:
        np.save(path, a, allow_pickle=(a.dtype == object))
    else:
        with open(path, "wb") as f:
            np.lib.format.write_array(f, a, version=version)


def main():
    save("np_i8_2x3.npy", np.array([[0, 1, 2], [3, 4, -100]], dtype="<i8"))
    save("np_i4_6.npy", np.arange(6, dtype="<i4") * -7)
    save("np_u1_4.npy", np.array([0, 1, 200, 255], dtype="|u1"))
    save("np_u2_3.npy", np.array([0, 65535, 7], dtype="<u2"))
    save("np_u4_3.npy", np.array([0, 4294967295, 7], dtype="<u4"))
    save("np_b1_3.npy", np.array([True, False, True]))
    save("np_f2_3.npy", np.array([1.5, -2.0, 65504.0], dtype="<f2"))
    save("np_f4_2x2x2.npy", (np.arange(8, dtype="<f4") * 0.25 - 1.0).reshape(2, 2, 2))
    save("np_f8_scalar.npy", np.array(3.5, dtype="<f8"))
    save("np_f4_empty.npy", np.zeros((0, 3), dtype="<f4"))
    save("np_f8_be.npy", np.array([1.0, -0.5, 1e300], dtype=">f8"))
    save("np_i4_be.npy", np.array([[1, -2], [300000, -400000]], dtype=">i4"))
    save("np_i8_big.npy", np.array([[1, 2], [3, 2**40]], dtype="<i8"))
    save("np_f4_v2.npy", np.arange(5, dtype="<f4"), version=(2, 0))
    save("np_f4_v3.npy", np.arange(5, dtype="<f4"), version=(3, 0))
    save("np_f4_fortran.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
    save("np_obj.npy", np.array([1, "a", None], dtype=object))
    save("np_c8.npy", np.array([1 + 2j], dtype="<c8"))


if __name__ == "__main__":
    main()
