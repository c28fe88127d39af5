/* test_golden.c — canonicalisation of real PyTorch exports.
 *
 * For every fixture model (three families; static and symbolic dims; opset 17, and opset 14 for
 * GPT-2, the one family whose opset 14 export differs: decomposed LayerNorm; a
 * do_constant_folding=False export; one ending in its loss) the pipeline must import,
 * canonicalise and verify, and the semantic op counts must equal what the model's source code
 * says (tests/fixtures/gen_fixtures.py: 2 layers; GPT-2 with LayerNorm/GELU/learned positions and
 * a tied head; Llama with RMSNorm/SwiGLU/RoPE/GQA; Qwen3 adding q/k RMSNorm). Those counts are the
 * independent expectation; the golden dumps (tests/golden/NAME.ir) additionally pin the whole IR so
 * any change to canonical output is seen in review. SBP_UPDATE_GOLDEN=1 rewrites the dumps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "passes.h"

typedef struct fixture {
    const char *file;
    int64_t batch, seq; /* bindings passed (0: none) */
    int attention, layer_norm, rms_norm, rope, swiglu, gelu, linear, embedding, cross_entropy;
    int kv_heads;
    bool retied; /* a folded tied head is expected to be re-tied */
} fixture;

/* From gen_fixtures.py: N_LAYER = 2, N_HEAD = 4, N_KV_HEAD = 2. GPT-2 linears per layer: c_attn,
 * attn c_proj, c_fc, mlp c_proj (4); Llama/Qwen3: q,k,v,o,gate,up,down (7); plus the LM head. */
#define GPT2(f, b, s, tie) {f, b, s, 2, 5, 0, 0, 0, 2, 9, 2, 0, 4, tie}
#define LLAMA(f, b, s) {f, b, s, 2, 0, 5, 4, 2, 0, 15, 1, 0, 2, false}
#define QWEN3(f, b, s) {f, b, s, 2, 0, 9, 4, 2, 0, 15, 1, 0, 2, false}

static const fixture fixtures[] = {
    GPT2("gpt2_op14_static", 0, 0, true),
    GPT2("gpt2_op17_static", 0, 0, true),
    GPT2("gpt2_op14_dyn", 2, 64, true),
    GPT2("gpt2_op17_dyn", 2, 64, true),
    GPT2("gpt2_op17_dyn_nofold", 2, 64, false), /* tie survives as Transpose(wte) */
    LLAMA("llama_op17_static", 0, 0),
    LLAMA("llama_op17_static", 2, 64), /* static dims that agree with the bindings */
    LLAMA("llama_op17_dyn", 2, 64),
    QWEN3("qwen3_op17_static", 0, 0),
    QWEN3("qwen3_op17_dyn", 2, 64),
    {"llama_op17_loss", 0, 0, 2, 0, 5, 4, 2, 0, 15, 1, 1, 2, false},
    /* Odd sequence lengths bind too: nothing in the canonical form depends on T = 64. */
    LLAMA("llama_op17_dyn", 3, 17),
    GPT2("gpt2_op17_dyn", 1, 33, true),
};

static char *dump(const ir_graph *g)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ir_print(g, f);
    fclose(f);
    return buf;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        fclose(f);
        return NULL;
    }
    s[n] = 0;
    fclose(f);
    return s;
}

static void check_fixture(const fixture *fx)
{
    char path[512], gold[512];
    snprintf(path, sizeof path, "%s/%s.onnx", SBP_FIXTURES, fx->file);
    snprintf(gold, sizeof gold, "%s/%s_b%lld_t%lld.ir", SBP_GOLDEN, fx->file,
             (long long)fx->batch, (long long)fx->seq);
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, NULL);
    if (!g || d.n_errors)
        ir_diag_print(&d, stderr, fx->file);
    assert_non_null(g);
    sbp_pass_options opt = {.batch = fx->batch, .seq_len = fx->seq, .verify = true};
    int rc = sbp_canonicalize(g, &opt, NULL);
    if (rc != IR_OK)
        ir_diag_print(&d, stderr, fx->file);
    assert_int_equal(rc, IR_OK);
    assert_int_equal(ir_verify(g), IR_OK);

    assert_int_equal(ir_graph_count_op(g, IR_OP_ATTENTION), fx->attention);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LAYER_NORM), fx->layer_norm);
    assert_int_equal(ir_graph_count_op(g, IR_OP_RMS_NORM), fx->rms_norm);
    assert_int_equal(ir_graph_count_op(g, IR_OP_ROPE), fx->rope);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SWIGLU), fx->swiglu);
    assert_int_equal(ir_graph_count_op(g, IR_OP_GELU), fx->gelu);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LINEAR), fx->linear);
    assert_int_equal(ir_graph_count_op(g, IR_OP_EMBEDDING), fx->embedding);
    assert_int_equal(ir_graph_count_op(g, IR_OP_CROSS_ENTROPY), fx->cross_entropy);
    /* No raw attention or norm pieces may survive next to the semantic ops. */
    assert_int_equal(ir_graph_count_op(g, IR_OP_SOFTMAX), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_REDUCE_MEAN), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_LAYER_NORMALIZATION), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SHAPE), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_TANH), 0);
    assert_int_equal(ir_graph_count_op(g, IR_OP_SIGMOID), 0);
    int tied = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ir_node *n = g->nodes[i];
        if (n->op == IR_OP_ATTENTION) {
            assert_int_equal(ir_attr_int(n, "kv_heads", -1), fx->kv_heads);
            assert_int_equal(ir_attr_int(n, "causal", 0), 1);
        }
        for (int j = 0; j < n->n_out; j++)
            if (n->out[j])
                assert_true(ir_value_shape_known(n->out[j])); /* every dim bound */
    }
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i]->tied_to)
            tied++;
    assert_int_equal(tied, fx->retied ? 1 : 0);

    char *text = dump(g);
    assert_non_null(strstr(text, "attention"));
    if (getenv("SBP_UPDATE_GOLDEN")) {
        FILE *f = fopen(gold, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
    } else {
        char *want = read_file(gold);
        if (!want)
            fail_msg("golden dump %s missing (run with SBP_UPDATE_GOLDEN=1 to create it)", gold);
        if (strcmp(want, text) != 0) {
            fprintf(stderr, "--- %s differs from the pipeline's output; got:\n%s\n", gold, text);
            fail_msg("golden mismatch for %s", fx->file);
        }
        free(want);
    }
    free(text);
    ir_graph_free(g);
    ir_diag_free(&d);
}

static void test_fixture(void **state) { check_fixture((const fixture *)*state); }

/* --no-retie keeps the exporter's copy apart: two parameters, no tie. */
static void test_no_retie(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/gpt2_op17_static.onnx", SBP_FIXTURES);
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, NULL);
    assert_non_null(g);
    sbp_pass_options opt = {.no_retie = true, .verify = true};
    assert_int_equal(sbp_canonicalize(g, &opt, NULL), IR_OK);
    for (int i = 0; i < g->n_values; i++)
        assert_null(g->values[i]->tied_to);
    /* the head stays a Linear on its own (folded, transposed) parameter */
    assert_int_equal(ir_graph_count_op(g, IR_OP_LINEAR), 9);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* A static dim that disagrees with a binding is an error naming both numbers. */
static void test_static_dim_disagrees(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/llama_op17_static.onnx", SBP_FIXTURES);
    ir_diag d;
    ir_diag_init(&d, path);
    ir_graph *g = ir_import_onnx(path, &d, NULL);
    assert_non_null(g);
    sbp_pass_options opt = {.batch = 2, .seq_len = 128, .verify = true};
    assert_int_equal(sbp_canonicalize(g, &opt, NULL), IR_ERR);
    bool found = false;
    for (int i = 0; i < d.n; i++)
        if (d.entries[i].sev == IR_SEV_ERROR && strstr(d.entries[i].msg, "64") &&
            strstr(d.entries[i].msg, "128"))
            found = true;
    assert_true(found);
    ir_graph_free(g);
    ir_diag_free(&d);
}

int main(void)
{
    enum { N = sizeof fixtures / sizeof fixtures[0] };
    struct CMUnitTest tests[N + 2];
    for (int i = 0; i < N; i++)
        tests[i] = (struct CMUnitTest){fixtures[i].file, test_fixture, NULL, NULL,
                                       (void *)&fixtures[i]};
    tests[N] = (struct CMUnitTest)cmocka_unit_test(test_no_retie);
    tests[N + 1] = (struct CMUnitTest)cmocka_unit_test(test_static_dim_disagrees);
    return _cmocka_run_group_tests("golden", tests, N + 2, NULL, NULL);
}
