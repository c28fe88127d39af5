/* test_npy.c — the .npy reader, writer and dtype conversion: round trips of every dtype, files
 * written by NumPy (tests/io/data, from gen_npy.py: versions 1.0/2.0/3.0, big-endian, scalar,
 * empty), malformed headers built byte by byte (truncation, bad dicts, shape overflow, short or
 * long data, unsupported dtypes), range-checked conversion, and — when python3 with numpy is
 * available — NumPy reading what the writer produced.
 */
#include "io_test.h"

#include <math.h>

static char err[512];

/* A .npy image with the given version and header text (padded as NumPy does) and data. */
static unsigned char *make_npy(int major, const char *dict, const void *data, size_t ndata,
                               size_t *len)
{
    size_t lenbytes = major == 1 ? 2 : 4, pre = 8 + lenbytes;
    size_t dl = strlen(dict);
    size_t hlen = dl + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    unsigned char *b = calloc(1, pre + hlen + ndata + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    for (size_t i = 0; i < lenbytes; i++)
        b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', hlen - dl - 1);
    b[pre + hlen - 1] = '\n';
    if (ndata)
        memcpy(b + pre + hlen, data, ndata);
    *len = pre + hlen + ndata;
    return b;
}

/* Parses a malformed image and checks the message mentions `want`. */
static void expect_bad(const unsigned char *b, size_t len, const char *want)
{
    sbpio_array a;
    err[0] = '\0';
    int rc = sbpio_npy_read_mem(b, len, "bad.npy", &a, err, sizeof err);
    if (rc != SBPIO_ERR)
        print_error("accepted an image that should fail with \"%s\"\n", want);
    assert_int_equal(rc, SBPIO_ERR);
    assert_null(a.data);
    IO_ASSERT_MSG(err, "bad.npy", want);
}

static void expect_bad_dict(const char *dict, size_t ndata, const char *want)
{
    size_t len;
    unsigned char zeros[64] = {0};
    assert_true(ndata <= sizeof zeros);
    unsigned char *b = make_npy(1, dict, zeros, ndata, &len);
    expect_bad(b, len, want);
    free(b);
}

/* ---------------------------------------------------------------- round trips */

static void roundtrip(sbpio_dtype t, int rank, const int64_t *shape, const void *data)
{
    const char *p = io_path("rt.npy");
    assert_int_equal(sbpio_npy_write(p, t, rank, shape, data, err, sizeof err), SBPIO_OK);
    size_t flen;
    unsigned char *raw = io_read_file(p, &flen);
    size_t hlen = raw[8] | (raw[9] << 8);
    assert_int_equal((10 + hlen) % 64, 0); /* NumPy's alignment */
    assert_int_equal(raw[10 + hlen - 1], '\n');
    free(raw);
    sbpio_array a;
    assert_int_equal(sbpio_npy_read(p, &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(a.dtype, t);
    assert_int_equal(a.rank, rank);
    int64_t numel = 1;
    for (int i = 0; i < rank; i++) {
        assert_int_equal(a.shape[i], shape[i]);
        numel *= shape[i];
    }
    assert_int_equal(a.numel, numel);
    assert_int_equal(a.nbytes, (size_t)numel * sbpio_dtype_size(t));
    if (numel)
        assert_memory_equal(a.data, data, a.nbytes);
    else
        assert_null(a.data);
    sbpio_array_free(&a);
    assert_int_equal(io_count_entries(".tmp."), 0);
}

static void test_roundtrip_all_dtypes(void **state)
{
    (void)state;
    int64_t s23[] = {2, 3};
    uint8_t b[6] = {1, 0, 1, 1, 0, 0}, u8[6] = {0, 1, 2, 128, 254, 255};
    int8_t i8[6] = {-128, -1, 0, 1, 2, 127};
    uint16_t u16[6] = {0, 1, 2, 40000, 65534, 65535};
    int16_t i16[6] = {-32768, -1, 0, 1, 2, 32767};
    uint32_t u32[6] = {0, 1, 2, 3000000000u, 7, UINT32_MAX};
    int32_t i32[6] = {INT32_MIN, -1, 0, 1, 2, INT32_MAX};
    uint64_t u64[6] = {0, 1, 2, 3, UINT64_MAX - 1, UINT64_MAX};
    int64_t i64[6] = {INT64_MIN, -1, 0, 1, -100, INT64_MAX};
    uint16_t f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00};
    float f32[6] = {0.f, -1.5f, 3.25f, 1e-30f, -1e30f, INFINITY};
    double f64[6] = {0., -1.5, 3.25, 1e-300, -1e300, 0.1};
    roundtrip(SBPIO_DT_BOOL, 2, s23, b);
    roundtrip(SBPIO_DT_U8, 2, s23, u8);
    roundtrip(SBPIO_DT_I8, 2, s23, i8);
    roundtrip(SBPIO_DT_U16, 2, s23, u16);
    roundtrip(SBPIO_DT_I16, 2, s23, i16);
    roundtrip(SBPIO_DT_U32, 2, s23, u32);
    roundtrip(SBPIO_DT_I32, 2, s23, i32);
    roundtrip(SBPIO_DT_U64, 2, s23, u64);
    roundtrip(SBPIO_DT_I64, 2, s23, i64);
    roundtrip(SBPIO_DT_F16, 2, s23, f16);
    roundtrip(SBPIO_DT_F32, 2, s23, f32);
    roundtrip(SBPIO_DT_F64, 2, s23, f64);
    int64_t s6[] = {6}, s1x6[] = {1, 6, 1, 1, 1, 1, 1, 1};
    roundtrip(SBPIO_DT_F32, 1, s6, f32);
    roundtrip(SBPIO_DT_F32, 8, s1x6, f32); /* rank 8 */
    roundtrip(SBPIO_DT_F64, 0, NULL, f64); /* scalar */
    int64_t s03[] = {0, 3};
    roundtrip(SBPIO_DT_F32, 2, s03, NULL); /* empty */
}

static void test_write_errors(void **state)
{
    (void)state;
    float x = 1;
    int64_t neg[] = {2, -1}, big[] = {INT64_MAX, 2}, s1[] = {1};
    assert_int_equal(sbpio_npy_write(io_path("w.npy"), SBPIO_DT_BF16, 1, s1, &x, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "w.npy", "BF16");
    assert_int_equal(sbpio_npy_write(io_path("w.npy"), SBPIO_DT_F32, 2, neg, &x, err, sizeof err),
                     SBPIO_ERR);
    assert_int_equal(sbpio_npy_write(io_path("w.npy"), SBPIO_DT_F32, 2, big, &x, err, sizeof err),
                     SBPIO_ERR);
    assert_int_equal(sbpio_npy_write(io_path("w.npy"), SBPIO_DT_F32, 9, big, &x, err, sizeof err),
                     SBPIO_ERR);
    assert_int_equal(
        sbpio_npy_write(io_path("nodir/w.npy"), SBPIO_DT_F32, 1, s1, &x, err, sizeof err),
        SBPIO_ERR);
    IO_ASSERT_MSG(err, "nodir/w.npy");
    assert_false(io_exists(io_path("w.npy")));
    assert_int_equal(io_count_entries(".tmp."), 0);
    /* err may be NULL */
    assert_int_equal(sbpio_npy_write(io_path("w.npy"), SBPIO_DT_BF16, 1, s1, &x, NULL, 0),
                     SBPIO_ERR);
}

static void test_overwrite_is_atomic(void **state)
{
    (void)state;
    const char *p = io_path("ow.npy");
    int64_t s[] = {3};
    int32_t a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
    assert_int_equal(sbpio_npy_write(p, SBPIO_DT_I32, 1, s, a, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_npy_write(p, SBPIO_DT_I32, 1, s, b, err, sizeof err), SBPIO_OK);
    sbpio_array r;
    assert_int_equal(sbpio_npy_read_i32(p, &r, err, sizeof err), SBPIO_OK);
    assert_memory_equal(r.data, b, sizeof b);
    sbpio_array_free(&r);
    /* A failing write (bad dtype) leaves the previous file intact. */
    assert_int_equal(sbpio_npy_write(p, SBPIO_DT_BF16, 1, s, a, err, sizeof err), SBPIO_ERR);
    assert_int_equal(sbpio_npy_read_i32(p, &r, err, sizeof err), SBPIO_OK);
    assert_memory_equal(r.data, b, sizeof b);
    sbpio_array_free(&r);
}

/* ---------------------------------------------------------------- files written by NumPy */

static void read_ok(const char *name, sbpio_array *a, sbpio_dtype t, int rank, ...)
{
    if (sbpio_npy_read(io_data(name), a, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    assert_int_equal(a->dtype, t);
    assert_int_equal(a->rank, rank);
    va_list ap;
    va_start(ap, rank);
    for (int i = 0; i < rank; i++)
        assert_int_equal(a->shape[i], va_arg(ap, int));
    va_end(ap);
}

static void test_numpy_files(void **state)
{
    (void)state;
    sbpio_array a;
    read_ok("np_i8_2x3.npy", &a, SBPIO_DT_I64, 2, 2, 3);
    int64_t e8[] = {0, 1, 2, 3, 4, -100};
    assert_memory_equal(a.data, e8, sizeof e8);
    sbpio_array_free(&a);

    read_ok("np_i4_6.npy", &a, SBPIO_DT_I32, 1, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(((int32_t *)a.data)[i], -7 * i);
    sbpio_array_free(&a);

    read_ok("np_u1_4.npy", &a, SBPIO_DT_U8, 1, 4);
    assert_int_equal(((uint8_t *)a.data)[2], 200);
    sbpio_array_free(&a);

    read_ok("np_u2_3.npy", &a, SBPIO_DT_U16, 1, 3);
    assert_int_equal(((uint16_t *)a.data)[1], 65535);
    sbpio_array_free(&a);

    read_ok("np_u4_3.npy", &a, SBPIO_DT_U32, 1, 3);
    assert_int_equal(((uint32_t *)a.data)[1], 4294967295u);
    sbpio_array_free(&a);

    read_ok("np_b1_3.npy", &a, SBPIO_DT_BOOL, 1, 3);
    assert_int_equal(((uint8_t *)a.data)[0], 1);
    assert_int_equal(((uint8_t *)a.data)[1], 0);
    sbpio_array_free(&a);

    read_ok("np_f2_3.npy", &a, SBPIO_DT_F16, 1, 3);
    assert_int_equal(sbpio_array_convert(&a, SBPIO_DT_F32, "f2", err, sizeof err), SBPIO_OK);
    assert_true(((float *)a.data)[0] == 1.5f && ((float *)a.data)[1] == -2.0f &&
                ((float *)a.data)[2] == 65504.0f);
    sbpio_array_free(&a);

    read_ok("np_f4_2x2x2.npy", &a, SBPIO_DT_F32, 3, 2, 2, 2);
    for (int i = 0; i < 8; i++)
        assert_true(((float *)a.data)[i] == i * 0.25f - 1.0f);
    sbpio_array_free(&a);

    read_ok("np_f8_scalar.npy", &a, SBPIO_DT_F64, 0);
    assert_int_equal(a.numel, 1);
    assert_true(((double *)a.data)[0] == 3.5);
    sbpio_array_free(&a);

    read_ok("np_f4_empty.npy", &a, SBPIO_DT_F32, 2, 0, 3);
    assert_int_equal(a.numel, 0);
    assert_null(a.data);
    sbpio_array_free(&a);

    read_ok("np_f8_be.npy", &a, SBPIO_DT_F64, 1, 3); /* big-endian, swapped on load */
    assert_true(((double *)a.data)[0] == 1.0 && ((double *)a.data)[1] == -0.5 &&
                ((double *)a.data)[2] == 1e300);
    sbpio_array_free(&a);

    read_ok("np_i4_be.npy", &a, SBPIO_DT_I32, 2, 2, 2);
    int32_t ebe[] = {1, -2, 300000, -400000};
    assert_memory_equal(a.data, ebe, sizeof ebe);
    sbpio_array_free(&a);

    const char *versions[] = {"np_f4_v2.npy", "np_f4_v3.npy"};
    for (int v = 0; v < 2; v++) {
        read_ok(versions[v], &a, SBPIO_DT_F32, 1, 5);
        for (int i = 0; i < 5; i++)
            assert_true(((float *)a.data)[i] == (float)i);
        sbpio_array_free(&a);
    }
}

static void test_numpy_files_refused(void **state)
{
    (void)state;
    sbpio_array a;
    assert_int_equal(sbpio_npy_read(io_data("np_f4_fortran.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "np_f4_fortran.npy", "fortran_order");
    assert_int_equal(sbpio_npy_read(io_data("np_obj.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "np_obj.npy", "object dtype");
    assert_int_equal(sbpio_npy_read(io_data("np_c8.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "np_c8.npy", "complex");
    assert_int_equal(sbpio_npy_read(io_path("does_not_exist.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "does_not_exist.npy", "No such file");
    assert_int_equal(sbpio_npy_read(io_tmpdir, &a, err, sizeof err), SBPIO_ERR);
    assert_null(a.data);
}

/* ---------------------------------------------------------------- conversion */

static void test_convert(void **state)
{
    (void)state;
    sbpio_array a;
    /* token ids / labels: int64 -> int32 */
    assert_int_equal(sbpio_npy_read_i32(io_data("np_i8_2x3.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(a.dtype, SBPIO_DT_I32);
    assert_int_equal(a.nbytes, 6 * 4);
    int32_t e[] = {0, 1, 2, 3, 4, -100};
    assert_memory_equal(a.data, e, sizeof e);
    sbpio_array_free(&a);
    /* out of int32 range: the message names the element and value */
    assert_int_equal(sbpio_npy_read_i32(io_data("np_i8_big.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "np_i8_big.npy", "[1, 1]", "1099511627776", "I32");
    assert_null(a.data);
    assert_int_equal(sbpio_npy_read_i32(io_data("np_u4_3.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "[1]", "4294967295");
    /* narrower types widen; uint8 and bool are fine */
    assert_int_equal(sbpio_npy_read_i32(io_data("np_u2_3.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(((int32_t *)a.data)[1], 65535);
    sbpio_array_free(&a);
    assert_int_equal(sbpio_npy_read_i32(io_data("np_b1_3.npy"), &a, err, sizeof err), SBPIO_OK);
    sbpio_array_free(&a);
    /* floats */
    assert_int_equal(sbpio_npy_read_f64(io_data("np_f4_2x2x2.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(a.dtype, SBPIO_DT_F64);
    assert_true(((double *)a.data)[7] == 0.75);
    sbpio_array_free(&a);
    assert_int_equal(sbpio_npy_read_f32(io_data("np_f8_be.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "[2]", "overflows float32");
    /* integer <-> float refused */
    assert_int_equal(sbpio_npy_read_f32(io_data("np_i4_6.npy"), &a, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "np_i4_6.npy", "floating-point", "I32");
    assert_int_equal(sbpio_npy_read_i32(io_data("np_f8_scalar.npy"), &a, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "integer", "F64");
    /* negative values into unsigned, and the int8 boundaries */
    assert_int_equal(sbpio_npy_read(io_data("np_i8_2x3.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_array_convert(&a, SBPIO_DT_U8, "x", err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "x: element [1, 2] = -100 does not fit U8");
    assert_int_equal(sbpio_array_convert(&a, SBPIO_DT_I8, "x", err, sizeof err), SBPIO_OK);
    assert_int_equal(((int8_t *)a.data)[5], -100);
    sbpio_array_free(&a);
    int64_t s[] = {2};
    int64_t edge[] = {-128, 127};
    assert_int_equal(
        sbpio_npy_write(io_path("edge.npy"), SBPIO_DT_I64, 1, s, edge, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_npy_read(io_path("edge.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_array_convert(&a, SBPIO_DT_I8, "x", err, sizeof err), SBPIO_OK);
    sbpio_array_free(&a);
    uint64_t umax[] = {UINT64_MAX, 1};
    assert_int_equal(
        sbpio_npy_write(io_path("umax.npy"), SBPIO_DT_U64, 1, s, umax, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_npy_read(io_path("umax.npy"), &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_array_convert(&a, SBPIO_DT_I64, "x", err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "[0] = 18446744073709551615");
    sbpio_array_free(&a);
}

/* ---------------------------------------------------------------- malformed headers */

static void test_truncated(void **state)
{
    (void)state;
    float d[6] = {0};
    size_t len;
    unsigned char *b = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", d,
                                sizeof d, &len);
    sbpio_array a;
    assert_int_equal(sbpio_npy_read_mem(b, len, "ok.npy", &a, err, sizeof err), SBPIO_OK);
    sbpio_array_free(&a);
    expect_bad(b, 0, "not a .npy file");
    expect_bad(b, 5, "not a .npy file");
    expect_bad(b, 9, "truncated .npy header");
    expect_bad(b, 40, "truncated .npy header");
    expect_bad(b, len - sizeof d, "data is 0 bytes");
    expect_bad(b, len - 1, "truncated file");
    /* the same, as files on disk */
    for (size_t cut = 0; cut < len; cut += 7) {
        io_write_file(io_path("cut.npy"), b, cut);
        assert_int_equal(sbpio_npy_read(io_path("cut.npy"), &a, err, sizeof err), SBPIO_ERR);
        IO_ASSERT_MSG(err, "cut.npy");
        assert_null(a.data);
    }
    io_write_file(io_path("cut.npy"), b, len);
    assert_int_equal(sbpio_npy_read(io_path("cut.npy"), &a, err, sizeof err), SBPIO_OK);
    sbpio_array_free(&a);
    b[0] = 'X';
    expect_bad(b, len, "bad magic");
    b[0] = 0x93;
    b[6] = 4;
    expect_bad(b, len, "version 4.0");
    b[6] = 1;
    b[7] = 1;
    expect_bad(b, len, "version 1.1");
    b[7] = 0;
    b[8] = 0xff, b[9] = 0xff; /* header length past the end */
    expect_bad(b, len, "truncated .npy header");
    free(b);
    /* a v2 header whose length is absurd */
    unsigned char v2[16] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0x7f, '{'};
    expect_bad(v2, sizeof v2, "implausible");
}

static void test_bad_dicts(void **state)
{
    (void)state;
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, }", 0, "missing key 'shape'");
    expect_bad_dict("{'fortran_order': False, 'shape': (), }", 0, "missing key 'descr'");
    expect_bad_dict("{'descr': '<f4', 'shape': (1,), }", 4, "missing key 'fortran_order'");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4,
                    "unexpected key 'x'");
    expect_bad_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", 4,
                    "duplicate key 'descr'");
    expect_bad_dict("{'descr': 4, 'fortran_order': False, 'shape': (1,)}", 4,
                    "'descr' must be a string");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", 4, "True or False");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", 4,
                    "'shape' must be a tuple");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", 4,
                    "non-negative integers");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", 4,
                    "expected ',' or ')'");
    expect_bad_dict("{'descr': '<f4, 'fortran_order': False, 'shape': (1,)}", 4,
                    "unsupported descr '<f4, '");
    expect_bad_dict("{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", 4,
                    "expected ':' after key 'descr'");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", 4,
                    "expected ',' or '}'");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", 4,
                    "unexpected text after the dict");
    expect_bad_dict("descr: <f4", 4, "expected '{'");
    expect_bad_dict("{'descr", 4, "unterminated string");
    expect_bad_dict("", 0, "expected '{'");
    expect_bad_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}", 4,
                    "structured dtype");
    expect_bad_dict("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}", 8, "object dtype");
    expect_bad_dict("{'descr': '<U3', 'fortran_order': False, 'shape': (1,)}", 12, "string dtype");
    expect_bad_dict("{'descr': '<f16', 'fortran_order': False, 'shape': (1,)}", 16,
                    "unsupported descr '<f16'");
    expect_bad_dict("{'descr': '<i3', 'fortran_order': False, 'shape': (1,)}", 3,
                    "unsupported descr");
    expect_bad_dict("{'descr': '|i4', 'fortran_order': False, 'shape': (1,)}", 4, "byte order");
    expect_bad_dict("{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (1,)}", 8, "datetime");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", 24,
                    "fortran_order True");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1)}", 4,
                    "rank exceeds");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 4,
                    "does not fit int64");
    /* a non-ASCII byte in a 1.0 header */
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), '\xc3\xa9': 1}", 4,
                    "non-ASCII");
}

static void test_good_dict_variants(void **state)
{
    (void)state;
    const char *ok[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2,)}",
        "{'shape':(2,),'fortran_order':False,'descr':'<f4'}",
        " { 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , ) , } ",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2L,), }",
        "{'descr': 'f4', 'fortran_order': False, 'shape': (2,), }",
        "{'descr': '=f4', 'fortran_order': False, 'shape': (2,), }",
        /* Fortran order that equals C order: at most one dim > 1 */
        "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2), }",
    };
    float d[2] = {1.5f, -2.5f};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t len;
        unsigned char *b = make_npy(i % 2 ? 2 : 1, ok[i], d, sizeof d, &len);
        sbpio_array a;
        if (sbpio_npy_read_mem(b, len, "ok.npy", &a, err, sizeof err) != SBPIO_OK)
            print_error("dict %zu: %s\n", i, err);
        assert_int_equal(a.dtype, SBPIO_DT_F32);
        assert_int_equal(a.numel, 2);
        assert_memory_equal(a.data, d, sizeof d);
        sbpio_array_free(&a);
        free(b);
    }
}

static void test_shape_overflow_and_length(void **state)
{
    (void)state;
    /* 2^20^4 * 8 bytes: the element count fits int64 but the byte count does not */
    expect_bad_dict("{'descr': '<f8', 'fortran_order': False, "
                    "'shape': (1048576, 1048576, 1048576, 1048576), }",
                    0, "overflows");
    /* the element count itself overflows int64 */
    expect_bad_dict("{'descr': '|u1', 'fortran_order': False, "
                    "'shape': (4611686018427387904, 4), }",
                    0, "overflows");
    expect_bad_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", 8,
                    "needs 8000000000000 (truncated file)");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8,
                    "data is 8 bytes but shape (3,) of F32 needs 12");
    expect_bad_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8,
                    "trailing bytes");
    /* a zero dimension with no data is fine */
    size_t len;
    unsigned char *b = make_npy(
        3, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1048576), }", NULL, 0, &len);
    sbpio_array a;
    assert_int_equal(sbpio_npy_read_mem(b, len, "z.npy", &a, err, sizeof err), SBPIO_OK);
    assert_int_equal(a.numel, 0);
    free(b);
}

/* ---------------------------------------------------------------- mutations */

/* Random corruptions of valid images (header-biased) must be refused with a message or parsed
 * into a consistent array; run under ASan/UBSan this is a small deterministic fuzzer. */
static void test_mutations(void **state)
{
    (void)state;
    float d[6] = {1, 2, 3, 4, 5, 6};
    size_t n1, n3;
    unsigned char *v1 = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                 d, sizeof d, &n1);
    unsigned char *v3 = make_npy(3, "{'descr': '>i2', 'fortran_order': False, 'shape': (12,), }",
                                 d, sizeof d, &n3);
    unsigned char *buf = malloc((n1 > n3 ? n1 : n3) + 16);
    uint64_t rng = 12345;
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        bool first = it % 2 == 0;
        size_t len = io_mutate(&rng, first ? v1 : v3, first ? n1 : n3, 128, buf);
        sbpio_array a;
        err[0] = '\0';
        int rc;
        if (it % 100 == 0) {
            io_write_file(io_path("mut.npy"), buf, len);
            rc = sbpio_npy_read(io_path("mut.npy"), &a, err, sizeof err);
        } else {
            rc = sbpio_npy_read_mem(buf, len, "mut.npy", &a, err, sizeof err);
        }
        if (rc == SBPIO_OK) {
            accepted++;
            assert_true(a.rank >= 0 && a.rank <= SBPIO_MAX_RANK);
            assert_int_equal(a.nbytes, (size_t)a.numel * sbpio_dtype_size(a.dtype));
            assert_true(a.nbytes <= len);
            sbpio_array_free(&a);
        } else {
            assert_non_null(strstr(err, "mut.npy"));
            assert_null(a.data);
        }
    }
    assert_true(accepted > 0); /* some mutations (data bytes) are harmless */
    free(buf);
    free(v1);
    free(v3);
}

/* ---------------------------------------------------------------- NumPy reads our files */

static void test_numpy_reads_ours(void **state)
{
    (void)state;
    const char *py = io_python_with("numpy");
    if (!py)
        IO_SKIP("no python3 with numpy; NumPy does not cross-check the writer\n");
    int64_t s[] = {2, 3};
    float f[6] = {0.5f, -1, 2, 3, 4, 1e-3f};
    int64_t i[6] = {1, -2, 3, INT64_MAX, INT64_MIN, 0};
    assert_int_equal(sbpio_npy_write(io_path("a.npy"), SBPIO_DT_F32, 2, s, f, err, sizeof err),
                     SBPIO_OK);
    assert_int_equal(sbpio_npy_write(io_path("b.npy"), SBPIO_DT_I64, 2, s, i, err, sizeof err),
                     SBPIO_OK);
    assert_int_equal(
        sbpio_npy_write(io_path("c.npy"), SBPIO_DT_F64, 0, NULL, &(double){2.5}, err, sizeof err),
        SBPIO_OK);
    const char *script =
        "import sys, numpy as np\n"
        "d = sys.argv[1]\n"
        "a = np.load(d + '/a.npy'); b = np.load(d + '/b.npy'); c = np.load(d + '/c.npy')\n"
        "assert a.dtype == np.float32 and a.shape == (2, 3), (a.dtype, a.shape)\n"
        "assert (a == np.array([[0.5, -1, 2], [3, 4, 1e-3]], dtype=np.float32)).all()\n"
        "assert b.dtype == np.int64 and b.shape == (2, 3)\n"
        "assert b[1, 0] == np.iinfo(np.int64).max and b[1, 1] == np.iinfo(np.int64).min\n"
        "assert c.shape == () and c == 2.5\n";
    char args[4200];
    snprintf(args, sizeof args, "'%s'", io_tmpdir);
    assert_int_equal(io_run_python(py, "check_npy.py", script, args), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_dtypes),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_overwrite_is_atomic),
        cmocka_unit_test(test_numpy_files),
        cmocka_unit_test(test_numpy_files_refused),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_bad_dicts),
        cmocka_unit_test(test_good_dict_variants),
        cmocka_unit_test(test_shape_overflow_and_length),
        cmocka_unit_test(test_mutations),
    };
    const struct CMUnitTest python[] = {
        cmocka_unit_test(test_numpy_reads_ours),
    };
    return IO_MAIN("npy", tests, python);
}
