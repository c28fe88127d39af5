/* test_stream.c — the stream strategy (StreamBP) end to end.
 *
 * For each fixture family (GPT-2, Llama, Qwen3 exported with symbolic dims and bound to B=2,
 * T=64; Llama with its loss in the graph; GPT-2 without constant folding, whose tied LM head
 * reads a Transpose of the embedding) the model is compiled with `store` once and with `stream`
 * at every layer chunk in {64, 17, 5, 1} and logits chunk in {64, 13, 1} (17, 5 and 13 do not
 * divide the rows; 1 is a token at a time), through C into a shared object. One step on the
 * reference batch must give the loss and every gradient of `store` (relative error per tensor
 * <= 1e-5) and of the float64 PyTorch reference (<= 1e-4; loss <= 1e-5).
 *
 * Also: B = 1; label masks that leave whole chunks (of the layers and of the head) without a
 * scored position, and a batch with none at all; the plan holds no buffer of B*T*V or B*H*T^2
 * elements, runs K/V once per layer outside the chunk loops and attention inside them with the
 * chunk's start as q_start; the verifier accepts every built program and rejects loops that
 * miss or repeat rows or slices past a buffer; a graph that mixes sequence positions is refused
 * by stream with a diagnostic naming the node, and built by checkpoint; a per-head norm scaled
 * by Mul(., Add(w, 1)) in front of RoPE (Gemma-3's q/k norms as an export that keeps w writes
 * them) builds with every strategy and no relayout copy. Compiling, running and
 * the comparisons are the e2e tests' shared steps (e2e_util.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "e2e_util.h"

#define B E2E_B
#define T E2E_T

static const int64_t layer_chunks[] = {64, 17, 5, 1};
static const int64_t logits_chunks[] = {64, 13, 1};

/* ------------------------------------------------------------------ compiling */

static const char *freeze_re; /* --freeze for the next builds (NULL: none) */

/* The program only (no C). */
static void build(e2e_step *s, const char *model, int64_t b, int64_t t,
                  const sbp_train_options *o)
{
    e2e_build(s, model, b, t, SBP_OBJECTIVE_SFT, freeze_re, o);
}

static void compile_step(e2e_step *s, const char *model, int64_t b, int64_t t,
                         const sbp_train_options *o, const char *tag)
{
    e2e_compile(s, model, b, t, SBP_OBJECTIVE_SFT, freeze_re, o, tag);
}

/* One step; returns the loss; grads gets param_elems floats (overwritten). */
static double run_step(const e2e_step *s, const float *params, float *grads, const e2e_batch *bt)
{
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = bt->ids,
                       .labels = bt->labels};
    return e2e_run(s, &a, true);
}

/* ------------------------------------------------------------------ plan properties */

/* No workspace buffer of B*T*V or B*H*T^2 elements (heads: the widest attention), and the
 * structure: attention only inside chunk loops with q_start = t0; the nodes that run before the
 * loops (the K/V path) never inside one; each layer's K/V projection once per block. */
static void check_plan(const sbp_train_program *p)
{
    const ir_graph *g = p->g;
    int64_t heads = 1;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k]->op == IR_OP_ATTENTION && g->nodes[k]->in[0]->dims[1].value > heads)
            heads = g->nodes[k]->in[0]->dims[1].value;
    size_t btv = (size_t)(p->batch * p->seq_len * p->vocab);
    size_t bht2 = (size_t)(p->batch * heads * p->seq_len * p->seq_len);
    for (int i = 0; i < p->n_bufs; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind != TP_BUF_WS || b->span)
            continue;
        if (b->numel >= btv || b->numel >= bht2)
            print_message("  buffer %s has %zu elements (B*T*V = %zu, B*H*T^2 = %zu)\n",
                          b->name, b->numel, btv, bht2);
        assert_true(b->numel < btv && b->numel < bht2);
    }
    int n_attn_calls = 0;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        int li = 0;
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            while (li < blk->n_loops && blk->loops[li].end <= i)
                li++;
            bool in_loop = li < blk->n_loops && blk->loops[li].first <= i;
            int k = -1;
            for (int j = 0; in->node && j < g->n_nodes; j++)
                if (g->nodes[j] == in->node)
                    k = j;
            if (in->k == TP_K_ATTENTION_FWD || in->k == TP_K_ATTENTION_BWD) {
                assert_true(in_loop);
                assert_int_equal(in->arg[6].kind, TP_ARG_T0);
                n_attn_calls++;
            }
            if (k >= 0 && p->pre_loop[k])
                assert_false(in_loop);
        }
    }
    assert_true(n_attn_calls > 0);
}

/* ------------------------------------------------------------------ the family tests */

typedef struct family_case {
    const char *model;
    const char *family;
    int64_t b, t;        /* bindings (0: static) */
} family_case;

static const family_case cases[] = {
    {"gpt2_op17_dyn.onnx", "gpt2", B, T},
    {"llama_op17_dyn.onnx", "llama", B, T},
    {"qwen3_op17_dyn.onnx", "qwen3", B, T},
    {"llama_op17_loss.onnx", "llama", 0, 0},
    {"gpt2_op17_dyn_nofold.onnx", "gpt2", B, T},
};

static void tag_of(char *tag, size_t n, const char *model, const char *what)
{
    snprintf(tag, n, "stream_%s_%s", model, what);
    char *dot = strstr(tag, ".onnx");
    if (dot)
        memmove(dot, dot + 5, strlen(dot + 5) + 1);
}

static void run_family(const family_case *fc)
{
    e2e_reference r;
    e2e_load_reference(&r, fc->family, NULL);
    char tag[256];
    tag_of(tag, sizeof tag, fc->model, "store");
    e2e_step st;
    sbp_train_options so = {.strategy = SBP_STRATEGY_STORE};
    compile_step(&st, fc->model, fc->b, fc->t, &so, tag);
    float *params = e2e_param_block(st.info, st.g);
    float *gstore = malloc(st.info->param_elems * sizeof(float));
    double lstore = run_step(&st, params, gstore, &r.bt);
    double worst_store = 0, worst_ref = 0, worst_loss = 0;
    for (size_t ci = 0; ci < sizeof layer_chunks / sizeof layer_chunks[0]; ci++) {
        for (size_t li = 0; li < sizeof logits_chunks / sizeof logits_chunks[0]; li++) {
            sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM,
                                   .chunk = layer_chunks[ci],
                                   .logits_chunk = logits_chunks[li]};
            char what[64];
            snprintf(what, sizeof what, "c%lld_l%lld", (long long)o.chunk,
                     (long long)o.logits_chunk);
            tag_of(tag, sizeof tag, fc->model, what);
            e2e_step s;
            compile_step(&s, fc->model, fc->b, fc->t, &o, tag);
            assert_int_equal(s.p->chunk, o.chunk);
            assert_int_equal(s.p->logits_chunk, o.logits_chunk);
            assert_int_equal(sbp_train_verify(s.p, &s.diag), IR_OK);
            check_plan(s.p);
            float *g = malloc(s.info->param_elems * sizeof(float));
            double l = run_step(&s, params, g, &r.bt);
            double e_store = e2e_max_rel_vs(&s, g, &st, gstore, E2E_STORE_TOL);
            double e_ref = e2e_max_rel_vs_ref(&s, g, &r, false);
            double e_loss = fabs(l - r.loss) / fabs(r.loss);
            double e_lstore = fabs(l - lstore) / fabs(lstore);
            print_message("  %-40s loss %.9f (store %.2e, ref %.2e)  grads: vs store %.2e, "
                          "vs PyTorch %.2e; workspace %zu\n",
                          tag, l, e_lstore, e_loss, e_store, e_ref, s.info->workspace_bytes);
            assert_true(e_lstore <= E2E_STORE_TOL);
            assert_true(e_loss <= E2E_REF_LOSS_TOL);
            assert_true(e_store <= E2E_STORE_TOL);
            assert_true(e_ref <= E2E_REF_GRAD_TOL);
            worst_store = e_store > worst_store ? e_store : worst_store;
            worst_ref = e_ref > worst_ref ? e_ref : worst_ref;
            worst_loss = e_loss > worst_loss ? e_loss : worst_loss;
            free(g);
            e2e_free_step(&s);
        }
    }
    print_message("  %s: max rel err over the chunkings: gradients vs store %.2e, vs PyTorch "
                  "%.2e; loss vs PyTorch %.2e (store: workspace %zu bytes)\n",
                  fc->model, worst_store, worst_ref, worst_loss, st.info->workspace_bytes);
    free(params);
    free(gstore);
    e2e_free_step(&st);
    e2e_free_reference(&r);
}

static void test_gpt2(void **state) { (void)state; run_family(&cases[0]); }
static void test_llama(void **state) { (void)state; run_family(&cases[1]); }
static void test_qwen3(void **state) { (void)state; run_family(&cases[2]); }
static void test_llama_graph_loss(void **state) { (void)state; run_family(&cases[3]); }
static void test_gpt2_nofold(void **state) { (void)state; run_family(&cases[4]); }

/* ------------------------------------------------------------------ batches */

/* stream against store on a batch of the given model (store compiled once). */
static void stream_vs_store(const char *model, int64_t b, const e2e_batch *bt, const char *name,
                            const int64_t (*chunks)[2], int n_chunks)
{
    char tag[256];
    e2e_step st;
    sbp_train_options so = {.strategy = SBP_STRATEGY_STORE};
    snprintf(tag, sizeof tag, "stream_%s_store", name);
    compile_step(&st, model, b, T, &so, tag);
    float *params = e2e_param_block(st.info, st.g);
    float *gstore = malloc(st.info->param_elems * sizeof(float));
    double lstore = run_step(&st, params, gstore, bt);
    for (int i = 0; i < n_chunks; i++) {
        sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = chunks[i][0],
                               .logits_chunk = chunks[i][1]};
        snprintf(tag, sizeof tag, "stream_%s_c%lld_l%lld", name, (long long)o.chunk,
                 (long long)o.logits_chunk);
        e2e_step s;
        compile_step(&s, model, b, T, &o, tag);
        float *g = malloc(s.info->param_elems * sizeof(float));
        double l = run_step(&s, params, g, bt);
        double e = e2e_max_rel_vs(&s, g, &st, gstore, E2E_STORE_TOL);
        double el = lstore != 0 ? fabs(l - lstore) / fabs(lstore) : fabs(l);
        print_message("  %-40s loss %.9f (store %.9f, rel %.2e), grads vs store %.2e\n", tag,
                      l, lstore, el, e);
        assert_true(el <= E2E_STORE_TOL);
        assert_true(e <= E2E_STORE_TOL);
        free(g);
        e2e_free_step(&s);
    }
    free(params);
    free(gstore);
    e2e_free_step(&st);
}

/* B = 1: chunks are one sequence's rows; the head's rows are that sequence. */
static void test_batch1(void **state)
{
    (void)state;
    e2e_batch full, one;
    e2e_load_batch("llama", &full);
    one.b = 1;
    one.t = T;
    memcpy(one.ids, full.ids, sizeof(int32_t) * T);
    memcpy(one.labels, full.labels, sizeof(int32_t) * T);
    const int64_t chunks[][2] = {{64, 64}, {17, 13}, {5, 1}, {1, 64}};
    stream_vs_store("llama_op17_dyn.onnx", 1, &one, "llama_b1", chunks, 4);
    e2e_load_batch("gpt2", &full);
    memcpy(one.ids, full.ids, sizeof(int32_t) * T);
    memcpy(one.labels, full.labels, sizeof(int32_t) * T);
    stream_vs_store("gpt2_op17_dyn.onnx", 1, &one, "gpt2_b1", chunks, 2);
}

/* Label masks: whole layer chunks (5 rows) and whole head chunks (13 rows) with no scored
 * position — sequence 0 rows 0..14 and sequence 1 rows 30..63 (the head's flattened rows
 * 94..127) — and a batch with no scored position at all (loss 0, zero gradients). The mean's
 * denominator is the whole batch's count, so every chunking gives store's loss. */
static void test_masked_chunks(void **state)
{
    (void)state;
    e2e_batch bt;
    e2e_load_batch("qwen3", &bt);
    for (int t = 0; t < 15; t++)
        bt.labels[t] = SBPRT_IGNORE_INDEX;
    for (int t = 30; t < T; t++)
        bt.labels[T + t] = SBPRT_IGNORE_INDEX;
    const int64_t chunks[][2] = {{5, 13}, {17, 1}, {1, 13}};
    stream_vs_store("qwen3_op17_dyn.onnx", B, &bt, "qwen3_masked", chunks, 3);

    for (int i = 0; i < B * T; i++)
        bt.labels[i] = SBPRT_IGNORE_INDEX;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 5, .logits_chunk = 13};
    e2e_step s;
    compile_step(&s, "qwen3_op17_dyn.onnx", B, T, &o, "stream_qwen3_unscored");
    float *params = e2e_param_block(s.info, s.g), *g = malloc(s.info->param_elems * sizeof(float));
    double l = run_step(&s, params, g, &bt);
    assert_true(l == 0.0);
    for (size_t i = 0; i < s.info->grad_elems; i++)
        assert_true(g[i] == 0.0f);
    free(params);
    free(g);
    e2e_free_step(&s);
}

/* --freeze of the embedding and the first layer: stream drops the backward blocks with no
 * gradient to compute (no recomputation for nothing) and agrees with store. */
static void test_frozen_prefix(void **state)
{
    (void)state;
    e2e_batch bt;
    e2e_load_batch("llama", &bt);
    /* layer 0's norms by name, its projections by their folded initializer names */
    freeze_re = "embed_tokens|layers\\.0\\.|MatMul_(665|666|667|691|692|693|694)$";
    const int64_t chunks[][2] = {{17, 13}};
    stream_vs_store("llama_op17_dyn.onnx", B, &bt, "llama_frozen", chunks, 1);
    e2e_step s;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17, .logits_chunk = 13};
    build(&s, "llama_op17_dyn.onnx", B, T, &o);
    freeze_re = NULL;
    for (int bi = 0; bi < s.p->n_blocks; bi++) {
        print_message("  block %s\n", s.p->blocks[bi]->name);
        assert_true(strcmp(s.p->blocks[bi]->name, "backward_layer_0") != 0);
        assert_true(strcmp(s.p->blocks[bi]->name, "backward_prologue") != 0);
    }
    assert_int_equal(s.p->n_blocks, 3); /* forward, head, backward_layer_1 */
    e2e_free_step(&s);
}

/* Defaults: automatic chunk sizes; the plan is verified and has no B*T*V buffer for B > 1. */
static void test_defaults(void **state)
{
    (void)state;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM};
    for (size_t i = 0; i < 3; i++) {
        e2e_step s;
        build(&s, cases[i].model, B, T, &o);
        print_message("  %s: automatic chunk %lld, logits chunk %lld\n", cases[i].model,
                      (long long)s.p->chunk, (long long)s.p->logits_chunk);
        assert_true(s.p->chunk >= 1 && s.p->chunk <= T);
        assert_true(s.p->logits_chunk >= 1 && s.p->logits_chunk <= T);
        check_plan(s.p);
        e2e_free_step(&s);
    }
}

static bool has_diag(const ir_diag *d, const char *needle)
{
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].msg && strstr(d->entries[i].msg, needle))
            return true;
    return false;
}

/* --memory-budget: too small fails naming the smallest budget that fits (the plan at chunk 1,
 * logits chunk 1); a budget picks chunks whose plan fits, the layer chunk the largest such;
 * a generous one gives whole sequences. */
static void test_memory_budget(void **state)
{
    (void)state;
    const char *model = "llama_op17_dyn.onnx";
    e2e_step s;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 1, .logits_chunk = 1};
    build(&s, model, B, T, &o);
    size_t smallest = sbp_train_planned_peak(s.p);
    e2e_free_step(&s);
    char want[64];
    snprintf(want, sizeof want, "needs %zu bytes", smallest);

    sbp_train_options b = {.strategy = SBP_STRATEGY_STREAM, .memory_budget = smallest - 1};
    sbp_objective chosen;
    memset(&s, 0, sizeof s);
    s.g = e2e_front(model, B, T, SBP_OBJECTIVE_SFT, &s.diag, &chosen);
    assert_null(sbp_train_build(s.g, chosen, &b));
    e2e_print_diag(&s.diag);
    assert_true(has_diag(&s.diag, want) && has_diag(&s.diag, "too small"));
    e2e_free_step(&s);

    const size_t budgets[] = {smallest, smallest + 30000, smallest + 60000, 1u << 30};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        b.memory_budget = budgets[i];
        build(&s, model, B, T, &b);
        size_t peak = sbp_train_planned_peak(s.p);
        print_message("  budget %zu: chunk %lld, logits chunk %lld, planned peak %zu\n",
                      budgets[i], (long long)s.p->chunk, (long long)s.p->logits_chunk, peak);
        assert_true(peak <= budgets[i]);
        int64_t c = s.p->chunk, l = s.p->logits_chunk;
        e2e_free_step(&s);
        if (c < T) { /* one more row per chunk does not fit */
            sbp_train_options bigger = {.strategy = SBP_STRATEGY_STREAM, .chunk = c + 1,
                                        .logits_chunk = l};
            build(&s, model, B, T, &bigger);
            assert_true(sbp_train_planned_peak(s.p) > budgets[i]);
            e2e_free_step(&s);
        }
        if (i == 3) {
            assert_int_equal(c, T);
            assert_int_equal(l, T);
        }
    }
}

/* ------------------------------------------------------------------ the verifier */

/* A program's first block with a loop group of two loops (full chunks + tail). */
static tp_block *tail_block(sbp_train_program *p, int *main_loop)
{
    for (int bi = 0; bi < p->n_blocks; bi++) {
        tp_block *blk = p->blocks[bi];
        for (int l = 0; l + 1 < blk->n_loops; l++)
            if (blk->loops[l].group == blk->loops[l + 1].group) {
                *main_loop = l;
                return blk;
            }
    }
    return NULL;
}

static void expect_broken(e2e_step *s, const char *needle)
{
    ir_diag d;
    ir_diag_init(&d, "verify");
    assert_int_equal(sbp_train_verify(s->p, &d), IR_ERR);
    if (!has_diag(&d, needle)) {
        e2e_print_diag(&d);
        print_message("  expected a diagnostic with '%s'\n", needle);
    }
    assert_true(has_diag(&d, needle));
    ir_diag_free(&d);
}

static void test_verifier(void **state)
{
    (void)state;
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17, .logits_chunk = 13};
    e2e_step s;
    build(&s, "llama_op17_dyn.onnx", B, T, &o);
    ir_diag d;
    ir_diag_init(&d, "verify");
    assert_int_equal(sbp_train_verify(s.p, &d), IR_OK);
    assert_int_equal(d.n, 0);
    ir_diag_free(&d);
    /* store and checkpoint programs (no loops) verify too */
    for (int k = 0; k < 2; k++) {
        e2e_step t;
        sbp_train_options so = {.strategy = k ? SBP_STRATEGY_CHECKPOINT : SBP_STRATEGY_STORE};
        build(&t, "qwen3_op17_dyn.onnx", B, T, &so);
        ir_diag_init(&d, "verify");
        assert_int_equal(sbp_train_verify(t.p, &d), IR_OK);
        ir_diag_free(&d);
        e2e_free_step(&t);
    }

    int l;
    tp_block *blk = tail_block(s.p, &l);
    assert_non_null(blk);
    tp_loop *full = &blk->loops[l], *tail = &blk->loops[l + 1];
    tp_loop keep_full = *full, keep_tail = *tail;
    /* the tail starting one row late: row 50 of every sequence is missed */
    tail->begin++;
    tail->stop++;
    expect_broken(&s, "misses rows [51, 52)");
    *tail = keep_tail;
    /* a step shorter than the chunks: rows run twice */
    full->step = 16;
    full->stop = 48;
    expect_broken(&s, "twice");
    *full = keep_full;
    /* the tail loop dropped: its rows are missing */
    tail->group = -1;
    expect_broken(&s, "covers rows [0, 51) of each sequence, not [0, 64)");
    *tail = keep_tail;
    /* the tail's chunk longer than what is left of the sequence */
    tail->len = tail->step = 14;
    expect_broken(&s, "runs past the sequence");
    *tail = keep_tail;
    /* a slice past the end of its buffer */
    tp_inst *in = NULL;
    int op = -1;
    for (int i = full->first; i < full->end && !in; i++)
        for (int j = 0; j < TP_MAX_BUFS; j++)
            if (blk->insts[i].off[j].per_row) {
                in = &blk->insts[i];
                op = j;
                break;
            }
    assert_non_null(in);
    int64_t keep = in->off[op].per_row;
    in->off[op].per_row = keep * 2;
    expect_broken(&s, "reaches element");
    in->off[op].per_row = keep;
    ir_diag_init(&d, "verify");
    assert_int_equal(sbp_train_verify(s.p, &d), IR_OK);
    ir_diag_free(&d);
    e2e_free_step(&s);
}

/* ------------------------------------------------------------------ refusal */

/* Embedding -> Transpose [B,D,T] -> Linear over T (mixes positions) -> Transpose back -> LM
 * head: stream refuses naming the Linear; checkpoint builds it. */
static ir_value *mk(ir_graph *g, ir_op op, const char *name, int n_in, ir_value **in,
                    const int64_t *perm)
{
    ir_value *out = ir_value_new(g, ir_arena_printf(g->arena, "%s_out", name), IR_VAL_NODE,
                                 IR_DT_UNDEFINED, -1, NULL);
    ir_node *n = ir_node_new_with_outputs(g, op, name, NULL, n_in, in, 1, &out);
    assert_non_null(n);
    if (perm)
        ir_attr_set_ints(g, n, "perm", perm, 3);
    assert_int_equal(ir_infer_node(g, n), IR_OK);
    return n->out[0];
}

static ir_graph *mixing_graph(ir_diag *d)
{
    ir_diag_init(d, "handmade");
    ir_graph *g = ir_graph_new(d, "handmade");
    ir_dim dims[2] = {{2, NULL}, {8, NULL}};
    ir_value *ids = ir_value_new(g, "input_ids", IR_VAL_INPUT, IR_DT_INT64, 2, dims);
    g->inputs = ir_arena_calloc(g->arena, 1, sizeof *g->inputs);
    g->inputs[0] = ids;
    g->n_inputs = 1;
    float w[256];
    for (int i = 0; i < 256; i++)
        w[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    ir_value *table = ir_const_new(g, "table", IR_DT_FLOAT, 2, (const int64_t[]){16, 4}, w);
    table->kind = IR_VAL_PARAM;
    ir_value *mix = ir_const_new(g, "time_mix", IR_DT_FLOAT, 2, (const int64_t[]){8, 8}, w + 7);
    mix->kind = IR_VAL_PARAM;
    ir_value *head = ir_const_new(g, "head", IR_DT_FLOAT, 2, (const int64_t[]){4, 16}, w + 3);
    head->kind = IR_VAL_PARAM;
    const int64_t p021[3] = {0, 2, 1};
    ir_value *x = mk(g, IR_OP_EMBEDDING, "embed", 2, (ir_value *[]){table, ids}, NULL);
    x = mk(g, IR_OP_TRANSPOSE, "to_time_last", 1, (ir_value *[]){x}, p021);
    x = mk(g, IR_OP_LINEAR, "the_time_mixer", 2, (ir_value *[]){x, mix}, NULL);
    x = mk(g, IR_OP_TRANSPOSE, "back", 1, (ir_value *[]){x}, p021);
    x = mk(g, IR_OP_LINEAR, "lm_head", 2, (ir_value *[]){x, head}, NULL);
    g->outputs = ir_arena_calloc(g->arena, 1, sizeof *g->outputs);
    g->outputs[0] = x;
    g->n_outputs = 1;
    x->is_output = true;
    assert_int_equal(ir_verify(g), IR_OK);
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    return g;
}

static void test_refuses_mixing(void **state)
{
    (void)state;
    ir_diag d;
    ir_graph *g = mixing_graph(&d);
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM};
    assert_null(sbp_train_build(g, SBP_OBJECTIVE_SFT, &o));
    e2e_print_diag(&d);
    bool found = false;
    for (int i = 0; i < d.n; i++)
        if (d.entries[i].node && strcmp(d.entries[i].node, "the_time_mixer") == 0 &&
            strstr(d.entries[i].msg, "stream: cannot run chunk by chunk") &&
            strstr(d.entries[i].msg, "sequence axis") &&
            strstr(d.entries[i].msg, "--strategy checkpoint"))
            found = true;
    assert_true(found);
    ir_graph_free(g);
    ir_diag_free(&d);

    g = mixing_graph(&d);
    o.strategy = SBP_STRATEGY_CHECKPOINT;
    assert_non_null(sbp_train_build(g, SBP_OBJECTIVE_SFT, &o));
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* ------------------------------------------------------------------ per-head scale 1 + w */

static ir_node *hm_node(ir_graph *g, ir_op op, const char *name, int n_in, ir_value **in)
{
    ir_value *out = ir_value_new(g, ir_arena_printf(g->arena, "%s_out", name), IR_VAL_NODE,
                                 IR_DT_UNDEFINED, -1, NULL);
    ir_node *n = ir_node_new_with_outputs(g, op, name, NULL, n_in, in, 1, &out);
    assert_non_null(n);
    return n;
}

static ir_value *hm_done(ir_graph *g, ir_node *n)
{
    assert_int_equal(ir_infer_node(g, n), IR_OK);
    return n->out[0];
}

/* Gemma-3's q norm as an export that keeps w writes it: q [B,H,T,hd] (a Transpose of the
 * projection's [B,T,H,hd], so stored [B,T,H,hd]) -> RMSNorm -> Mul(., Add(w, 1)) with w [hd] ->
 * Rope -> Attention (k = v = that Transpose) -> back to [B,T,D] -> + the embedding -> LM head. */
static ir_graph *head_scale_graph(ir_diag *d)
{
    enum { HB = 2, HT = 8, HH = 2, HD = 4, HV = 16 };
    ir_diag_init(d, "handmade");
    ir_graph *g = ir_graph_new(d, "handmade");
    ir_dim dims[2] = {{HB, NULL}, {HT, NULL}};
    ir_value *ids = ir_value_new(g, "input_ids", IR_VAL_INPUT, IR_DT_INT64, 2, dims);
    g->inputs = ir_arena_calloc(g->arena, 1, sizeof *g->inputs);
    g->inputs[0] = ids;
    g->n_inputs = 1;
    float w[256], cs[HT * HD], one = 1.0f;
    for (int i = 0; i < 256; i++)
        w[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (int i = 0; i < HT * HD; i++)
        cs[i] = (float)cos(0.1 * i);
    ir_value *table = ir_const_new(g, "table", IR_DT_FLOAT, 2, (const int64_t[]){HV, HH * HD}, w);
    ir_value *wq = ir_const_new(g, "wq", IR_DT_FLOAT, 2, (const int64_t[]){HH * HD, HH * HD}, w + 5);
    ir_value *norm_w = ir_const_new(g, "q_norm.weight", IR_DT_FLOAT, 1, (const int64_t[]){HD},
                                    w + 11);
    ir_value *head = ir_const_new(g, "head", IR_DT_FLOAT, 2, (const int64_t[]){HH * HD, HV}, w + 3);
    table->kind = wq->kind = norm_w->kind = head->kind = IR_VAL_PARAM;
    ir_value *c1 = ir_const_new(g, "one", IR_DT_FLOAT, 0, NULL, &one);
    ir_value *rc = ir_const_new(g, "rope_cos", IR_DT_FLOAT, 2, (const int64_t[]){HT, HD}, cs);
    ir_value *rs = ir_const_new(g, "rope_sin", IR_DT_FLOAT, 2, (const int64_t[]){HT, HD}, w + 1);
    const int64_t s4[4] = {HB, HT, HH, HD}, s3[3] = {HB, HT, HH * HD}, p0213[4] = {0, 2, 1, 3};
    ir_value *shape4 = ir_const_new(g, "shape4", IR_DT_INT64, 1, (const int64_t[]){4}, s4);
    ir_value *shape3 = ir_const_new(g, "shape3", IR_DT_INT64, 1, (const int64_t[]){3}, s3);

    ir_value *e = hm_done(g, hm_node(g, IR_OP_EMBEDDING, "embed", 2, (ir_value *[]){table, ids}));
    ir_value *x = hm_done(g, hm_node(g, IR_OP_LINEAR, "q_proj", 2, (ir_value *[]){e, wq}));
    x = hm_done(g, hm_node(g, IR_OP_RESHAPE, "heads", 2, (ir_value *[]){x, shape4}));
    ir_node *n = hm_node(g, IR_OP_TRANSPOSE, "to_bhtd", 1, (ir_value *[]){x});
    ir_attr_set_ints(g, n, "perm", p0213, 4);
    ir_value *q = hm_done(g, n);
    n = hm_node(g, IR_OP_RMS_NORM, "q_norm", 1, (ir_value *[]){q});
    ir_attr_set_float(g, n, "epsilon", 1e-6);
    ir_value *qn = hm_done(g, n);
    ir_value *scale = hm_done(g, hm_node(g, IR_OP_ADD, "one_plus_w", 2,
                                         (ir_value *[]){norm_w, c1}));
    ir_value *qs = hm_done(g, hm_node(g, IR_OP_MUL, "q_norm_scale", 2,
                                      (ir_value *[]){qn, scale}));
    ir_value *qr = hm_done(g, hm_node(g, IR_OP_ROPE, "q_rope", 3, (ir_value *[]){qs, rc, rs}));
    n = hm_node(g, IR_OP_ATTENTION, "attn", 3, (ir_value *[]){qr, q, q});
    ir_attr_set_int(g, n, "causal", 1);
    ir_attr_set_int(g, n, "kv_heads", HH);
    ir_attr_set_float(g, n, "scale", 0.5);
    x = hm_done(g, n);
    n = hm_node(g, IR_OP_TRANSPOSE, "to_bthd", 1, (ir_value *[]){x});
    ir_attr_set_ints(g, n, "perm", p0213, 4);
    x = hm_done(g, n);
    x = hm_done(g, hm_node(g, IR_OP_RESHAPE, "merge", 2, (ir_value *[]){x, shape3}));
    x = hm_done(g, hm_node(g, IR_OP_ADD, "residual", 2, (ir_value *[]){e, x}));
    x = hm_done(g, hm_node(g, IR_OP_LINEAR, "lm_head", 2, (ir_value *[]){x, head}));
    g->outputs = ir_arena_calloc(g->arena, 1, sizeof *g->outputs);
    g->outputs[0] = x;
    g->n_outputs = 1;
    x->is_output = true;
    assert_int_equal(ir_verify(g), IR_OK);
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    return g;
}

/* The scale multiplies the normalised q in the layout q is stored in ([B,T,H,hd]): no copy in
 * natural order, which stream could not slice by token rows for RoPE. Every strategy builds,
 * none with a relayout copy. */
static void test_head_norm_scale(void **state)
{
    (void)state;
    const sbp_strategy strategies[] = {SBP_STRATEGY_STREAM, SBP_STRATEGY_CHECKPOINT,
                                       SBP_STRATEGY_STORE};
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++) {
        ir_diag d;
        ir_graph *g = head_scale_graph(&d);
        sbp_train_options o = {.strategy = strategies[i], .chunk = 3};
        sbp_train_program *p = sbp_train_build(g, SBP_OBJECTIVE_SFT, &o);
        if (!p)
            e2e_print_diag(&d);
        assert_non_null(p);
        assert_int_equal(sbp_train_verify(p, &d), IR_OK);
        for (int b = 0; b < p->n_bufs; b++)
            if (p->bufs[b]->what && strstr(p->bufs[b]->what, "relayout"))
                fail_msg("%s: buffer %s is a relayout copy (%s)",
                         sbp_strategy_name(strategies[i]), p->bufs[b]->name, p->bufs[b]->what);
        ir_graph_free(g);
        ir_diag_free(&d);
    }
}

/* The generated C compiles without a warning under gcc and clang, tails and all. */
static void test_warnings(void **state)
{
    (void)state;
    const char *models[] = {"gpt2_op17_dyn.onnx", "qwen3_op17_dyn.onnx", "llama_op17_loss.onnx"};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 17,
                               .logits_chunk = m == 2 ? 1 : 13};
        e2e_step s;
        bool dyn = strstr(models[m], "dyn") != NULL;
        build(&s, models[m], dyn ? B : 0, dyn ? T : 0, &o);
        char stem[64];
        snprintf(stem, sizeof stem, "stream_warn_%zu", m);
        e2e_check_warnings(s.p, models[m], stem, &s.diag);
        e2e_free_step(&s);
    }
}

int main(int argc, char **argv)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verifier),
        cmocka_unit_test(test_refuses_mixing),
        cmocka_unit_test(test_head_norm_scale),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_memory_budget),
        cmocka_unit_test(test_warnings),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_graph_loss),
        cmocka_unit_test(test_gpt2_nofold),
        cmocka_unit_test(test_batch1),
        cmocka_unit_test(test_masked_chunks),
        cmocka_unit_test(test_frozen_prefix),
    };
    /* an optional name selects one test (a cmocka filter), e.g. `e2e_stream test_llama` */
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
