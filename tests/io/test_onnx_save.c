/* test_onnx_save.c — sbpio_onnx_save_with_weights on tests/fixtures/llama_op17_static.onnx:
 * replaced weights read back with protobuf-c (raw_data, float_data cleared) and the whole output
 * compared byte for byte with the input re-packed with the same substitution; saving in place;
 * external data (forced with a tiny inline limit) written to "<out>.data" and read back in by a
 * second save in another directory; external locations that escape the model's directory;
 * error cases leaving no file behind; and, when python3 has onnx, onnx.checker (full check) plus
 * a value comparison with numpy on every saved model (and onnxruntime inference if installed).
 */
#include "io_test.h"

#include <limits.h>

#include "onnx.pb-c.h"

static char err[1024];

#define FIXTURE "llama_op17_static.onnx"

/* ---------------------------------------------------------------- helpers */

static Onnx__ModelProto *load(const char *path)
{
    size_t n;
    unsigned char *b = io_read_file(path, &n);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, n, b);
    free(b);
    assert_non_null(m);
    assert_non_null(m->graph);
    return m;
}

static void save_model(Onnx__ModelProto *m, const char *path)
{
    size_t n = onnx__model_proto__get_packed_size(m);
    unsigned char *b = malloc(n);
    assert_int_equal(onnx__model_proto__pack(m, b), n);
    io_write_file(path, b, n);
    free(b);
}

static Onnx__TensorProto *find_init(Onnx__ModelProto *m, const char *name)
{
    for (size_t i = 0; i < m->graph->n_initializer; i++)
        if (strcmp(m->graph->initializer[i]->name, name) == 0)
            return m->graph->initializer[i];
    return NULL;
}

static int64_t numel(const Onnx__TensorProto *t)
{
    int64_t n = 1;
    for (size_t i = 0; i < t->n_dims; i++)
        n *= t->dims[i];
    return n;
}

static const char *ext_value(const Onnx__TensorProto *t, const char *key)
{
    for (size_t i = 0; i < t->n_external_data; i++)
        if (strcmp(t->external_data[i]->key, key) == 0)
            return t->external_data[i]->value;
    return NULL;
}

/* A float initializer's values wherever they are (raw, float_data, external next to dir). */
static float *floats_of(const Onnx__TensorProto *t, const char *dir)
{
    int64_t n = numel(t);
    float *f = malloc(sizeof *f * (size_t)(n ? n : 1));
    assert_non_null(f);
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, ext_value(t, "location"));
        size_t len;
        unsigned char *b = io_read_file(path, &len);
        long long off = atoll(ext_value(t, "offset"));
        assert_int_equal(atoll(ext_value(t, "length")), n * 4);
        assert_true((size_t)off + (size_t)n * 4 <= len);
        memcpy(f, b + off, (size_t)n * 4);
        free(b);
    } else if (t->has_raw_data) {
        assert_int_equal(t->raw_data.len, (size_t)n * 4);
        memcpy(f, t->raw_data.data, (size_t)n * 4);
    } else {
        assert_int_equal(t->n_float_data, (size_t)n);
        memcpy(f, t->float_data, (size_t)n * 4);
    }
    return f;
}

/* The weights a test replaces: names and -2 * original values (exact in float). */
typedef struct {
    int n;
    const char *names[64];
    float *data[64];
} weights;

static void make_weights(Onnx__ModelProto *orig, weights *w, bool all)
{
    memset(w, 0, sizeof *w);
    size_t ni = orig->graph->n_initializer;
    for (size_t i = 0; i < ni && w->n < 64; i++) {
        Onnx__TensorProto *t = orig->graph->initializer[i];
        /* a subset: the embedding, the last initializer (the LM head) and one norm weight */
        bool pick = all || i == 0 || i == ni - 1 || strcmp(t->name, "model.norm.weight") == 0;
        if (!pick || t->data_type != 1)
            continue;
        w->names[w->n] = t->name;
        w->data[w->n] = floats_of(t, ".");
        for (int64_t k = 0; k < numel(t); k++)
            w->data[w->n][k] *= -2.0f;
        w->n++;
    }
    assert_true(w->n >= 3);
}

static void free_weights(weights *w)
{
    for (int i = 0; i < w->n; i++)
        free(w->data[i]);
}

static const char *mods_csv(const weights *w)
{
    static char buf[8192];
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < w->n; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s", i ? "," : "", w->names[i]);
    return buf;
}

/* Checks every initializer of the model at path: replaced ones carry the new values as raw_data
 * (no float_data), the others the original values. */
static void check_values(const char *path, Onnx__ModelProto *orig, const weights *w)
{
    Onnx__ModelProto *m = load(path);
    char *dir = strdup(path);
    *strrchr(dir, '/') = '\0';
    assert_int_equal(m->graph->n_initializer, orig->graph->n_initializer);
    for (size_t i = 0; i < m->graph->n_initializer; i++) {
        Onnx__TensorProto *t = m->graph->initializer[i], *o = orig->graph->initializer[i];
        assert_string_equal(t->name, o->name);
        assert_int_equal(t->data_type, o->data_type);
        assert_int_equal(t->n_dims, o->n_dims);
        assert_memory_equal(t->dims, o->dims, sizeof *t->dims * t->n_dims);
        const float *want = NULL;
        for (int k = 0; k < w->n; k++)
            if (strcmp(w->names[k], t->name) == 0)
                want = w->data[k];
        float *got = floats_of(t, dir), *was = floats_of(o, ".");
        if (want) {
            assert_int_equal(t->n_float_data, 0);
            assert_true(t->has_raw_data ||
                        t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL);
        }
        assert_memory_equal(got, want ? want : was, (size_t)numel(t) * 4);
        free(got);
        free(was);
    }
    free(dir);
    onnx__model_proto__free_unpacked(m, NULL);
}

/* The expected output: orig re-packed with the replaced tensors' raw_data swapped in. */
static unsigned char *expected_bytes(Onnx__ModelProto *orig, const weights *w, size_t *len)
{
    ProtobufCBinaryData saved[64];
    protobuf_c_boolean has[64];
    for (int k = 0; k < w->n; k++) {
        Onnx__TensorProto *t = find_init(orig, w->names[k]);
        saved[k] = t->raw_data;
        has[k] = t->has_raw_data;
        t->has_raw_data = 1;
        t->raw_data.data = (uint8_t *)w->data[k];
        t->raw_data.len = (size_t)numel(t) * 4;
    }
    *len = onnx__model_proto__get_packed_size(orig);
    unsigned char *b = malloc(*len);
    onnx__model_proto__pack(orig, b);
    for (int k = 0; k < w->n; k++) {
        Onnx__TensorProto *t = find_init(orig, w->names[k]);
        t->raw_data = saved[k];
        t->has_raw_data = has[k];
    }
    return b;
}

static void assert_same_file(const char *path, const unsigned char *want, size_t wlen)
{
    size_t n;
    unsigned char *b = io_read_file(path, &n);
    assert_int_equal(n, wlen);
    assert_memory_equal(b, want, n);
    free(b);
}

/* ---------------------------------------------------------------- tests */

static void test_replace_inline(void **state)
{
    (void)state;
    Onnx__ModelProto *orig = load(io_fixture(FIXTURE));
    weights w;
    make_weights(orig, &w, false);
    const char *out = io_path("out.onnx");
    if (sbpio_onnx_save_with_weights(io_fixture(FIXTURE), out, w.n, w.names,
                                     (const float *const *)w.data, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    assert_true(io_exists(out));
    assert_false(io_exists(io_path("out.onnx.data")));
    assert_int_equal(io_count_entries(".tmp."), 0);
    check_values(out, orig, &w);
    size_t elen;
    unsigned char *exp = expected_bytes(orig, &w, &elen);
    assert_same_file(out, exp, elen);
    free(exp);
    free_weights(&w);
    onnx__model_proto__free_unpacked(orig, NULL);
}

static void test_in_place_all_weights(void **state)
{
    (void)state;
    size_t n;
    unsigned char *b = io_read_file(io_fixture(FIXTURE), &n);
    const char *p = io_path("inplace.onnx");
    io_write_file(p, b, n);
    free(b);
    Onnx__ModelProto *orig = load(p);
    weights w;
    make_weights(orig, &w, true);
    assert_int_equal(sbpio_onnx_save_with_weights(p, p, w.n, w.names, (const float *const *)w.data,
                                                  err, sizeof err),
                     SBPIO_OK);
    check_values(p, orig, &w);
    assert_int_equal(io_count_entries(".tmp."), 0);
    /* no weights: a plain re-save reproduces the input byte for byte */
    weights none = {0};
    const char *p2 = io_path("resave.onnx");
    assert_int_equal(
        sbpio_onnx_save_with_weights(io_fixture(FIXTURE), p2, 0, NULL, NULL, err, sizeof err),
        SBPIO_OK);
    size_t elen;
    unsigned char *exp = expected_bytes(orig, &none, &elen);
    assert_same_file(p2, exp, elen);
    free(exp);
    free_weights(&w);
    onnx__model_proto__free_unpacked(orig, NULL);
}

static void test_errors(void **state)
{
    (void)state;
    const char *in = io_fixture(FIXTURE), *out = io_path("err.onnx");
    float x[1] = {0};
    const float *d1[] = {x, x};
    const char *unknown[] = {"no.such.weight"};
    assert_int_equal(sbpio_onnx_save_with_weights(in, out, 1, unknown, d1, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, FIXTURE, "no initializer named 'no.such.weight'");
    const char *twice[] = {"model.norm.weight", "model.norm.weight"};
    assert_int_equal(sbpio_onnx_save_with_weights(in, out, 2, twice, d1, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "'model.norm.weight' given twice");
    const float *dnull[] = {NULL};
    const char *norm[] = {"model.norm.weight"};
    assert_int_equal(sbpio_onnx_save_with_weights(in, out, 1, norm, dnull, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "no data for weight 'model.norm.weight'");
    assert_int_equal(
        sbpio_onnx_save_with_weights(io_path("missing.onnx"), out, 0, NULL, NULL, err, sizeof err),
        SBPIO_ERR);
    IO_ASSERT_MSG(err, "missing.onnx", "No such file");
    io_write_file(io_path("garbage.onnx"), "\xff\xff\xff\xff garbage", 12);
    assert_int_equal(
        sbpio_onnx_save_with_weights(io_path("garbage.onnx"), out, 0, NULL, NULL, err, sizeof err),
        SBPIO_ERR);
    IO_ASSERT_MSG(err, "garbage.onnx", "not a valid ONNX model");
    assert_int_equal(
        sbpio_onnx_save_with_weights(in, io_path("no/dir/x.onnx"), 0, NULL, NULL, err, sizeof err),
        SBPIO_ERR);
    IO_ASSERT_MSG(err, "no/dir/x.onnx");
    assert_false(io_exists(out));

    int64_t wrong = 17;
    assert_int_equal(sbpio_onnx_save_ex(in, out, 1, norm, d1, &wrong, NULL, err, sizeof err),
                     SBPIO_ERR);
    IO_ASSERT_MSG(err, "'model.norm.weight' has 17 elements");

    /* a failing save leaves an existing output untouched */
    io_write_file(out, "old", 3);
    assert_int_equal(sbpio_onnx_save_with_weights(in, out, 1, unknown, d1, err, sizeof err),
                     SBPIO_ERR);
    size_t n;
    unsigned char *b = io_read_file(out, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(b, "old", 3);
    free(b);

    /* a non-FLOAT initializer, and float_data storage: edit a copy of the model */
    Onnx__ModelProto *m = load(in);
    Onnx__TensorProto *t = find_init(m, "model.norm.weight");
    t->data_type = 7;
    save_model(m, io_path("int.onnx"));
    t->data_type = 1;
    assert_int_equal(
        sbpio_onnx_save_with_weights(io_path("int.onnx"), out, 1, norm, d1, err, sizeof err),
        SBPIO_ERR);
    IO_ASSERT_MSG(err, "int.onnx", "'model.norm.weight'", "data type 7, not FLOAT");

    /* float_data in, raw_data out */
    int64_t k = numel(t);
    float *fd = malloc(sizeof *fd * (size_t)k);
    memcpy(fd, t->raw_data.data, (size_t)k * 4);
    ProtobufCBinaryData raw = t->raw_data;
    t->has_raw_data = 0;
    t->raw_data.len = 0;
    t->raw_data.data = NULL;
    t->n_float_data = (size_t)k;
    t->float_data = fd;
    save_model(m, io_path("fd.onnx"));
    t->has_raw_data = 1;
    t->raw_data = raw;
    t->n_float_data = 0;
    t->float_data = NULL;
    float *nd = malloc(sizeof *nd * (size_t)k);
    for (int64_t i = 0; i < k; i++)
        nd[i] = (float)i;
    const float *dn[] = {nd};
    assert_int_equal(sbpio_onnx_save_with_weights(io_path("fd.onnx"), io_path("fd_out.onnx"), 1,
                                                  norm, dn, err, sizeof err),
                     SBPIO_OK);
    Onnx__ModelProto *r = load(io_path("fd_out.onnx"));
    Onnx__TensorProto *rt = find_init(r, "model.norm.weight");
    assert_int_equal(rt->n_float_data, 0);
    assert_true(rt->has_raw_data);
    assert_memory_equal(rt->raw_data.data, nd, (size_t)k * 4);
    onnx__model_proto__free_unpacked(r, NULL);
    free(nd);
    free(fd);
    onnx__model_proto__free_unpacked(m, NULL);
    assert_int_equal(io_count_entries(".tmp."), 0);
}

static void test_external_roundtrip(void **state)
{
    (void)state;
    Onnx__ModelProto *orig = load(io_fixture(FIXTURE));
    weights w;
    make_weights(orig, &w, false);
    assert_int_equal(mkdir(io_path("ext"), 0777), 0);
    const char *ext = io_path("ext/out_ext.onnx");
    sbpio_onnx_save_opts o = {.inline_limit = 1}; /* force external data */
    if (sbpio_onnx_save_ex(io_fixture(FIXTURE), ext, w.n, w.names, (const float *const *)w.data,
                           NULL, &o, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    assert_true(io_exists(io_path("ext/out_ext.onnx.data")));
    Onnx__ModelProto *m = load(ext);
    int n_ext = 0, n_inline = 0;
    for (size_t i = 0; i < m->graph->n_initializer; i++) {
        Onnx__TensorProto *t = m->graph->initializer[i];
        size_t bytes = (size_t)numel(t) * 4;
        if (t->has_data_location &&
            t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
            n_ext++;
            assert_true(bytes >= 1024);
            assert_string_equal(ext_value(t, "location"), "out_ext.onnx.data");
            assert_int_equal(atoll(ext_value(t, "offset")) % 4096, 0);
            assert_false(t->has_raw_data);
            assert_int_equal(t->n_float_data, 0);
        } else {
            n_inline++;
            assert_true(bytes < 1024);
        }
    }
    assert_true(n_ext > 0 && n_inline > 0);
    onnx__model_proto__free_unpacked(m, NULL);
    check_values(ext, orig, &w);

    /* Read the external model from elsewhere: everything comes back inline, and the file equals
     * the one saved inline directly. */
    const char *back = io_path("back.onnx");
    if (sbpio_onnx_save_with_weights(ext, back, 0, NULL, NULL, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    check_values(back, orig, &w);
    size_t elen;
    unsigned char *exp = expected_bytes(orig, &w, &elen);
    assert_same_file(back, exp, elen);
    free(exp);

    /* external -> external again, in place: reads the old .data while writing the new one */
    if (sbpio_onnx_save_ex(ext, ext, 0, NULL, NULL, NULL, &o, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    check_values(ext, orig, &w);
    assert_int_equal(io_count_entries(".tmp."), 0);
    free_weights(&w);
    onnx__model_proto__free_unpacked(orig, NULL);
}

/* Makes the embedding of a copy of the fixture external at `location` (offset off) and saves
 * the model as dir/name. */
static void write_external_model(const char *path, const char *location, const char *offset)
{
    Onnx__ModelProto *m = load(io_fixture(FIXTURE));
    Onnx__TensorProto *t = m->graph->initializer[0];
    Onnx__StringStringEntryProto e[2], *ep[2] = {&e[0], &e[1]};
    onnx__string_string_entry_proto__init(&e[0]);
    onnx__string_string_entry_proto__init(&e[1]);
    e[0].key = "location";
    e[0].value = (char *)location;
    e[1].key = "offset";
    e[1].value = (char *)offset;
    ProtobufCBinaryData raw = t->raw_data;
    t->has_raw_data = 0;
    t->raw_data.len = 0;
    t->raw_data.data = NULL;
    t->n_external_data = 2;
    t->external_data = ep;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    save_model(m, path);
    /* the data itself, next to the model, for the cases that should work */
    t->has_raw_data = 1;
    t->raw_data = raw;
    t->n_external_data = 0;
    t->external_data = NULL;
    t->has_data_location = 0;
    onnx__model_proto__free_unpacked(m, NULL);
}

static void test_external_confinement(void **state)
{
    (void)state;
    assert_int_equal(mkdir(io_path("conf"), 0777), 0);
    float big[4096] = {0};
    io_write_file(io_path("outside.data"), big, sizeof big);
    io_write_file(io_path("conf/inside.data"), big, sizeof big);
    assert_int_equal(symlink("../outside.data", io_path("conf/link.data")), 0);
    const char *m = io_path("conf/m.onnx"), *out = io_path("conf_out.onnx");
    struct {
        const char *loc, *off, *want;
    } cases[] = {
        {"../outside.data", "0", "leaves the model's directory"},
        {"link.data", "0", "leaves the model's directory"},
        {"/etc/passwd", "0", "is absolute"},
        {"nope.data", "0", "No such file"},
        {"inside.data", "16384", "beyond"},
        {"inside.data", "-4", "bad external offset"},
        {"", "0", "without a location"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_external_model(m, cases[i].loc, cases[i].off);
        err[0] = '\0';
        assert_int_equal(sbpio_onnx_save_with_weights(m, out, 0, NULL, NULL, err, sizeof err),
                         SBPIO_ERR);
        IO_ASSERT_MSG(err, "m.onnx", "model.embed_tokens.weight", cases[i].want);
        assert_false(io_exists(out));
    }
    /* inside the directory it works, and the data is inlined */
    write_external_model(m, "inside.data", "4096");
    if (sbpio_onnx_save_with_weights(m, out, 0, NULL, NULL, err, sizeof err) != SBPIO_OK)
        print_error("%s\n", err);
    Onnx__ModelProto *r = load(out);
    Onnx__TensorProto *t = r->graph->initializer[0];
    assert_true(t->has_raw_data);
    assert_int_equal(t->n_external_data, 0);
    assert_int_equal(t->raw_data.len, (size_t)numel(t) * 4);
    for (size_t k = 0; k < t->raw_data.len; k++)
        assert_int_equal(t->raw_data.data[k], 0);
    onnx__model_proto__free_unpacked(r, NULL);
    assert_int_equal(io_count_entries(".tmp."), 0);
}

/* Corrupted models (random byte edits of the fixture) are refused with a message or saved; never
 * a crash, a leak or a temporary left behind (under ASan this is a small fuzzer of the paths
 * after protobuf-c's parse: dims, data types, external-data entries). */
static void test_mutations(void **state)
{
    (void)state;
    size_t n;
    unsigned char *src = io_read_file(io_fixture(FIXTURE), &n);
    unsigned char *buf = malloc(n + 16);
    uint64_t rng = 99;
    const char *in = io_path("mut.onnx"), *out = io_path("mut_out.onnx");
    const char *names[] = {"model.norm.weight"};
    float *w = calloc(16, sizeof *w);
    const float *data[] = {w};
    int saved = 0;
    for (int it = 0; it < 300; it++) {
        size_t len = io_mutate(&rng, src, n, 0, buf);
        io_write_file(in, buf, len);
        err[0] = '\0';
        int64_t cap = 16; /* model.norm.weight; a mutated dims field must be caught */
        int rc = sbpio_onnx_save_ex(in, out, it % 2, names, data, &cap, NULL, err, sizeof err);
        if (rc == SBPIO_OK)
            saved++;
        else
            assert_true(err[0] != '\0');
    }
    assert_true(saved > 0);
    assert_int_equal(io_count_entries(".tmp."), 0);
    free(w);
    free(buf);
    free(src);
}

static void test_python_onnx_checker(void **state)
{
    (void)state;
    const char *py = io_python_with("onnx");
    if (!py)
        IO_SKIP("no python3 with the onnx package; onnx.checker does not see the output\n");
    Onnx__ModelProto *orig = load(io_fixture(FIXTURE));
    weights w;
    make_weights(orig, &w, false);
    const char *out = io_path("py.onnx");
    assert_int_equal(sbpio_onnx_save_with_weights(io_fixture(FIXTURE), out, w.n, w.names,
                                                  (const float *const *)w.data, err, sizeof err),
                     SBPIO_OK);
    assert_int_equal(mkdir(io_path("pyext"), 0777), 0);
    const char *ext = io_path("pyext/py_ext.onnx");
    sbpio_onnx_save_opts o = {.inline_limit = 1};
    assert_int_equal(sbpio_onnx_save_ex(io_fixture(FIXTURE), ext, w.n, w.names,
                                        (const float *const *)w.data, NULL, &o, err, sizeof err),
                     SBPIO_OK);
    const char *script =
        "import sys\n"
        "import numpy as np, onnx\n"
        "from onnx import numpy_helper\n"
        "orig_path, mods = sys.argv[1], set(sys.argv[2].split(','))\n"
        "orig = {t.name: numpy_helper.to_array(t) for t in "
        "onnx.load(orig_path).graph.initializer}\n"
        "try:\n"
        "    import onnxruntime as ort\n"
        "except ImportError:\n"
        "    ort = None\n"
        "for p in sys.argv[3:]:\n"
        "    onnx.checker.check_model(p)\n"
        "    m = onnx.load(p)\n"
        "    onnx.checker.check_model(m, full_check=True)\n"
        "    got = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}\n"
        "    assert set(got) == set(orig), set(got) ^ set(orig)\n"
        "    for k, a in orig.items():\n"
        "        want = a * np.float32(-2) if k in mods else a\n"
        "        assert got[k].dtype == want.dtype and got[k].shape == want.shape, k\n"
        "        assert np.array_equal(got[k], want), k\n"
        "    if ort is not None:\n"
        "        s = ort.InferenceSession(p, providers=['CPUExecutionProvider'])\n"
        "        feeds = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],\n"
        "                                  dtype=np.int64) for i in s.get_inputs()}\n"
        "        assert all(np.isfinite(o).all() for o in s.run(None, feeds))\n"
        "print('onnx.checker: %d models OK; onnxruntime: %s' % (len(sys.argv) - 3,\n"
        "      'ran them' if ort else 'not installed, not run'))\n";
    char args[16384];
    snprintf(args, sizeof args, "'%s' '%s' '%s' '%s'", io_fixture(FIXTURE), mods_csv(&w), out, ext);
    assert_int_equal(io_run_python(py, "check_onnx.py", script, args), 0);
    free_weights(&w);
    onnx__model_proto__free_unpacked(orig, NULL);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replace_inline),
        cmocka_unit_test(test_in_place_all_weights),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_external_roundtrip),
        cmocka_unit_test(test_external_confinement),
        cmocka_unit_test(test_mutations),
    };
    const struct CMUnitTest python[] = {
        cmocka_unit_test(test_python_onnx_checker),
    };
    return IO_MAIN("onnx_save", tests, python);
}
