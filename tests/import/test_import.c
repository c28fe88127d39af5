/* test_import.c — the ONNX importer (ir/onnx_import.c).
 *
 * Every malformed model of corpus/ (made by gen_malformed.py) must be refused: the importer
 * returns NULL and records an error whose text contains an expected phrase. The valid models
 * must import, verify, and read back the exact numbers the generator wrote. A truncation and
 * bit-flip sweep over a valid model checks that no prefix or single-byte corruption crashes.
 * Finally every fixture model of tests/fixtures/ must import cleanly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ir.h"
#include "../intree_fixtures.h"

#define CORPUS SBP_IMPORT_CORPUS

/* ------------------------------------------------------------------ helpers */

static char *corpus_path(const char *file)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", CORPUS, file);
    return buf;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* The error entry whose message contains `needle`, or NULL. */
static const ir_diag_entry *find_error(const ir_diag *d, const char *needle)
{
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].sev == IR_SEV_ERROR && d->entries[i].msg &&
            strstr(d->entries[i].msg, needle))
            return &d->entries[i];
    return NULL;
}

static int count_errors_containing(const ir_diag *d, const char *needle)
{
    int c = 0;
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].sev == IR_SEV_ERROR && d->entries[i].msg &&
            strstr(d->entries[i].msg, needle))
            c++;
    return c;
}

/* Imports `path` expecting failure with an error containing `needle`; returns that entry's
 * index so callers can check node/op. On mismatch the diagnostics are printed. */
static int expect_refused(const char *path, const char *needle, ir_diag *d)
{
    ir_graph *g = ir_import_onnx(path, d, NULL);
    const ir_diag_entry *e = find_error(d, needle);
    if (g || !e || d->n_errors == 0) {
        fprintf(stderr, "import of %s: %s; expected an error containing \"%s\"; got:\n", path,
                g ? "SUCCEEDED" : "failed", needle);
        ir_diag_print(d, stderr, "  ");
    }
    assert_null(g);
    assert_true(d->n_errors > 0);
    assert_non_null(e);
    return (int)(e - d->entries);
}

static ir_graph *expect_ok(const char *path, ir_diag *d)
{
    ir_graph *g = ir_import_onnx(path, d, NULL);
    if (!g || d->n_errors) {
        fprintf(stderr, "import of %s failed:\n", path);
        ir_diag_print(d, stderr, "  ");
    }
    assert_non_null(g);
    assert_int_equal(d->n_errors, 0);
    assert_int_equal(ir_verify(g), IR_OK);
    return g;
}

static ir_value *must_find(ir_graph *g, const char *name)
{
    ir_value *v = ir_value_find(g, name);
    if (!v)
        fprintf(stderr, "value '%s' not found\n", name);
    assert_non_null(v);
    return v;
}

/* ------------------------------------------------------------------ the malformed corpus */

typedef struct malformed_case {
    const char *file;
    const char *needle; /* a phrase of the expected error message */
    const char *node;   /* expected node name of that entry, or NULL: not about a node */
} malformed_case;

static const malformed_case malformed[] = {
    {"empty.onnx", "the model file is empty", NULL},
    {"truncated.onnx", "could not be decoded", NULL},
    {"random.onnx", "not a valid ONNX model", NULL},
    {"deep_nesting.onnx", "nest deeper than", NULL},
    {"no_graph.onnx", "has no graph", NULL},
    {"no_outputs.onnx", "has no outputs", NULL},
    {"opset99.onnx", "opset 99", NULL},
    {"missing_opset.onnx", "no ai.onnx opset import", NULL},
    {"unknown_ops.onnx", "unsupported operator FancyOp (domain '')", "fancy1"},
    {"arity.onnx", "has 3 inputs; Add takes 2", "add3"},
    {"subgraph.onnx", "subgraph", "branch"},
    {"undefined_input.onnx", "undefined value 'nope' used as input 1", "add"},
    {"cycle.onnx", "cycle", NULL},
    {"duplicate_output.onnx", "value 'y' (output 0) is defined twice", "second"},
    {"const_string.onnx", "string constants", "cs"},
    {"negative_dim.onnx", "graph input 'x': dimension 1 is negative (-3)", NULL},
    {"rank_too_big.onnx", "rank 9 exceeds", NULL},
    {"negative_dim_init.onnx", "initializer 'w': dimension 0 is negative", NULL},
    {"overflow_dims.onnx", "initializer 'w': the element count of its dimensions overflows",
     NULL},
    {"huge_tensor.onnx", "more than the 2^40-byte limit", NULL},
    {"huge_dim.onnx", "larger than the supported maximum 2^40", NULL},
    {"zero_dim_data.onnx", "raw_data holds 16 bytes, but f32[0,4] needs 0 bytes", NULL},
    {"init_short.onnx", "initializer 'w': raw_data holds 20 bytes, but f32[2,3] needs 24 bytes",
     NULL},
    {"init_long.onnx", "initializer 'w': raw_data holds 28 bytes, but f32[2,3] needs 24 bytes",
     NULL},
    {"init_short_typed.onnx", "float_data holds 5 elements (20 bytes), but f32[2,3] needs 6", NULL},
    {"init_no_data.onnx", "initializer 'w': f32[2,3] has no data", NULL},
    {"string_tensor.onnx", "initializer 'w': string tensors are not supported", NULL},
    {"bad_dtype.onnx", "data type #99 is not supported", NULL},
    {"duplicate_init.onnx", "initializer 'w' is given twice", NULL},
    {"ext_absolute.onnx", "'/etc/passwd' is an absolute path", NULL},
    {"ext_dotdot.onnx", "'../corpus/ext_valid.bin' has a '..' component", NULL},
    {"ext_dotdot_inner.onnx", "has a '..' component", NULL},
    {"ext_missing.onnx", "external data file 'does_not_exist.bin' not found", NULL},
    {"ext_offset_range.onnx", "offset 100000 is beyond the end of 'ext_valid.bin' (64 bytes)",
     NULL},
    {"ext_length_range.onnx", "runs past the end of 'ext_valid.bin' (64 bytes)", NULL},
    {"ext_length_mismatch.onnx", "external data length is 8 bytes, but the tensor needs 24", NULL},
    {"ext_bad_offset.onnx", "offset '-16' is not a non-negative integer", NULL},
    {"ext_no_location.onnx", "no 'location' entry", NULL},
};

static void test_malformed(void **state)
{
    const malformed_case *c = *state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    int i = expect_refused(corpus_path(c->file), c->needle, &d);
    const ir_diag_entry *e = &d.entries[i];
    if (c->node) {
        assert_non_null(e->node);
        assert_string_equal(e->node, c->node);
        assert_non_null(e->op);
    }
    /* Messages are located at the model file. */
    assert_non_null(e->file);
    assert_non_null(strstr(e->file, c->file));
    /* A broken initializer or input must not cascade into "undefined value" errors. */
    if (!strstr(c->needle, "undefined value"))
        assert_int_equal(count_errors_containing(&d, "undefined value"), 0);
    /* The importer leaves the caller's default file as it found it. */
    assert_null(d.file);
    ir_diag_free(&d);
}

/* ------------------------------------------------------------------ other failures */

static void test_missing_file(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "x.onnx");
    expect_refused(corpus_path("no_such_model.onnx"), "cannot open model file", &d);
    assert_non_null(find_error(&d, "No such file"));
    ir_diag_free(&d);
}

static void test_directory(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    expect_refused(CORPUS, "not a regular file", &d);
    ir_diag_free(&d);
}

/* Every distinct unsupported op is listed once, at its first node. */
static void test_unknown_ops_all_listed(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    expect_refused(corpus_path("unknown_ops.onnx"), "unsupported operator", &d);
    assert_int_equal(count_errors_containing(&d, "unsupported operator"), 3);
    assert_int_equal(d.n_errors, 3);
    const ir_diag_entry *e = find_error(&d, "unsupported operator FancyOp (domain ''), used by 2");
    assert_non_null(e);
    assert_string_equal(e->node, "fancy1");
    assert_string_equal(e->op, "FancyOp");
    e = find_error(&d, "unsupported operator WeirdOp (domain 'com.example')");
    assert_non_null(e);
    assert_string_equal(e->node, "weird");
    e = find_error(&d, "unsupported operator FrobOp (domain '')");
    assert_non_null(e);
    assert_string_equal(e->node, "frob");
    assert_string_equal(e->op, "FrobOp");
    ir_diag_free(&d);
}

/* From memory without a base directory, external data is refused. */
static void test_ext_from_memory(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = slurp(corpus_path("ext_valid.onnx"), &len);
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = ir_import_onnx_buffer(buf, len, "mem.onnx", NULL, &d, NULL);
    assert_null(g);
    const ir_diag_entry *e = find_error(&d, "imported from memory");
    assert_non_null(e);
    assert_non_null(strstr(e->msg, "initializer 'w1'"));
    ir_diag_free(&d);
    /* ... and accepted with the corpus as base directory. */
    ir_diag_init(&d, NULL);
    g = ir_import_onnx_buffer(buf, len, "mem.onnx", CORPUS, &d, NULL);
    assert_non_null(g);
    assert_int_equal(d.n_errors, 0);
    ir_graph_free(g);
    ir_diag_free(&d);
    free(buf);
}

static void rm_rf_scratch(const char *root) /* root: at most 2047 chars */
{
    static const char *files[] = {"model/m.onnx", "model/link.bin", "model/inner.bin",
                                  "outside.bin"};
    char p[4096];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", root, files[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/model", root);
    rmdir(p);
    rmdir(root);
}

/* link.bin inside the model directory points outside it: refused. Pointing at a file inside
 * the directory is fine. The symlink is made here, not committed. */
static void test_ext_symlink(void **state)
{
    (void)state;
    char root[2048], p[4096], model[4096];
    snprintf(root, sizeof root, "%s/import_scratch_XXXXXX", SBP_TEST_SCRATCH);
    assert_non_null(mkdtemp(root));
    snprintf(p, sizeof p, "%s/model", root);
    assert_int_equal(mkdir(p, 0755), 0);
    float w[6] = {1, 2, 3, 4, 5, 6};
    snprintf(p, sizeof p, "%s/outside.bin", root);
    write_file(p, w, sizeof w);
    snprintf(p, sizeof p, "%s/model/inner.bin", root);
    write_file(p, w, sizeof w);
    size_t len;
    uint8_t *buf = slurp(corpus_path("ext_symlink.onnx"), &len);
    snprintf(model, sizeof model, "%s/model/m.onnx", root);
    write_file(model, buf, len);
    free(buf);
    snprintf(p, sizeof p, "%s/model/link.bin", root);
    assert_int_equal(symlink("../outside.bin", p), 0);

    ir_diag d;
    ir_diag_init(&d, NULL);
    expect_refused(model, "escapes the model directory", &d);
    ir_diag_free(&d);

    assert_int_equal(unlink(p), 0);
    assert_int_equal(symlink("inner.bin", p), 0);
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(model, &d);
    ir_value *v = must_find(g, "w1");
    assert_int_equal(v->nbytes, sizeof w);
    assert_memory_equal(v->data, w, sizeof w);
    ir_graph_free(g);
    ir_diag_free(&d);
    rm_rf_scratch(root);
}

/* ------------------------------------------------------------------ valid models */

static void test_ext_valid(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(corpus_path("ext_valid.onnx"), &d);
    ir_value *w1 = must_find(g, "w1"), *w2 = must_find(g, "w2");
    assert_int_equal(w1->kind, IR_VAL_PARAM);
    assert_int_equal(w1->dtype, IR_DT_FLOAT);
    assert_int_equal(w1->rank, 2);
    assert_int_equal(w1->dims[0].value, 2);
    assert_int_equal(w1->dims[1].value, 3);
    assert_int_equal(w1->nbytes, 24);
    const float *f = w1->data;
    for (int i = 0; i < 6; i++) /* EXT_W1 = arange(6) / 4 - 0.5 */
        assert_true(f[i] == (float)i / 4.0f - 0.5f);
    assert_int_equal(w2->kind, IR_VAL_CONST);
    assert_int_equal(w2->dtype, IR_DT_INT64);
    assert_int_equal(w2->nbytes, 24);
    assert_int_equal(ir_const_i64(w2, 0), 7);
    assert_int_equal(ir_const_i64(w2, 1), -1);
    assert_int_equal(ir_const_i64(w2, 2), (int64_t)1 << 40);
    ir_value *x = g->inputs[0];
    assert_int_equal(g->n_inputs, 1);
    assert_string_equal(x->dims[0].sym, "batch");
    ir_graph_free(g);
    ir_diag_free(&d);
}

static void check_symbolic(ir_graph *g)
{
    assert_string_equal(g->name, "tiny_lm");
    assert_int_equal(g->opset, 17);
    /* initializers also listed as graph inputs are not inputs */
    assert_int_equal(g->n_inputs, 1);
    ir_value *ids = g->inputs[0];
    assert_string_equal(ids->name, "ids");
    assert_int_equal(ids->kind, IR_VAL_INPUT);
    assert_int_equal(ids->dtype, IR_DT_INT64);
    assert_int_equal(ids->rank, 2);
    assert_int_equal(ids->dims[0].value, -1);
    assert_string_equal(ids->dims[0].sym, "batch");
    assert_string_equal(ids->dims[1].sym, "sequence");
    ir_value *wte = must_find(g, "wte");
    assert_int_equal(wte->kind, IR_VAL_PARAM);
    assert_int_equal(wte->nbytes, 16 * 8 * 4);
    assert_int_equal(must_find(g, "W")->kind, IR_VAL_PARAM);
    /* Constant nodes became constants */
    ir_value *two = must_find(g, "two");
    assert_int_equal(two->kind, IR_VAL_CONST);
    assert_int_equal(two->dtype, IR_DT_FLOAT);
    assert_int_equal(two->rank, 0);
    assert_true(ir_const_f64(two, 0) == 2.0);
    ir_value *axes = must_find(g, "axes");
    assert_int_equal(axes->dtype, IR_DT_INT64);
    assert_int_equal(axes->rank, 1);
    assert_int_equal(axes->dims[0].value, 2);
    assert_int_equal(ir_const_i64(axes, 1), 1);
    assert_int_equal(ir_graph_count_op(g, IR_OP_CONSTANT), 0);
    /* three nodes, in dependency order */
    assert_int_equal(g->n_nodes, 3);
    assert_int_equal(g->nodes[0]->op, IR_OP_GATHER);
    assert_string_equal(g->nodes[0]->name, "embed");
    assert_int_equal(g->nodes[1]->op, IR_OP_MATMUL);
    assert_int_equal(g->nodes[2]->op, IR_OP_MUL);
    assert_ptr_equal(g->nodes[2]->in[1], two);
    /* output, with its declared symbolic type */
    assert_int_equal(g->n_outputs, 1);
    ir_value *out = g->outputs[0];
    assert_string_equal(out->name, "out");
    assert_true(out->is_output);
    assert_ptr_equal(out->producer, g->nodes[2]);
    assert_int_equal(out->dtype, IR_DT_FLOAT);
    assert_int_equal(out->rank, 3);
    assert_string_equal(out->dims[0].sym, "batch");
    assert_string_equal(out->dims[1].sym, "sequence");
    assert_int_equal(out->dims[2].value, 16);
    ir_value *h = must_find(g, "h");
    assert_int_equal(h->rank, 3);
    assert_int_equal(h->dims[2].value, 8);
}

static void test_valid_symbolic(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(corpus_path("valid_symbolic.onnx"), &d);
    check_symbolic(g);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* Nodes in reverse order are accepted and sorted. */
static void test_valid_unordered(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(corpus_path("valid_unordered.onnx"), &d);
    check_symbolic(g);
    ir_graph_free(g);
    ir_diag_free(&d);
}

static void test_valid_typed(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(corpus_path("valid_typed.onnx"), &d);
    ir_value *v = must_find(g, "t_f32");
    assert_int_equal(v->kind, IR_VAL_PARAM);
    assert_true(ir_const_f64(v, 0) == 1.5 && ir_const_f64(v, 1) == -2.0 &&
                ir_const_f64(v, 2) == 0.25);
    v = must_find(g, "t_f16");
    assert_int_equal(v->kind, IR_VAL_PARAM);
    assert_int_equal(v->dtype, IR_DT_FLOAT16);
    assert_int_equal(v->nbytes, 4);
    assert_int_equal(((uint16_t *)v->data)[0], 0x3c00); /* 1.0 */
    assert_int_equal(((uint16_t *)v->data)[1], 0xc000); /* -2.0 */
    v = must_find(g, "t_bool");
    assert_int_equal(v->kind, IR_VAL_CONST);
    assert_int_equal(v->nbytes, 3);
    assert_memory_equal(v->data, "\1\0\1", 3);
    v = must_find(g, "t_u8");
    assert_int_equal(ir_const_i64(v, 0), 255);
    assert_int_equal(ir_const_i64(v, 1), 7);
    v = must_find(g, "t_i16");
    assert_int_equal(ir_const_i64(v, 0), -300);
    assert_int_equal(ir_const_i64(v, 1), 300);
    v = must_find(g, "t_i64");
    assert_int_equal(ir_const_i64(v, 0), -5);
    assert_int_equal(ir_const_i64(v, 1), (int64_t)1 << 40);
    v = must_find(g, "t_f64");
    assert_int_equal(v->kind, IR_VAL_PARAM);
    assert_true(ir_const_f64(v, 0) == 0.125 && ir_const_f64(v, 1) == -1e300);
    v = must_find(g, "t_u32");
    assert_int_equal(v->dtype, IR_DT_UINT32);
    assert_int_equal(v->nbytes, 8);
    assert_int_equal(ir_const_i64(v, 0), 4000000000LL);
    assert_int_equal(ir_const_i64(v, 1), 1);
    v = must_find(g, "t_empty");
    assert_int_equal(v->nbytes, 0);
    assert_int_equal(v->rank, 2);
    assert_int_equal(v->dims[0].value, 0);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* Every prefix of a valid model, and every single-byte corruption of it, either imports or is
 * refused with an error: never a crash (run under ASan/UBSan). */
static void test_truncation_and_bitflip_sweep(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = slurp(corpus_path("valid_symbolic.onnx"), &len);
    for (size_t n = 0; n < len; n++) {
        ir_diag d;
        ir_diag_init(&d, NULL);
        ir_graph *g = ir_import_onnx_buffer(buf, n, "prefix", NULL, &d, NULL);
        assert_true(g != NULL || d.n_errors > 0);
        ir_graph_free(g);
        ir_diag_free(&d);
    }
    static const uint8_t flips[] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < len; i++)
        for (size_t k = 0; k < sizeof flips; k++) {
            buf[i] ^= flips[k];
            ir_diag d;
            ir_diag_init(&d, NULL);
            ir_graph *g = ir_import_onnx_buffer(buf, len, "flip", NULL, &d, NULL);
            assert_true(g != NULL || d.n_errors > 0);
            if (g)
                assert_int_equal(ir_verify(g), IR_OK);
            ir_graph_free(g);
            ir_diag_free(&d);
            buf[i] ^= flips[k];
        }
    free(buf);
}

/* The real exports: every fixture imports, verifies, and has no Constant node left. The
 * fixtures are committed (../intree_fixtures.h): a missing folder or model fails the test. */
static void test_fixtures(void **state)
{
    (void)state;
    int missing = 0;
    for (int i = 0; i < SBP_N_INTREE_FIXTURES; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", SBP_FIXTURES_DIR, sbp_intree_fixtures[i]);
        if (access(p, R_OK) != 0) {
            print_error("in-tree fixture %s is missing or unreadable: %s\n", p, strerror(errno));
            missing++;
        }
    }
    DIR *dir = opendir(SBP_FIXTURES_DIR);
    if (!dir)
        fail_msg("cannot open the fixture folder %s: %s (it is committed: a missing folder is "
                 "a failure, not a skip)",
                 SBP_FIXTURES_DIR, strerror(errno));
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".onnx") != 0)
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s", SBP_FIXTURES_DIR, de->d_name);
        ir_diag d;
        ir_diag_init(&d, NULL);
        ir_graph *g = expect_ok(p, &d);
        assert_true(g->opset >= 14);
        assert_true(g->n_inputs >= 1);
        assert_true(g->n_outputs >= 1);
        assert_int_equal(ir_graph_count_op(g, IR_OP_CONSTANT), 0);
        int params = 0;
        for (int i = 0; i < g->n_values; i++)
            params += g->values[i]->kind == IR_VAL_PARAM;
        assert_true(params > 0);
        ir_graph_free(g);
        ir_diag_free(&d);
        n++;
    }
    closedir(dir);
    if (missing)
        fail_msg("%d in-tree fixture model(s) missing from %s (a failure, not a skip)", missing,
                 SBP_FIXTURES_DIR);
    assert_true(n >= SBP_N_INTREE_FIXTURES);
}

/* The dynamo exporter's graph signature (GraphProto.metadata_props, field 16, which protobuf-c
 * keeps as an unknown field with its length prefix) reaches g->torch_signature verbatim; a
 * TorchScript export has none. */
static void test_torch_signature(void **state)
{
    (void)state;
    char p[4096];
    snprintf(p, sizeof p, "%s/hf/llama_dynamo_eager.onnx", SBP_FIXTURES_DIR);
    /* committed (tests/fixtures/hf): missing is a failure, not a skip */
    if (access(p, R_OK) != 0)
        fail_msg("in-tree fixture %s is missing or unreadable: %s", p, strerror(errno));
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(p, &d);
    assert_non_null(g->torch_signature);
    const char *sig = g->torch_signature;
    assert_non_null(strstr(sig, "PARAMETER target='lm_head.weight'"));
    assert_non_null(strstr(sig, "p_model_norm_weight: PARAMETER target='model.norm.weight'"));
    assert_non_null(strstr(sig, "BUFFER target='model.rotary_emb.inv_freq'"));
    /* the value only: not the key, and no protobuf framing (the length varint) in front */
    assert_null(strstr(sig, "pkg.torch.export"));
    assert_int_equal(strncmp(sig, "\n# inputs\np_model_embed_tokens_weight: PARAMETER", 48), 0);
    ir_graph_free(g);
    ir_diag_free(&d);

    snprintf(p, sizeof p, "%s/hf/llama_ts_eager.onnx", SBP_FIXTURES_DIR);
    if (access(p, R_OK) != 0)
        fail_msg("in-tree fixture %s is missing or unreadable: %s", p, strerror(errno));
    ir_diag_init(&d, NULL);
    g = expect_ok(p, &d);
    assert_null(g->torch_signature);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* The dynamo exporter's per-node module path (NodeProto.metadata_props, field 9, an unknown
 * field to protobuf-c): ir_node.scope is the innermost module, not the list, not the node's own
 * fx name that ends it, and NULL for a node of the root module and for an export without it. */
static void test_torch_node_scope(void **state)
{
    (void)state;
    char p[4096];
    snprintf(p, sizeof p, "%s/hf/llama_dynamo_scoped.onnx", SBP_FIXTURES_DIR);
    if (access(p, R_OK) != 0)
        fail_msg("in-tree fixture %s is missing or unreadable: %s", p, strerror(errno));
    ir_diag d;
    ir_diag_init(&d, NULL);
    ir_graph *g = expect_ok(p, &d);
    int seen = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ir_node *n = g->nodes[i];
        if (strcmp(n->name, "node_linear") == 0) {
            assert_non_null(n->scope);
            assert_string_equal(n->scope, "model.layers.0.self_attn.q_proj");
            seen++;
        } else if (strcmp(n->name, "node_linear_14") == 0) {
            assert_non_null(n->scope);
            assert_string_equal(n->scope, "lm_head");
            seen++;
        } else if (strcmp(n->name, "node_matmul") == 0) {
            assert_non_null(n->scope);
            assert_string_equal(n->scope, "model.layers.0.self_attn");
            seen++;
        }
    }
    assert_int_equal(seen, 3);
    ir_graph_free(g);
    ir_diag_free(&d);

    snprintf(p, sizeof p, "%s/hf/llama_dynamo_eager.onnx", SBP_FIXTURES_DIR);
    if (access(p, R_OK) != 0)
        fail_msg("in-tree fixture %s is missing or unreadable: %s", p, strerror(errno));
    ir_diag_init(&d, NULL);
    g = expect_ok(p, &d);
    for (int i = 0; i < g->n_nodes; i++)
        assert_null(g->nodes[i]->scope); /* metadata stripped by gen_hf.py's tidy() */
    ir_graph_free(g);
    ir_diag_free(&d);
}

int main(void)
{
    enum { NM = sizeof malformed / sizeof *malformed };
    struct CMUnitTest tests[NM + 16];
    int n = 0;
    for (int i = 0; i < NM; i++)
        tests[n++] = (struct CMUnitTest){malformed[i].file, test_malformed, NULL, NULL,
                                         (void *)&malformed[i]};
#define T(f) tests[n++] = (struct CMUnitTest)cmocka_unit_test(f)
    T(test_missing_file);
    T(test_directory);
    T(test_unknown_ops_all_listed);
    T(test_ext_from_memory);
    T(test_ext_symlink);
    T(test_ext_valid);
    T(test_valid_symbolic);
    T(test_valid_unordered);
    T(test_valid_typed);
    T(test_truncation_and_bitflip_sweep);
    T(test_fixtures);
    T(test_torch_signature);
    T(test_torch_node_scope);
#undef T
    return _cmocka_run_group_tests("import", tests, (size_t)n, NULL, NULL);
}
