/* test_safetensors.c — the safetensors writer and reader, and the JSON parser under them:
 * write -> read round trips (every dtype, scalars, empty tensors, names and metadata needing
 * escapes, sorted and given order), the PyTorch-side fixture tests/fixtures/ref/
 * llama_grads.safetensors (checked against Python's own json parse when python3 exists), Python
 * reading our files, malformed files (offsets beyond the file, overlaps, size mismatches, bad
 * JSON, bad header sizes), and JSON grammar edge cases.
 */
#include "io_test.h"

#include <math.h>

#include "io_internal.h"

static char err[512];

/* A safetensors image: 8-byte size + json + ndata bytes of data (pattern). */
static unsigned char *st_image(const char *json, size_t ndata, size_t *len)
{
    size_t h = strlen(json);
    unsigned char *b = malloc(8 + h + ndata + 1);
    sbpio_put_le64(b, h);
    memcpy(b + 8, json, h);
    for (size_t i = 0; i < ndata; i++)
        b[8 + h + i] = (unsigned char)i;
    *len = 8 + h + ndata;
    return b;
}

static void expect_bad(const char *json, size_t ndata, const char *want1, const char *want2)
{
    size_t len;
    unsigned char *b = st_image(json, ndata, &len);
    sbpio_st_file *f = (sbpio_st_file *)1;
    err[0] = '\0';
    int rc = sbpio_st_open_mem(b, len, "bad.st", &f, err, sizeof err);
    if (rc != SBPIO_ERR)
        print_error("accepted: %s\n", json);
    assert_int_equal(rc, SBPIO_ERR);
    assert_null(f);
    IO_ASSERT_MSG(err, "bad.st", want1, want2);
    free(b);
}

/* ---------------------------------------------------------------- round trip */

static void test_roundtrip(void **state)
{
    (void)state;
    float w[6] = {1, -2, 3.5f, 0, 1e-20f, -1e20f};
    double g[3] = {0.1, -0.2, 1e300};
    int64_t ids[4] = {INT64_MIN, -1, 0, INT64_MAX};
    int32_t i32[2] = {-7, 7};
    uint8_t u8[3] = {0, 128, 255};
    uint16_t bf[2] = {0x3f80, 0xc000}; /* 1.0, -2.0 */
    double scalar = 42.0;
    int64_t sw[] = {2, 3}, sg[] = {3}, sid[] = {2, 2}, s2[] = {2}, s3[] = {3}, s0[] = {0, 5};
    sbpio_st_tensor t[] = {
        {"w \"quoted\" \\ back\nline", SBPIO_DT_F32, 2, sw, w, NULL, NULL},
        {"grad.\xc3\xa9", SBPIO_DT_F64, 1, sg, g, NULL, NULL},
        {"ids", SBPIO_DT_I64, 2, sid, ids, NULL, NULL},
        {"i32", SBPIO_DT_I32, 1, s2, i32, NULL, NULL},
        {"u8", SBPIO_DT_U8, 1, s3, u8, NULL, NULL},
        {"bf", SBPIO_DT_BF16, 1, s2, bf, NULL, NULL},
        {"scalar", SBPIO_DT_F64, 0, NULL, &scalar, NULL, NULL},
        {"empty", SBPIO_DT_F32, 2, s0, NULL, NULL, NULL},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    sbpio_kv meta[] = {{"loss", "4.1674"}, {"note", "tab\there \"q\" \x01"}};
    for (int sorted = 0; sorted < 2; sorted++) {
        const char *p = io_path(sorted ? "sorted.safetensors" : "given.safetensors");
        assert_int_equal(sbpio_st_write(p, n, t, 2, meta, sorted, err, sizeof err), SBPIO_OK);
        size_t flen;
        unsigned char *raw = io_read_file(p, &flen);
        uint64_t hlen = sbpio_le64(raw);
        assert_int_equal(hlen % 8, 0);
        assert_memory_equal(raw + 8, "{\"__metadata__\":{\"loss\":\"4.1674\"", 32);
        free(raw);

        sbpio_st_file *f;
        if (sbpio_st_open(p, &f, err, sizeof err) != SBPIO_OK)
            print_error("%s\n", err);
        assert_int_equal(sbpio_st_count(f), n);
        assert_string_equal(sbpio_st_path(f), p);
        assert_string_equal(sbpio_st_meta(f, "loss"), "4.1674");
        assert_string_equal(sbpio_st_meta(f, "note"), meta[1].value);
        assert_null(sbpio_st_meta(f, "nope"));
        assert_int_equal(sbpio_st_meta_count(f), 2);
        assert_string_equal(sbpio_st_meta_at(f, 1)->key, "note");
        assert_null(sbpio_st_meta_at(f, 2));
        /* header order: given, or sorted by name (byte-wise) */
        const char *prev = "";
        for (int i = 0; i < n; i++) {
            const sbpio_st_info *in = sbpio_st_at(f, i);
            if (sorted)
                assert_true(strcmp(prev, in->name) < 0);
            else
                assert_string_equal(in->name, t[i].name);
            prev = in->name;
        }
        assert_null(sbpio_st_at(f, n));
        uint64_t off = 0; /* data is contiguous in header order */
        for (int i = 0; i < n; i++) {
            const sbpio_st_info *in = sbpio_st_at(f, i);
            assert_int_equal(in->begin, off);
            off = in->end;
        }
        for (int i = 0; i < n; i++) {
            const sbpio_st_info *in = sbpio_st_find(f, t[i].name);
            assert_non_null(in);
            assert_int_equal(in->dtype, t[i].dtype);
            assert_int_equal(in->rank, t[i].rank);
            for (int d = 0; d < t[i].rank; d++)
                assert_int_equal(in->shape[d], t[i].shape[d]);
            if (in->nbytes)
                assert_memory_equal(in->data, t[i].data, in->nbytes);
        }
        assert_null(sbpio_st_find(f, "missing"));
        const sbpio_st_info *in;
        assert_int_equal(sbpio_st_get(f, "missing", &in, err, sizeof err), SBPIO_ERR);
        IO_ASSERT_MSG(err, p, "'missing'");
        double gd[6];
        float gf[6];
        assert_int_equal(sbpio_st_copy_f64(f, t[0].name, gd, 6, err, sizeof err), SBPIO_OK);
        for (int i = 0; i < 6; i++)
            assert_true(gd[i] == (double)w[i]);
        assert_int_equal(sbpio_st_copy_f32(f, "grad.\xc3\xa9", gf, 3, err, sizeof err), SBPIO_OK);
        assert_true(gf[1] == -0.2f);
        assert_int_equal(sbpio_st_copy_f32(f, "bf", gf, 2, err, sizeof err), SBPIO_OK);
        assert_true(gf[0] == 1.0f && gf[1] == -2.0f);
        assert_int_equal(sbpio_st_copy_f64(f, "grad.\xc3\xa9", gd, 4, err, sizeof err), SBPIO_ERR);
        IO_ASSERT_MSG(err, "3 elements", "expects 4");
        assert_int_equal(sbpio_st_copy_f64(f, "ids", gd, 4, err, sizeof err), SBPIO_ERR);
        IO_ASSERT_MSG(err, "I64", "not floating point");
        sbpio_st_close(f);
    }
    assert_int_equal(io_count_entries(".tmp."), 0);

    /* no tensors, no metadata: "{}" padded to 8 */
    const char *p = io_path("none.safetensors");
    assert_int_equal(sbpio_st_write(p, 0, NULL, 0, NULL, true, err, sizeof err), SBPIO_OK);
    size_t flen;
    unsigned char *raw = io_read_file(p, &flen);
    assert_int_equal(flen, 16);
    assert_memory_equal(raw + 8, "{}      ", 8);
    free(raw);
    sbpio_st_file *f;
    assert_int_equal(sbpio_st_open(p, &f, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_st_count(f), 0);
    assert_null(sbpio_st_find(f, "x"));
    sbpio_st_close(f);
    sbpio_st_close(NULL);
}

static void test_write_errors(void **state)
{
    (void)state;
    float w[2] = {1, 2};
    int64_t s[] = {2}, neg[] = {-2};
    const char *p = io_path("err.safetensors");
    sbpio_st_tensor dup[] = {{"a", SBPIO_DT_F32, 1, s, w, NULL, NULL}, {"a", SBPIO_DT_F32, 1, s, w, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 2, dup, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "err.safetensors", "duplicate tensor name 'a'");
    sbpio_st_tensor meta_name[] = {{"__metadata__", SBPIO_DT_F32, 1, s, w, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 1, meta_name, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    sbpio_st_tensor bad_utf8[] = {{"a\xff", SBPIO_DT_F32, 1, s, w, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 1, bad_utf8, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "UTF-8");
    sbpio_st_tensor negdim[] = {{"a", SBPIO_DT_F32, 1, neg, w, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 1, negdim, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    sbpio_st_tensor nodata[] = {{"a", SBPIO_DT_F32, 1, s, NULL, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 1, nodata, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    sbpio_st_tensor badtype[] = {{"a", SBPIO_DT_INVALID, 1, s, w, NULL, NULL}};
    assert_int_equal(sbpio_st_write(p, 1, badtype, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    sbpio_kv dupmeta[] = {{"k", "1"}, {"k", "2"}};
    assert_int_equal(sbpio_st_write(p, 0, NULL, 2, dupmeta, false, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "duplicate metadata key 'k'");
    sbpio_kv nullmeta[] = {{"k", NULL}};
    assert_int_equal(sbpio_st_write(p, 0, NULL, 1, nullmeta, false, err, sizeof err), SBPIO_ERR);
    assert_int_equal(
        sbpio_st_write(io_path("no/such/dir.st"), 0, NULL, 0, NULL, false, err, sizeof err),
        SBPIO_ERR);
    assert_false(io_exists(p));
    assert_int_equal(io_count_entries(".tmp."), 0);
}

/* ---------------------------------------------------------------- filled tensors, ranges */

/* A fill callback's state: the pieces it was asked for, in order, and where it fails. */
typedef struct fill_probe {
    size_t next;    /* the offset the next call must ask for */
    int calls;
    size_t fail_at; /* fail the piece at this offset (SIZE_MAX: never) */
} fill_probe;

/* element i of the filled tensor is i * 0.5 - 7 (exact in float up to 2^24) */
static int fill_pattern(void *arg, size_t offset, void *buf, size_t bytes, char *e, size_t elen)
{
    fill_probe *p = arg;
    assert_int_equal(offset, p->next); /* consecutive, from 0 */
    assert_int_equal(offset % 4, 0);
    assert_int_equal(bytes % 4, 0);
    assert_true(bytes <= ((size_t)4 << 20));
    p->next = offset + bytes;
    p->calls++;
    if (offset == p->fail_at) {
        snprintf(e, elen, "rank 2 sent nothing");
        return -1;
    }
    float *f = buf;
    for (size_t k = 0; k < bytes / 4; k++)
        f[k] = (float)(offset / 4 + k) * 0.5f - 7.0f;
    return 0;
}

static void test_fill_and_range(void **state)
{
    (void)state;
    /* 2.5 M floats = 10 MB: three pieces of at most 4 MiB, the last one partial */
    const int64_t n = 2500000;
    float small[3] = {1, 2, 3};
    int64_t sn[] = {n}, s3[] = {3};
    fill_probe probe = {0, 0, SIZE_MAX};
    sbpio_st_tensor t[] = {
        {.name = "before", .dtype = SBPIO_DT_F32, .rank = 1, .shape = s3, .data = small},
        {.name = "big", .dtype = SBPIO_DT_F32, .rank = 1, .shape = sn, .fill = fill_pattern,
         .fill_arg = &probe},
        {.name = "after", .dtype = SBPIO_DT_F32, .rank = 1, .shape = s3, .data = small},
    };
    const char *p = io_path("filled.safetensors");
    assert_int_equal(sbpio_st_write(p, 3, t, 0, NULL, false, err, sizeof err), SBPIO_OK);
    assert_int_equal(probe.calls, 3);
    assert_int_equal(probe.next, (size_t)n * 4);
    sbpio_st_file *f = NULL;
    assert_int_equal(sbpio_st_open(p, &f, err, sizeof err), SBPIO_OK);
    float *all = malloc((size_t)n * sizeof *all);
    assert_int_equal(sbpio_st_copy_f32(f, "big", all, n, err, sizeof err), SBPIO_OK);
    for (int64_t i = 0; i < n; i++)
        if (all[i] != (float)i * 0.5f - 7.0f)
            fail_msg("element %lld is %g", (long long)i, all[i]);
    float back[3];
    assert_int_equal(sbpio_st_copy_f32(f, "after", back, 3, err, sizeof err), SBPIO_OK);
    assert_memory_equal(back, small, sizeof small);
    /* a range across the first piece boundary (element 1 Mi), and the last element */
    float part[10];
    assert_int_equal(sbpio_st_copy_f32_range(f, "big", part, n, 1048570, 10, err, sizeof err),
                     SBPIO_OK);
    for (int k = 0; k < 10; k++)
        assert_true(part[k] == (float)(1048570 + k) * 0.5f - 7.0f);
    assert_int_equal(sbpio_st_copy_f32_range(f, "big", part, n, n - 1, 1, err, sizeof err),
                     SBPIO_OK);
    assert_true(part[0] == (float)(n - 1) * 0.5f - 7.0f);
    assert_int_equal(sbpio_st_copy_f32_range(f, "big", part, n, n - 1, 2, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "filled.safetensors", "'big'", "outside");
    assert_int_equal(sbpio_st_copy_f32_range(f, "big", part, n + 1, 0, 1, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "has 2500000 elements");
    sbpio_st_close(f);
    /* opened header only: the same checks, the same values, read from the file on demand */
    assert_int_equal(sbpio_st_open_header(p, &f, err, sizeof err), SBPIO_OK);
    assert_null(sbpio_st_find(f, "big")->data);
    float *again = malloc((size_t)n * sizeof *again);
    assert_int_equal(sbpio_st_copy_f32(f, "big", again, n, err, sizeof err), SBPIO_OK);
    assert_memory_equal(again, all, (size_t)n * sizeof *all);
    assert_int_equal(sbpio_st_copy_f32_range(f, "big", part, n, 1048570, 10, err, sizeof err),
                     SBPIO_OK);
    for (int k = 0; k < 10; k++)
        assert_true(part[k] == (float)(1048570 + k) * 0.5f - 7.0f);
    assert_int_equal(sbpio_st_copy_f32(f, "after", back, 3, err, sizeof err), SBPIO_OK);
    assert_memory_equal(back, small, sizeof small);
    /* the file cut short after the open: a read error, not garbage */
    assert_int_equal(truncate(p, 8 + 100), 0);
    assert_int_equal(sbpio_st_copy_f32(f, "after", back, 3, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "filled.safetensors", "'after'", "shrank");
    sbpio_st_close(f);
    /* and a file cut short before: refused at the open, as sbpio_st_open refuses it */
    f = (sbpio_st_file *)1;
    assert_int_equal(sbpio_st_open_header(p, &f, err, sizeof err), SBPIO_ERR);
    assert_null(f);
    free(again);
    free(all);
    /* a failing fill: no file, no temporary, the callback's message */
    const char *q = io_path("failed.safetensors");
    probe = (fill_probe){0, 0, (size_t)4 << 20};
    assert_int_equal(sbpio_st_write(q, 3, t, 0, NULL, false, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "failed.safetensors", "rank 2 sent nothing");
    assert_int_equal(probe.calls, 2);
    assert_false(io_exists(q));
    assert_int_equal(io_count_entries(".tmp."), 0);
}

/* ---------------------------------------------------------------- the PyTorch-side fixture */

static void test_fixture_llama_grads(void **state)
{
    (void)state;
    const char *p = io_fixture("ref/llama_grads.safetensors");
    sbpio_st_file *f;
    if (sbpio_st_open(p, &f, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    assert_true(sbpio_st_count(f) > 5);
    /* gen_fixtures.py: F64 gradients keyed by initializer name, loss in __metadata__ */
    const char *loss = sbpio_st_meta(f, "loss");
    assert_non_null(loss);
    double l = strtod(loss, NULL);
    assert_true(isfinite(l) && l > 0 && l < 20);
    const sbpio_st_info *emb = sbpio_st_find(f, "model.embed_tokens.weight");
    const sbpio_st_info *norm = sbpio_st_find(f, "model.norm.weight");
    assert_non_null(emb);
    assert_non_null(norm);
    assert_int_equal(emb->rank, 2);
    assert_int_equal(emb->shape[0], 64); /* vocab */
    assert_int_equal(norm->rank, 1);
    assert_int_equal(norm->shape[0], emb->shape[1]); /* d_model */
    assert_non_null(sbpio_st_find(f, "model.layers.0.input_layernorm.weight"));
    double sumsq = 0;
    for (int i = 0; i < sbpio_st_count(f); i++) {
        const sbpio_st_info *t = sbpio_st_at(f, i);
        assert_int_equal(t->dtype, SBPIO_DT_F64);
        double *g = malloc(sizeof *g * (size_t)(t->numel ? t->numel : 1));
        assert_int_equal(sbpio_st_copy_f64(f, t->name, g, t->numel, err, sizeof err), SBPIO_OK);
        for (int64_t k = 0; k < t->numel; k++) {
            assert_true(isfinite(g[k]));
            sumsq += g[k] * g[k];
        }
        free(g);
    }
    assert_true(sumsq > 0);
    sbpio_st_close(f);
}

/* The same fixture header parsed independently by Python's json: every name, dtype, shape and
 * offset pair, and the metadata, must agree. */
static void test_fixture_vs_python_json(void **state)
{
    (void)state;
    const char *py = io_python_with("json");
    if (!py)
        IO_SKIP("no python3; the fixture header is not cross-checked with Python's json\n");
    const char *p = io_fixture("ref/llama_grads.safetensors");
    sbpio_st_file *f;
    assert_int_equal(sbpio_st_open(p, &f, err, sizeof err), SBPIO_OK);
    const char *loss = sbpio_st_meta(f, "loss");
    assert_non_null(loss);
    const char *script = "import json, struct, sys\n"
                         "raw = open(sys.argv[1], 'rb').read()\n"
                         "n, = struct.unpack('<Q', raw[:8])\n"
                         "h = json.loads(raw[8:8 + n])\n"
                         "meta = h.pop('__metadata__', {})\n"
                         "with open(sys.argv[2], 'w') as out:\n"
                         "    out.write('%d %s\\n' % (len(h), meta['loss']))\n"
                         "    for k in sorted(h):\n"
                         "        v = h[k]\n"
                         "        out.write('%s %s %s %d %d\\n' % (k, v['dtype'], "
                         "','.join(map(str, v['shape'])) or '-',\n"
                         "                  v['data_offsets'][0], v['data_offsets'][1]))\n";
    char args[9000];
    snprintf(args, sizeof args, "'%s' '%s'", p, io_path("expect.txt"));
    assert_int_equal(io_run_python(py, "hdr.py", script, args), 0);
    FILE *e = fopen(io_path("expect.txt"), "r");
    assert_non_null(e);
    int count;
    char lbuf[64];
    assert_int_equal(fscanf(e, "%d %63s", &count, lbuf), 2);
    assert_int_equal(count, sbpio_st_count(f));
    assert_string_equal(lbuf, loss);
    char name[256], dt[16], shape[128];
    unsigned long long b0, b1;
    int seen = 0;
    while (fscanf(e, "%255s %15s %127s %llu %llu", name, dt, shape, &b0, &b1) == 5) {
        const sbpio_st_info *t = sbpio_st_find(f, name);
        assert_non_null(t);
        assert_string_equal(dt, sbpio_dtype_name(t->dtype));
        char mine[128] = "-";
        size_t k = 0;
        for (int d = 0; d < t->rank; d++)
            k += (size_t)snprintf(mine + k, sizeof mine - k, "%s%lld", d ? "," : "",
                                  (long long)t->shape[d]);
        assert_string_equal(shape, mine);
        assert_int_equal(b0, t->begin);
        assert_int_equal(b1, t->end);
        seen++;
    }
    fclose(e);
    assert_int_equal(seen, count);
    sbpio_st_close(f);
}

static void test_python_reads_ours(void **state)
{
    (void)state;
    const char *py = io_python_with("json");
    if (!py)
        IO_SKIP("no python3; Python does not cross-check the writer\n");
    double g[3] = {0.5, -1.25, 3};
    int64_t ids[2] = {-100, 7};
    int64_t s3[] = {3}, s12[] = {1, 2};
    sbpio_st_tensor t[] = {{"b.weight", SBPIO_DT_F64, 1, s3, g, NULL, NULL},
                           {"a \"odd\"\\name\t\xc3\xa9", SBPIO_DT_I64, 2, s12, ids, NULL, NULL}};
    sbpio_kv meta[] = {{"loss", "1.5"}, {"q", "\"\\\n"}};
    const char *p = io_path("py.safetensors");
    assert_int_equal(sbpio_st_write(p, 2, t, 2, meta, true, err, sizeof err), SBPIO_OK);
    const char *script =
        "import json, struct, sys\n"
        "raw = open(sys.argv[1], 'rb').read()\n"
        "n, = struct.unpack('<Q', raw[:8])\n"
        "assert n % 8 == 0\n"
        "h = json.loads(raw[8:8 + n].decode('utf-8'))\n"
        "assert list(h) == ['__metadata__', 'a \"odd\"\\\\name\\t\\u00e9', 'b.weight'], list(h)\n"
        "assert h['__metadata__'] == {'loss': '1.5', 'q': '\"\\\\\\n'}, h['__metadata__']\n"
        "base = 8 + n\n"
        "b = h['b.weight']; s, e = b['data_offsets']\n"
        "assert b['dtype'] == 'F64' and b['shape'] == [3]\n"
        "assert struct.unpack('<3d', raw[base + s:base + e]) == (0.5, -1.25, 3.0)\n"
        "a = h['a \"odd\"\\\\name\\t\\u00e9']; s, e = a['data_offsets']\n"
        "assert a['dtype'] == 'I64' and a['shape'] == [1, 2] and (s, e) == (0, 16)\n"
        "assert struct.unpack('<2q', raw[base + s:base + e]) == (-100, 7)\n"
        "assert base + 40 == len(raw)\n";
    char args[4200];
    snprintf(args, sizeof args, "'%s'", p);
    assert_int_equal(io_run_python(py, "st.py", script, args), 0);
}

/* ---------------------------------------------------------------- malformed files */

static void test_malformed(void **state)
{
    (void)state;
    /* the valid baseline */
    const char *good = "{\"__metadata__\":{\"k\":\"v\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}";
    size_t len;
    unsigned char *b = st_image(good, 16, &len);
    sbpio_st_file *f;
    assert_int_equal(sbpio_st_open_mem(b, len, "good.st", &f, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_st_count(f), 2);
    sbpio_st_close(f);
    /* the data section may be longer than needed (not every tensor must be listed) */
    free(b);
    b = st_image(good, 24, &len);
    assert_int_equal(sbpio_st_open_mem(b, len, "good.st", &f, err, sizeof err), SBPIO_OK);
    sbpio_st_close(f);
    /* header size checks */
    expect_bad("", 0, "too small", "");
    sbpio_put_le64(b, 1000);
    assert_int_equal(sbpio_st_open_mem(b, len, "bad.st", &f, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "bad.st", "runs past the end");
    sbpio_put_le64(b, 200000000);
    assert_int_equal(sbpio_st_open_mem(b, len, "bad.st", &f, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "exceeds");
    sbpio_put_le64(b, UINT64_MAX);
    assert_int_equal(sbpio_st_open_mem(b, len, "bad.st", &f, err, sizeof err), SBPIO_ERR);
    assert_int_equal(sbpio_st_open_mem(b, 5, "bad.st", &f, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "too short");
    /* truncating the data section puts offsets beyond the file */
    free(b);
    b = st_image(good, 16, &len);
    io_write_file(io_path("trunc.safetensors"), b, len - 1);
    assert_int_equal(sbpio_st_open(io_path("trunc.safetensors"), &f, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "trunc.safetensors", "'b'", "beyond the 15-byte data section");
    free(b);
    assert_int_equal(sbpio_st_open(io_path("nonexistent"), &f, err, sizeof err), SBPIO_ERR);
    IO_ASSERT_MSG(err, "nonexistent", "No such file");

    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4,
               "beyond the 4-byte data section", "'a'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               16, "overlap", "'a' [0, 8) and 'b' [4, 12)");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
               16, "overlap", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 16,
               "span 8 bytes", "needs 12");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 16,
               "end before they begin", "");
    expect_bad("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16,
               "unsupported dtype \"F33\"", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 16, "shape[0]",
               "non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 16, "shape[0]",
               "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}}", 16,
               "data_offsets", "two non-negative");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,\"8\"]}}", 16,
               "data_offsets", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 16,
               "\"shape\" is not an array", "");
    expect_bad("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "missing \"dtype\"", "");
    expect_bad("{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "not a string",
               "");
    expect_bad("{\"a\":[1,2]}", 16, "'a' is an array", "not an object");
    expect_bad("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,8]}}",
               16, "overflows", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
               16, "rank 9", "");
    expect_bad(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99999999999999999999]}}", 16,
        "data_offsets", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               16, "duplicate tensor name 'a'", "");
    expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "metadata \"k\"", "not a string");
    expect_bad("{\"__metadata__\":[]}", 0, "\"__metadata__\" is an array", "");
    expect_bad("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "duplicate metadata key", "");
    expect_bad("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate \"__metadata__\"", "");
    /* not JSON, or not an object */
    expect_bad("[1,2]   ", 0, "does not start with '{'", "");
    expect_bad("{\"a\":}  ", 0, "not valid JSON", "unexpected character '}' at byte 5");
    expect_bad("{\"a\" 1}", 0, "not valid JSON", "expected ':'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 16,
               "not valid JSON", "expected ',' or '}'");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}x", 16,
               "trailing characters", "");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", 16,
               "unexpected character ']'", "");
    expect_bad("{\"a\xff\":{}}", 0, "invalid UTF-8", "");
    /* empty tensors at the same offset as a neighbour's start are not an overlap */
    const char *empties = "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[8,8]}}";
    b = st_image(empties, 8, &len);
    assert_int_equal(sbpio_st_open_mem(b, len, "e.st", &f, err, sizeof err), SBPIO_OK);
    assert_int_equal(sbpio_st_find(f, "z")->numel, 0);
    sbpio_st_close(f);
    free(b);
}

/* ---------------------------------------------------------------- mutations */

static void mutate_and_open(const unsigned char *src, size_t n, size_t hot, int iters,
                            uint64_t seed)
{
    unsigned char *buf = malloc(n + 16);
    uint64_t rng = seed;
    for (int it = 0; it < iters; it++) {
        size_t len = io_mutate(&rng, src, n, hot, buf);
        sbpio_st_file *f;
        err[0] = '\0';
        if (sbpio_st_open_mem(buf, len, "mut.st", &f, err, sizeof err) == SBPIO_OK) {
            for (int i = 0; i < sbpio_st_count(f); i++) {
                const sbpio_st_info *t = sbpio_st_at(f, i);
                assert_true(t->end <= len && t->end - t->begin == t->nbytes);
                assert_ptr_equal(sbpio_st_find(f, t->name), t);
            }
            sbpio_st_close(f);
        } else {
            assert_non_null(strstr(err, "mut.st"));
        }
    }
    free(buf);
}

/* Random corruptions of a small file and of the fixture (header-biased) are refused with a
 * message or open consistently; a small deterministic fuzzer under ASan/UBSan. */
static void test_mutations(void **state)
{
    (void)state;
    const char *json = "{\"__metadata__\":{\"k\":\"v\\u00e9\"},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"I64\",\"shape\":[1,1],\"data_offsets\":[8,16]}}";
    size_t len;
    unsigned char *b = st_image(json, 16, &len);
    mutate_and_open(b, len, len - 16, 20000, 777);
    free(b);
    b = io_read_file(io_fixture("ref/llama_grads.safetensors"), &len);
    mutate_and_open(b, len, 8 + (size_t)sbpio_le64(b), 2000, 778);
    free(b);
}

/* ---------------------------------------------------------------- JSON */

static const sbpio_json *parse_ok(const char *text, sbpio_json_doc **doc)
{
    const sbpio_json *root;
    *doc = sbpio_json_parse(text, strlen(text), &root, err, sizeof err);
    if (!*doc)
        print_error("%s: %s\n", text, err);
    assert_non_null(*doc);
    return root;
}

static void parse_bad(const char *text, size_t len, const char *want)
{
    const sbpio_json *root;
    sbpio_json_doc *doc = sbpio_json_parse(text, len, &root, err, sizeof err);
    if (doc)
        print_error("accepted: %s\n", text);
    assert_null(doc);
    assert_null(root);
    IO_ASSERT_MSG(err, want);
}
#define PARSE_BAD(lit, want) parse_bad(lit, sizeof(lit) - 1, want)

static void test_json(void **state)
{
    (void)state;
    sbpio_json_doc *doc;
    const sbpio_json *v =
        parse_ok(" {\"s\":\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 \xe2\x82\xac\","
                 "\"n\":[0,-1,2.5,1e3,-0.5E-3,18446744073709551615,18446744073709551616],"
                 "\"t\":true,\"f\":false,\"z\":null,\"e\":{},\"a\":[]} ",
                 &doc);
    assert_int_equal(v->kind, SBPIO_JSON_OBJECT);
    assert_int_equal(v->n, 7);
    const sbpio_json *s = sbpio_json_get(v, "s");
    assert_string_equal(s->str, "q\" b\\ s/ \b\f\n\r\t \xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac");
    const sbpio_json *n = sbpio_json_get(v, "n");
    assert_int_equal(n->n, 7);
    uint64_t u;
    assert_true(sbpio_json_u64(n->items[0], &u) && u == 0);
    assert_false(sbpio_json_u64(n->items[1], &u));
    assert_false(sbpio_json_u64(n->items[2], &u));
    assert_false(sbpio_json_u64(n->items[3], &u));
    assert_string_equal(n->items[4]->str, "-0.5E-3");
    assert_true(sbpio_json_u64(n->items[5], &u) && u == UINT64_MAX);
    assert_false(sbpio_json_u64(n->items[6], &u));
    assert_false(sbpio_json_u64(s, &u));
    assert_true(sbpio_json_get(v, "t")->b);
    assert_int_equal(sbpio_json_get(v, "f")->kind, SBPIO_JSON_BOOL);
    assert_false(sbpio_json_get(v, "f")->b);
    assert_int_equal(sbpio_json_get(v, "z")->kind, SBPIO_JSON_NULL);
    assert_int_equal(sbpio_json_get(v, "e")->n, 0);
    assert_int_equal(sbpio_json_get(v, "a")->kind, SBPIO_JSON_ARRAY);
    assert_null(sbpio_json_get(v, "missing"));
    assert_null(sbpio_json_get(s, "x"));
    sbpio_json_free(doc);

    /* nesting: 64 levels are fine, 66 are not */
    char deep[200];
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    deep[128] = '\0';
    parse_ok(deep, &doc);
    sbpio_json_free(doc);
    memset(deep, '[', 66);
    memset(deep + 66, ']', 66);
    deep[132] = '\0';
    parse_bad(deep, strlen(deep), "nesting deeper than 64");

    PARSE_BAD("", "unexpected end of text at byte 0");
    PARSE_BAD("   ", "unexpected end");
    PARSE_BAD("01", "trailing characters");
    PARSE_BAD("1.", "digits must follow '.'");
    PARSE_BAD("-", "bad number");
    PARSE_BAD("1e", "exponent without digits");
    PARSE_BAD("+1", "unexpected character '+'");
    PARSE_BAD("tru", "unexpected character 't'");
    PARSE_BAD("[1,]", "unexpected character ']'");
    PARSE_BAD("{\"a\":1,}", "expected a string key");
    PARSE_BAD("{1:2}", "expected a string key");
    PARSE_BAD("[1 2]", "expected ',' or ']'");
    PARSE_BAD("\"abc", "unterminated string");
    PARSE_BAD("\"a\\", "unterminated string");
    PARSE_BAD("\"\\x\"", "bad escape '\\x'");
    PARSE_BAD("\"\\u12g4\"", "bad \\u escape");
    PARSE_BAD("\"\\ud800\"", "unpaired high surrogate");
    PARSE_BAD("\"\\ud800\\u0041\"", "unpaired high surrogate");
    PARSE_BAD("\"\\udc00\"", "unpaired low surrogate");
    PARSE_BAD("\"\\u0000\"", "\\u0000");
    PARSE_BAD("\"a\nb\"", "control character 0x0a");
    PARSE_BAD("\"\xc0\xaf\"", "invalid UTF-8");         /* overlong '/' */
    PARSE_BAD("\"\xed\xa0\x80\"", "invalid UTF-8");     /* encoded surrogate */
    PARSE_BAD("\"\xf4\x90\x80\x80\"", "invalid UTF-8"); /* > U+10FFFF */
    PARSE_BAD("\"\xe2\x82\"", "invalid UTF-8");         /* truncated sequence */
    PARSE_BAD("\x01", "unexpected byte 0x01");
    PARSE_BAD("[1]\0", "trailing characters");

    /* the writer's escaper round-trips through the parser */
    sbpio_strbuf sb = {0};
    const char *nasty = "a\"b\\c\n\r\t\b\f\x01\x1f \xc3\xa9/";
    assert_true(sbpio_sb_json_string(&sb, nasty));
    assert_string_equal(sb.s, "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f \xc3\xa9/\"");
    v = parse_ok(sb.s, &doc);
    assert_string_equal(v->str, nasty);
    sbpio_json_free(doc);
    assert_false(sbpio_sb_json_string(&sb, "\xff"));
    free(sb.s);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_write_errors),
        cmocka_unit_test(test_fill_and_range),
        cmocka_unit_test(test_fixture_llama_grads),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_json),
    };
    const struct CMUnitTest python[] = {
        cmocka_unit_test(test_fixture_vs_python_json),
        cmocka_unit_test(test_python_reads_ours),
    };
    return IO_MAIN("safetensors", tests, python);
}
