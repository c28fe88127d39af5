/* test_lora.c — sbpc --lora against float64 PEFT (tests/fixtures/lora/gen_lora.py).
 *
 * Each case compiles one of tests/fixtures/hf's exports through the flow with --lora 4
 * --lora-alpha 8 (scaling 2, so the scaling's Mul is exercised), the default targets, seed 0,
 * with the store strategy and with stream at chunk sizes that cut the sequence unevenly; builds
 * the step, and runs it on gen_hf's batch twice:
 *   - at the initial adapters (lora_A from ir_lora_init, lora_B zeros): the loss and every
 *     adapter gradient against PEFT's at sbpc's own A (lora_A's gradient is zero here: B
 *     multiplies it, so it is checked absolutely);
 *   - with lora_B set to test values (ir_lora_init with seed 12345 and B's shape, as the
 *     generator does), so that lora_A's gradient is not zero either.
 * Gradients within 1e-4 relative per tensor (||got - ref|| / ||ref||; a zero reference: the
 * absolute error against 1e-8 of the largest norm), losses within 1e-5. Also: every base
 * parameter is frozen (PEFT's semantics), the adapters have PEFT's names and shapes, and bad
 * input is an error with its message (rank above min(in, out), a target regex that matches
 * nothing, --freeze naming an adapter).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e_util.h"
#include "flow.h"
#include "torch.h"

#define LORA_B 2
#define LORA_T 32
#define TEST_B_SEED 12345

/* The flow with --lora rank (alpha 8, default targets unless `targets`, seed 0), store or
 * stream, the SFT objective on LORA_B rows; the caller frees f->g. */
static int lora_flow_opts(sbp_flow *f, ir_diag *d, const char *key, int64_t rank,
                          const char *targets, sbp_strategy st, const char *freeze,
                          int64_t batch, sbp_objective obj, const sbp_train_options *train)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/hf/%s.onnx", SBP_FIXTURES_DIR, key);
    static sbp_flow_options o;
    static const char *fr[1];
    fr[0] = freeze;
    o = (sbp_flow_options){.pass = {.batch = batch, .seq_len = LORA_T, .verify = true},
                           .objective = obj, .freeze = fr, .n_freeze = freeze != NULL,
                           .lora = {.rank = rank, .alpha = 8.0, .targets = targets, .seed = 0},
                           .train = *train};
    o.train.strategy = st;
    if (st == SBP_STRATEGY_STREAM) {
        o.train.chunk = 7;
        o.train.logits_chunk = 13;
    }
    *f = (sbp_flow){.path = path};
    ir_diag_init(d, path);
    return sbp_flow_run(f, &o, d, NULL);
}

static int lora_flow(sbp_flow *f, ir_diag *d, const char *key, int64_t rank,
                     const char *targets, sbp_strategy st, const char *freeze)
{
    sbp_train_options t = {0};
    return lora_flow_opts(f, d, key, rank, targets, st, freeze, LORA_B, SBP_OBJECTIVE_SFT, &t);
}

static bool diag_has(const ir_diag *d, const char *text)
{
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].sev == IR_SEV_ERROR && strstr(d->entries[i].msg, text))
            return true;
    return false;
}

/* The reference tensor `name` as doubles (the files hold F64 or F32); the caller frees it. */
static double *ref_data(const sbpio_st_file *ref, const char *name, int64_t n)
{
    char err[256];
    double *d = malloc((size_t)(n + 1) * sizeof *d);
    assert_non_null(d);
    if (sbpio_st_copy_f64(ref, name, d, n, err, sizeof err) != 0)
        fail_msg("%s", err);
    return d;
}

static double check_result(const e2e_step *s, sbp_step_args *a, const sbpio_st_file *ref,
                           const char *prefix, double want, const char *loss_key);

/* Runs the step at the current parameters; checks loss and adapter gradients against ref's
 * `prefix/<name>` and meta `loss_key`. Returns the worst gradient error. */
static double check_step(const e2e_step *s, float *params, const sbpio_st_file *ref,
                         const char *prefix, const char *loss_key, const char *fam)
{
    const sbp_step_info *in = s->info;
    float *grads = calloc(in->param_elems + 1, sizeof *grads);
    static int32_t ids[LORA_B * LORA_T], labels[LORA_B * LORA_T];
    char f1[256], f2[256];
    snprintf(f1, sizeof f1, "../hf/ref/%s_input_ids.npy", fam);
    snprintf(f2, sizeof f2, "../hf/ref/%s_labels.npy", fam);
    e2e_read_i32(f1, ids, LORA_B * LORA_T);
    e2e_read_i32(f2, labels, LORA_B * LORA_T);
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = ids, .labels = labels};
    double worst = check_result(s, &a, ref, prefix, strtod(sbpio_st_meta(ref, loss_key), NULL),
                                loss_key);
    free(grads);
    return worst;
}

/* Runs the step with args a (grads sized by the caller); checks its loss against want and
 * every adapter gradient against ref's `prefix/<name>`. Returns the worst gradient error. */
static double check_result(const e2e_step *s, sbp_step_args *a, const sbpio_st_file *ref,
                           const char *prefix, double want, const char *loss_key)
{
    const sbp_step_info *in = s->info;
    float *grads = a->grads;
    double loss = e2e_run(s, a, true);
    double le = fabs(loss - want) / fabs(want);
    print_message("  %s: loss %.7f, PEFT float64 %.9f (relative %.2g)\n", loss_key, loss, want, le);
    assert_true(le <= 1e-5);
    /* the scale: the largest reference norm of this set */
    double scale = 0;
    for (int i = 0; i < sbpio_st_count(ref); i++) {
        const sbpio_st_info *r = sbpio_st_at(ref, i);
        if (strncmp(r->name, prefix, strlen(prefix)) != 0 || r->name[strlen(prefix)] != '/')
            continue;
        double *rd = ref_data(ref, r->name, r->numel), s2 = 0;
        for (int64_t k = 0; k < r->numel; k++)
            s2 += rd[k] * rd[k];
        scale = fmax(scale, sqrt(s2));
        free(rd);
    }
    double worst = 0;
    int n_adapters = 0;
    size_t adapter_elems = 0;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (!ir_lora_kind(p->name)) {
            assert_int_equal(p->trainable, 0); /* the base model is frozen */
            continue;
        }
        assert_int_equal(p->trainable, 1);
        char key[512];
        snprintf(key, sizeof key, "%s/%s", prefix, p->name);
        const sbpio_st_info *r = sbpio_st_find(ref, key);
        if (!r)
            fail_msg("no reference for %s", key);
        assert_int_equal(r->numel, (int64_t)p->numel);
        assert_int_equal(r->rank, p->rank);
        for (int d = 0; d < p->rank; d++)
            assert_int_equal(r->shape[d], p->dims[d]); /* PEFT's layout */
        double *g = malloc(p->numel * sizeof *g);
        e2e_grad_of(in, grads, i, g);
        double *rd = ref_data(ref, key, r->numel);
        double num = 0, den = 0;
        for (size_t k = 0; k < p->numel; k++) {
            num += (g[k] - rd[k]) * (g[k] - rd[k]);
            den += rd[k] * rd[k];
        }
        double e = sqrt(num) / fmax(sqrt(den), 1e-4 * scale);
        if (!(e <= 1e-4))
            print_message("    %s: relative error %.3g\n", p->name, e);
        worst = fmax(worst, e);
        n_adapters++;
        adapter_elems += p->numel;
        free(g);
        free(rd);
    }
    /* the frozen base model has no gradient block and so no optimizer state: the step's
     * gradient block is the adapters' */
    assert_int_equal(in->grad_elems, adapter_elems);
    print_message("  %s: %d adapter gradients, worst relative error %.3g\n", prefix, n_adapters,
                  worst);
    assert_true(n_adapters > 0);
    assert_true(worst <= 1e-4);
    return worst;
}

/* lora_B at its test values: ir_lora_init of the matching lora_A name, seed TEST_B_SEED, B's
 * shape (gen_lora.py's test_b). */
static void set_test_b(const sbp_step_info *in, float *params)
{
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (ir_lora_kind(p->name) != 'B')
            continue;
        char a_name[512];
        size_t n = strlen(p->name) - strlen(IR_LORA_B_SUFFIX);
        snprintf(a_name, sizeof a_name, "%.*s%s", (int)n, p->name, IR_LORA_A_SUFFIX);
        ir_lora_init(a_name, TEST_B_SEED, p->dims[0], p->dims[1], params + p->offset);
    }
}

static void run_case(const char *key, const char *fam, sbp_strategy st)
{
    char ref_path[1024], err[256], tag[128];
    snprintf(ref_path, sizeof ref_path, "%s/lora/ref/%s.safetensors", SBP_FIXTURES_DIR, fam);
    sbpio_st_file *ref = NULL;
    if (sbpio_st_open(ref_path, &ref, err, sizeof err) != 0)
        fail_msg("%s", err);
    sbp_flow f;
    ir_diag d;
    int rc = lora_flow(&f, &d, key, 4, NULL, st, NULL);
    if (rc != IR_OK)
        e2e_print_diag(&d);
    assert_int_equal(rc, IR_OK);
    e2e_step s = {.g = f.g};
    snprintf(tag, sizeof tag, "lora_%s_%s", key, sbp_strategy_name(st));
    e2e_load_so(&s, f.program, f.path, tag, &d);
    float *params = e2e_param_block(s.info, f.g);
    print_message("%s (%s): %d adapted weights\n", key, sbp_strategy_name(st), f.n_adapted);
    check_step(&s, params, ref, "grad0", "loss0", fam);
    set_test_b(s.info, params); /* lora_A's gradient is no longer zero */
    check_step(&s, params, ref, "grad", "loss", fam);
    free(params);
    e2e_free_step(&s); /* frees f.g */
    ir_diag_free(&d);
    sbpio_st_close(ref);
}

static void test_llama_scoped_store(void **st) { (void)st; run_case("llama_dynamo_scoped", "llama", SBP_STRATEGY_STORE); }
static void test_llama_scoped_stream(void **st) { (void)st; run_case("llama_dynamo_scoped", "llama", SBP_STRATEGY_STREAM); }
static void test_qwen3_ts_store(void **st) { (void)st; run_case("qwen3_ts_eager", "qwen3", SBP_STRATEGY_STORE); }
static void test_qwen3_ts_stream(void **st) { (void)st; run_case("qwen3_ts_eager", "qwen3", SBP_STRATEGY_STREAM); }
static void test_gpt2_store(void **st) { (void)st; run_case("gpt2_dynamo_eager", "gpt2", SBP_STRATEGY_STORE); }
static void test_gpt2_stream(void **st) { (void)st; run_case("gpt2_dynamo_eager", "gpt2", SBP_STRATEGY_STREAM); }

/* ------------------------------------------------------------------ DPO, GRPO, --packed */

/* The batches and objective inputs stored in the reference (F32; ids exact). */
static void ref_i32(const sbpio_st_file *ref, const char *name, int32_t *dst, int64_t n)
{
    double *d = ref_data(ref, name, n);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int32_t)d[i];
    free(d);
}

static void ref_f32(const sbpio_st_file *ref, const char *name, float *dst, int64_t n)
{
    double *d = ref_data(ref, name, n);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)d[i];
    free(d);
}

typedef struct obj_case {
    const char *name; /* reference set <name>/<adapter> and metadata <name>_loss */
    sbp_objective obj;
    sbp_grpo_norm norm;
    bool packed;
} obj_case;

static const obj_case obj_cases[] = {
    {"dpo", SBP_OBJECTIVE_DPO, SBP_GRPO_NORM_SEQUENCE, false},
    {"grpo_seq", SBP_OBJECTIVE_GRPO, SBP_GRPO_NORM_SEQUENCE, false},
    {"grpo_token", SBP_OBJECTIVE_GRPO, SBP_GRPO_NORM_TOKEN, false},
    {"packed", SBP_OBJECTIVE_SFT, SBP_GRPO_NORM_SEQUENCE, true},
    {"packed_dpo", SBP_OBJECTIVE_DPO, SBP_GRPO_NORM_SEQUENCE, true},
};

/* One objective case: the step compiled with --lora 4 and the case's objective (--packed),
 * at A0 and the test B, on the reference's batch and inputs; the loss and every adapter
 * gradient against PEFT's (tests/fixtures/lora/gen_lora_obj.py). */
static void run_obj_case(const char *key, const char *fam, const obj_case *c, sbp_strategy st)
{
    char ref_path[1024], err[256], tag[160], loss_key[64];
    snprintf(ref_path, sizeof ref_path, "%s/lora/ref/%s_objectives.safetensors",
             SBP_FIXTURES_DIR, fam);
    sbpio_st_file *ref = NULL;
    if (sbpio_st_open(ref_path, &ref, err, sizeof err) != 0)
        fail_msg("%s", err);
    bool dpo = c->obj == SBP_OBJECTIVE_DPO, grpo = c->obj == SBP_OBJECTIVE_GRPO;
    int64_t b = c->obj == SBP_OBJECTIVE_SFT ? 2 : 4, n = b * LORA_T;
    sbp_train_options t = {.grpo_norm = c->norm, .packed = c->packed};
    if (dpo)
        t.beta = strtod(sbpio_st_meta(ref, "beta_dpo"), NULL);
    if (grpo) {
        t.beta = strtod(sbpio_st_meta(ref, "beta_grpo"), NULL);
        t.epsilon = strtod(sbpio_st_meta(ref, "epsilon"), NULL);
    }
    sbp_flow f;
    ir_diag d;
    int rc = lora_flow_opts(&f, &d, key, 4, NULL, st, NULL, b, c->obj, &t);
    if (rc != IR_OK)
        e2e_print_diag(&d);
    assert_int_equal(rc, IR_OK);
    e2e_step s = {.g = f.g};
    snprintf(tag, sizeof tag, "lora_%s_%s_%s", key, c->name, sbp_strategy_name(st));
    e2e_load_so(&s, f.program, f.path, tag, &d);
    assert_string_equal(s.info->objective, sbp_objective_name(c->obj));
    assert_int_equal(s.info->packed, c->packed);
    float *params = e2e_param_block(s.info, f.g);
    set_test_b(s.info, params);
    int32_t ids[4 * LORA_T], labels[4 * LORA_T], docs[4 * LORA_T];
    float dpo_ref[4], adv[4], old[4 * LORA_T], gref[4 * LORA_T];
    if (c->obj == SBP_OBJECTIVE_SFT) {
        ref_i32(ref, "input/packed_ids", ids, n);
        ref_i32(ref, "input/packed_labels", labels, n);
        ref_i32(ref, "input/packed_docs", docs, n);
    } else {
        ref_i32(ref, "input/pref_ids", ids, n);
        ref_i32(ref, c->packed ? "input/pref_packed_labels" : "input/pref_labels", labels, n);
        ref_i32(ref, "input/pref_docs", docs, n);
        ref_f32(ref, "input/dpo_ref", dpo_ref, 4);
        ref_f32(ref, "input/grpo_adv", adv, 4);
        ref_f32(ref, "input/grpo_old", old, n);
        ref_f32(ref, "input/grpo_ref", gref, n);
    }
    float *grads = calloc(s.info->param_elems + 1, sizeof *grads);
    sbp_step_args a = {.params = params, .grads = grads, .input_ids = ids, .labels = labels,
                       .ref_logps = dpo ? dpo_ref : grpo ? gref : NULL,
                       .old_logps = grpo ? old : NULL, .advantages = grpo ? adv : NULL,
                       .doc_ids = c->packed ? docs : NULL};
    print_message("%s (%s), %s: %d adapted weights\n", key, sbp_strategy_name(st), c->name,
                  f.n_adapted);
    snprintf(loss_key, sizeof loss_key, "%s_loss", c->name);
    check_result(&s, &a, ref, c->name, strtod(sbpio_st_meta(ref, loss_key), NULL), loss_key);
    free(grads);
    free(params);
    e2e_free_step(&s);
    ir_diag_free(&d);
    sbpio_st_close(ref);
}

static void run_obj_cases(const char *key, const char *fam, sbp_strategy st)
{
    for (size_t i = 0; i < sizeof obj_cases / sizeof obj_cases[0]; i++)
        run_obj_case(key, fam, &obj_cases[i], st);
}

static void test_llama_objectives_store(void **st) { (void)st; run_obj_cases("llama_dynamo_scoped", "llama", SBP_STRATEGY_STORE); }
static void test_llama_objectives_stream(void **st) { (void)st; run_obj_cases("llama_dynamo_scoped", "llama", SBP_STRATEGY_STREAM); }

/* The adapters' initial values are the documented generator's: lora_A in PEFT's bound, the
 * same for the same name and seed, lora_B zeros. */
static void test_init(void **st)
{
    (void)st;
    float a[4 * 16], b[4 * 16], z[16 * 4];
    ir_lora_init("m.q.lora_A.weight", 0, 4, 16, a);
    ir_lora_init("m.q.lora_A.weight", 0, 4, 16, b);
    assert_memory_equal(a, b, sizeof a);
    ir_lora_init("m.q.lora_A.weight", 1, 4, 16, b);
    assert_memory_not_equal(a, b, sizeof a);
    double lo = 1, hi = -1;
    for (int i = 0; i < 64; i++) {
        lo = fmin(lo, a[i]);
        hi = fmax(hi, a[i]);
    }
    assert_true(lo >= -0.25 && hi < 0.25 && hi - lo > 0.3); /* U(-1/sqrt(16), 1/sqrt(16)) */
    ir_lora_init("m.q.lora_B.weight", 0, 16, 4, z);
    for (int i = 0; i < 64; i++)
        assert_true(z[i] == 0.0f);
}

static void expect_error(const char *key, int64_t rank, const char *targets, const char *freeze,
                         const char *text)
{
    sbp_flow f;
    ir_diag d;
    int rc = lora_flow(&f, &d, key, rank, targets, SBP_STRATEGY_STORE, freeze);
    if (rc == IR_OK || !diag_has(&d, text)) {
        e2e_print_diag(&d);
        fail_msg("expected an error containing '%s'", text);
    }
    ir_graph_free(f.g);
    ir_diag_free(&d);
}

static void test_errors(void **st)
{
    (void)st;
    /* hidden 16, kv projections 16 -> 8: rank 9 exceeds min(in, out) of k_proj */
    expect_error("llama_ts_eager", 9, NULL, NULL, "exceeds min(in, out) = min(16, 8)");
    expect_error("llama_ts_eager", 4, "no_such_module", NULL,
                 "--lora-targets 'no_such_module' matches no Linear weight");
    expect_error("llama_ts_eager", 4, "(", NULL, "--lora-targets '('");
    expect_error("llama_ts_eager", 4, NULL, "q_proj.lora_A",
                 "freezes the LoRA adapter 'model.layers.0.self_attn.q_proj.lora_A.weight'");
    /* a dynamo export without node scopes cannot name its renamed weights */
    expect_error("llama_dynamo_eager", 4, NULL, NULL, "without a recoverable PyTorch name");
}

/* A custom regex adapts only what it names; the tied / untied LM head and the embedding never
 * by default. */
static void test_targets(void **st)
{
    (void)st;
    sbp_flow f;
    ir_diag d;
    assert_int_equal(lora_flow(&f, &d, "llama_ts_eager", 2, "\\.q_proj\\.weight$",
                               SBP_STRATEGY_STORE, NULL), IR_OK);
    assert_int_equal(f.n_adapted, 2);
    assert_non_null(ir_value_find(f.g, "model.layers.1.self_attn.q_proj.lora_B.weight"));
    assert_null(ir_value_find(f.g, "model.layers.1.self_attn.k_proj.lora_A.weight"));
    ir_graph_free(f.g);
    ir_diag_free(&d);
    assert_int_equal(lora_flow(&f, &d, "gpt2_ts_eager", 2, NULL, SBP_STRATEGY_STORE, NULL),
                     IR_OK);
    assert_int_equal(f.n_adapted, 8); /* c_attn, attn.c_proj, c_fc, mlp.c_proj x 2 layers */
    for (int i = 0; i < f.g->n_values; i++)
        assert_null(strstr(f.g->values[i]->name, "wte.lora"));
    ir_graph_free(f.g);
    ir_diag_free(&d);
}

int main(void)
{
    e2e_init();
    if (sbprt_ctx_create(&e2e_ctx, 2) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_targets),
        cmocka_unit_test(test_llama_scoped_store),
        cmocka_unit_test(test_llama_scoped_stream),
        cmocka_unit_test(test_qwen3_ts_store),
        cmocka_unit_test(test_qwen3_ts_stream),
        cmocka_unit_test(test_gpt2_store),
        cmocka_unit_test(test_gpt2_stream),
        cmocka_unit_test(test_llama_objectives_store),
        cmocka_unit_test(test_llama_objectives_stream),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(e2e_ctx);
    return rc;
}
