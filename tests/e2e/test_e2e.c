/* test_e2e.c — the compiled training step against PyTorch.
 *
 * For each fixture family (GPT-2, Llama, Qwen3 exported with symbolic dims and bound to B=2,
 * T=64; Llama exported with its loss in the graph; GPT-2 without constant folding, whose tied
 * head stays a Transpose) the model goes through the library exactly as `sbpc -o x.so` does:
 * import, canonicalise, objective, training program (store and checkpoint), C, compiled with
 * -Werror into a shared object, dlopen'd. One step on tests/fixtures/ref/<family>_{input_ids,
 * labels}.npy must give the loss and every parameter gradient of the float64 PyTorch reference
 * (ref/<family>_grads.safetensors): loss relative error <= 1e-5, per tensor
 * ||g - g_ref|| / ||g_ref|| <= 1e-4. The references are keyed by the initializer names of
 * <family>_op17_static.onnx; the dyn and loss exports name their folded weights differently,
 * so parameters are matched to reference names by value (same shape, same bytes: the files
 * hold identical weights). store and checkpoint must agree. The workspace is allocated with
 * exactly the size the step reports, so under AddressSanitizer an undersized plan fails.
 *
 * Also: the generated C compiles without warnings under gcc and clang (-Wall -Wextra
 * -Wpedantic -Werror); --freeze; gradient accumulation and the denominator argument; and an
 * op with no gradient rule is a compile error naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codegen.h"
#include "ir.h"
#include "passes.h"
#include "sbp_step.h"
#include "sbpio.h"
#include "sbprt.h"
#include "train.h"

#define B 2
#define T 64
#define GRAD_TOL 1e-4
#define LOSS_TOL 1e-5

static sbprt_ctx *ctx;

/* ------------------------------------------------------------------ compiling */

typedef struct step {
    ir_diag diag;
    ir_graph *g;                 /* the compiled graph (parameter data) */
    void *lib;
    const sbp_step_info *info;
    int (*run)(sbprt_ctx *, const sbp_step_args *);
} step;

static const char *fixture(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    if (snprintf(buf[k], sizeof buf[k], "%s/%s", SBP_FIXTURES_DIR, name) >= (int)sizeof buf[k])
        fail_msg("fixture path too long: %s", name);
    return buf[k];
}

/* The canonical graph of a model with its objective: the common front of every test. */
static ir_graph *front(const char *model, int64_t b, int64_t t, ir_diag *d,
                       sbp_objective *chosen)
{
    ir_diag_init(d, model);
    ir_graph *g = ir_import_onnx(fixture(model), d, NULL);
    assert_non_null(g);
    sbp_pass_options po = {.batch = b, .seq_len = t, .verify = true};
    assert_int_equal(sbp_canonicalize(g, &po, NULL), IR_OK);
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_SFT, chosen), IR_OK);
    return g;
}

static void print_diag(const ir_diag *d)
{
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].sev == IR_SEV_ERROR)
            print_message("  %s\n", d->entries[i].msg);
}

static void compile_step(step *s, const char *model, int64_t b, int64_t t, sbp_strategy st,
                         const char *freeze, const char *tag)
{
    memset(s, 0, sizeof *s);
    sbp_objective chosen;
    s->g = front(model, b, t, &s->diag, &chosen);
    if (freeze)
        assert_int_equal(sbp_freeze_params(s->g, freeze, NULL), IR_OK);
    sbp_train_options to = {.strategy = st};
    sbp_train_program *p = sbp_train_build(s->g, chosen, &to);
    if (!p)
        print_diag(&s->diag);
    assert_non_null(p);
    char so[1024];
    snprintf(so, sizeof so, "%s/%s.so", SBP_E2E_OUT, tag);
    if (sbp_codegen_write(p, so, model, "-Werror", &s->diag) != IR_OK)
        print_diag(&s->diag);
    assert_int_equal(s->diag.n_errors, 0);
    s->lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!s->lib)
        print_message("dlopen: %s\n", dlerror());
    assert_non_null(s->lib);
    const sbp_step_info *(*get_info)(void);
    *(void **)&get_info = dlsym(s->lib, "sbp_step_get_info");
    *(void **)&s->run = dlsym(s->lib, "sbp_step_run");
    assert_non_null(get_info);
    assert_non_null(s->run);
    s->info = get_info();
    assert_int_equal(s->info->abi_version, SBP_STEP_ABI_VERSION);
    assert_int_equal(s->info->batch, b ? b : B);
    assert_int_equal(s->info->seq_len, t ? t : T);
    assert_string_equal(s->info->strategy, sbp_strategy_name(st));
}

static void free_step(step *s)
{
    if (s->lib)
        dlclose(s->lib);
    ir_graph_free(s->g);
    ir_diag_free(&s->diag);
}

/* The parameter block filled from the model's initializers. */
static float *param_block(const step *s)
{
    float *p = calloc(s->info->param_elems + 1, sizeof *p);
    assert_non_null(p);
    for (int i = 0; i < s->info->n_params; i++) {
        const sbp_step_param *q = &s->info->params[i];
        if (q->tied_to >= 0)
            continue;
        const ir_value *v = ir_value_find(s->g, q->name);
        assert_non_null(v);
        assert_int_equal(v->nbytes, q->numel * sizeof(float));
        memcpy(p + q->offset, v->data, v->nbytes);
    }
    return p;
}

typedef struct batch {
    int32_t ids[B * T], labels[B * T];
} batch;

static void load_batch(const char *family, batch *bt)
{
    const char *what[2] = {"input_ids", "labels"};
    int32_t *dst[2] = {bt->ids, bt->labels};
    for (int k = 0; k < 2; k++) {
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/ref/%s_%s.npy", SBP_FIXTURES_DIR, family, what[k]);
        sbpio_array a;
        if (sbpio_npy_read_i32(path, &a, err, sizeof err) != 0)
            print_message("%s\n", err);
        assert_int_equal(a.numel, B * T);
        memcpy(dst[k], a.data, sizeof(int32_t) * B * T);
        sbpio_array_free(&a);
    }
}

/* Runs one step; returns the loss. grads must hold param_elems floats. */
static double run_step(const step *s, const float *params, float *grads, const batch *bt,
                       int accumulate, double denominator, int64_t *n_scored)
{
    size_t wsb = s->info->workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_non_null(ws);
    memset(ws, 0xff, wsb); /* garbage: the step must not rely on zeroed memory */
    double loss = NAN;
    sbp_step_args a = {
        .params = params,
        .grads = grads,
        .accumulate = accumulate,
        .input_ids = bt->ids,
        .labels = bt->labels,
        .denominator = denominator,
        .workspace = ws,
        .loss = &loss,
        .n_scored = n_scored,
    };
    int rc = s->run(ctx, &a);
    if (rc)
        print_message("sbp_step_run: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    free(ws);
    return loss;
}

/* ------------------------------------------------------------------ the reference */

typedef struct reference {
    ir_diag diag;
    ir_graph *g;            /* <family>_op17_static.onnx: the names the references use */
    sbpio_st_file *st;
    double loss;
    batch bt;
} reference;

static void load_reference(reference *r, const char *family)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s_op17_static.onnx", family);
    ir_diag_init(&r->diag, path);
    r->g = ir_import_onnx(fixture(path), &r->diag, NULL);
    assert_non_null(r->g);
    snprintf(path, sizeof path, "%s/ref/%s_grads.safetensors", SBP_FIXTURES_DIR, family);
    if (sbpio_st_open(path, &r->st, err, sizeof err) != 0)
        print_message("%s\n", err);
    assert_non_null(r->st);
    const char *l = sbpio_st_meta(r->st, "loss");
    assert_non_null(l);
    r->loss = strtod(l, NULL);
    load_batch(family, &r->bt);
}

static void free_reference(reference *r)
{
    sbpio_st_close(r->st);
    ir_graph_free(r->g);
    ir_diag_free(&r->diag);
}

/* The reference name of a parameter: the static model's initializer with the same bytes. */
static const char *ref_name(const reference *r, const ir_value *v)
{
    for (int i = 0; i < r->g->n_values; i++) {
        const ir_value *w = r->g->values[i];
        if (w->kind == IR_VAL_PARAM && w->nbytes == v->nbytes && w->rank == v->rank &&
            memcmp(w->data, v->data, v->nbytes) == 0) {
            bool same = true;
            for (int k = 0; k < v->rank; k++)
                same = same && w->dims[k].value == v->dims[k].value;
            if (same)
                return w->name;
        }
    }
    return NULL;
}

/* Parameter i's gradient in its own layout (a tied copy's is its owner's, transposed). */
static void grad_of(const step *s, const float *grads, int i, double *out)
{
    const sbp_step_param *q = &s->info->params[i];
    if (q->tied_to < 0) {
        for (size_t k = 0; k < q->numel; k++)
            out[k] = grads[q->offset + k];
        return;
    }
    const sbp_step_param *o = &s->info->params[q->tied_to];
    int64_t m = o->dims[0], n = o->dims[1];
    for (int64_t a = 0; a < n; a++)
        for (int64_t b = 0; b < m; b++)
            out[a * m + b] = grads[o->offset + (size_t)(b * n + a)];
}

/* Compares the loss and every gradient; returns the largest relative gradient error.
 * all_refs: every reference tensor must belong to a parameter. frozen_re: parameters expected
 * frozen (zero gradient) are those whose info row says so. */
static double check_against_reference(const step *s, const reference *r, const float *grads,
                                      double loss, bool all_refs, const char *label)
{
    double lerr = fabs(loss - r->loss) / fabs(r->loss);
    print_message("  %-28s loss %.9f (ref %.9f, rel err %.2e)\n", label, loss, r->loss, lerr);
    assert_true(lerr <= LOSS_TOL);
    double worst = 0;
    const char *worst_name = "";
    int matched = 0;
    for (int i = 0; i < s->info->n_params; i++) {
        const sbp_step_param *q = &s->info->params[i];
        const ir_value *v = ir_value_find(s->g, q->name);
        assert_non_null(v);
        const char *rn = ref_name(r, v);
        if (!rn)
            print_message("  no reference for parameter '%s'\n", q->name);
        assert_non_null(rn);
        double *ref = malloc(q->numel * sizeof *ref), *got = malloc(q->numel * sizeof *got);
        assert_true(ref && got);
        char err[256];
        if (sbpio_st_copy_f64(r->st, rn, ref, (int64_t)q->numel, err, sizeof err) != 0)
            print_message("  %s\n", err);
        matched++;
        grad_of(s, grads, i, got);
        double num = 0, den = 0;
        for (size_t k = 0; k < q->numel; k++) {
            num += (got[k] - ref[k]) * (got[k] - ref[k]);
            den += ref[k] * ref[k];
        }
        if (!q->trainable) {
            for (size_t k = 0; k < q->numel; k++)
                assert_true(got[k] == 0.0);
        } else {
            double rel = sqrt(num) / sqrt(den);
            if (!(rel <= GRAD_TOL))
                print_message("  %s (ref %s): rel err %.3e\n", q->name, rn, rel);
            assert_true(rel <= GRAD_TOL);
            if (rel > worst) {
                worst = rel;
                worst_name = q->name;
            }
        }
        free(ref);
        free(got);
    }
    if (all_refs)
        assert_int_equal(matched, sbpio_st_count(r->st));
    print_message("  %-28s %d parameters, max gradient rel err %.2e (%s)\n", label, matched,
                  worst, worst_name);
    return worst;
}

/* ------------------------------------------------------------------ the family tests */

typedef struct family_case {
    const char *model;   /* fixture file */
    const char *family;  /* reference prefix */
    int64_t b, t;        /* bindings (0: static) */
    bool all_refs;       /* the model has a parameter for every reference tensor */
    const char *objective;
} family_case;

static void run_family(const family_case *fc)
{
    reference r;
    load_reference(&r, fc->family);
    step st[2];
    float *grads[2];
    double loss[2];
    const sbp_strategy strategies[2] = {SBP_STRATEGY_STORE, SBP_STRATEGY_CHECKPOINT};
    for (int k = 0; k < 2; k++) {
        char tag[256];
        snprintf(tag, sizeof tag, "%s_%s", fc->model, sbp_strategy_name(strategies[k]));
        char *dot = strstr(tag, ".onnx");
        if (dot)
            memmove(dot, dot + 5, strlen(dot + 5) + 1);
        compile_step(&st[k], fc->model, fc->b, fc->t, strategies[k], NULL, tag);
        assert_string_equal(st[k].info->objective, fc->objective);
        float *params = param_block(&st[k]);
        grads[k] = malloc((st[k].info->param_elems + 1) * sizeof(float));
        for (size_t i = 0; i < st[k].info->param_elems; i++)
            grads[k][i] = NAN; /* accumulate = 0 must overwrite */
        int64_t n_scored = -1;
        loss[k] = run_step(&st[k], params, grads[k], &r.bt, 0, 0, &n_scored);
        assert_int_equal(n_scored, B * T - 5 - 7); /* the fixture's ignored positions */
        print_message("  %s: workspace %zu bytes\n", tag, st[k].info->workspace_bytes);
        check_against_reference(&st[k], &r, grads[k], loss[k], fc->all_refs, tag);
        free(params);
    }
    /* store and checkpoint: the same computation, segment by segment */
    assert_int_equal(st[0].info->param_elems, st[1].info->param_elems);
    assert_true(fabs(loss[0] - loss[1]) <= 1e-7 * fabs(loss[0]));
    double worst = 0;
    for (int i = 0; i < st[0].info->n_params; i++) {
        const sbp_step_param *q = &st[0].info->params[i];
        if (q->tied_to >= 0)
            continue;
        double num = 0, den = 0;
        for (size_t k = 0; k < q->numel; k++) {
            double d = (double)grads[0][q->offset + k] - grads[1][q->offset + k];
            num += d * d;
            den += (double)grads[0][q->offset + k] * grads[0][q->offset + k];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        worst = rel > worst ? rel : worst;
    }
    print_message("  store vs checkpoint: max rel difference %.2e; workspace %zu -> %zu bytes\n",
                  worst, st[0].info->workspace_bytes, st[1].info->workspace_bytes);
    assert_true(worst <= 1e-6);
    assert_true(st[1].info->workspace_bytes < st[0].info->workspace_bytes);
    for (int k = 0; k < 2; k++) {
        free(grads[k]);
        free_step(&st[k]);
    }
    free_reference(&r);
}

static const family_case cases[] = {
    {"gpt2_op17_dyn.onnx", "gpt2", B, T, true, "sft"},
    {"llama_op17_dyn.onnx", "llama", B, T, true, "sft"},
    {"qwen3_op17_dyn.onnx", "qwen3", B, T, true, "sft"},
    {"llama_op17_loss.onnx", "llama", 0, 0, true, "graph-loss"},
    /* the tie survives as Transpose(wte): no MatMul copy, so not every reference is used */
    {"gpt2_op17_dyn_nofold.onnx", "gpt2", B, T, false, "sft"},
    {"qwen3_op14_static.onnx", "qwen3", 0, 0, true, "sft"},
    {"llama_op17_static.onnx", "llama", 0, 0, true, "sft"},
};

static void test_gpt2(void **state) { (void)state; run_family(&cases[0]); }
static void test_llama(void **state) { (void)state; run_family(&cases[1]); }
static void test_qwen3(void **state) { (void)state; run_family(&cases[2]); }
static void test_llama_graph_loss(void **state) { (void)state; run_family(&cases[3]); }
static void test_gpt2_nofold(void **state) { (void)state; run_family(&cases[4]); }
static void test_qwen3_op14(void **state) { (void)state; run_family(&cases[5]); }

/* Every constant (the RoPE tables) in the side file PATH.consts.bin, assembled in by .incbin,
 * as long sequences need: the same gradients as inline arrays. */
static void test_constants_file(void **state)
{
    (void)state;
    sbp_codegen_set_blob_min_bytes(1);
    run_family(&cases[6]);
    sbp_codegen_set_blob_min_bytes(64u << 10);
    char path[1024];
    snprintf(path, sizeof path, "%s/llama_op17_static_store.consts.bin", SBP_E2E_OUT);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    assert_true(n >= (long)(2 * T * 4 * sizeof(float))); /* cos and sin, [T, head_dim 4] */
}

/* ------------------------------------------------------------------ other properties */

/* --freeze: matching parameters get trainable = 0 and a zero gradient; the others are as
 * before (a frozen parameter changes no other gradient). Freezing a tied pair by either name
 * freezes both rows. */
static void test_freeze(void **state)
{
    (void)state;
    reference r;
    load_reference(&r, "gpt2");
    step s;
    compile_step(&s, "gpt2_op17_dyn.onnx", B, T, SBP_STRATEGY_STORE, "ln_f|wpe|wte",
                 "gpt2_frozen");
    int frozen = 0;
    for (int i = 0; i < s.info->n_params; i++) {
        const char *n = s.info->params[i].name;
        bool want = strstr(n, "ln_f") || strstr(n, "wpe") || strstr(n, "wte") ||
                    s.info->params[i].tied_to >= 0;
        assert_int_equal(s.info->params[i].trainable, want ? 0 : 1);
        frozen += want;
    }
    assert_int_equal(frozen, 5);
    float *params = param_block(&s), *grads = malloc(s.info->param_elems * sizeof(float));
    double loss = run_step(&s, params, grads, &r.bt, 0, 0, NULL);
    check_against_reference(&s, &r, grads, loss, true, "gpt2 frozen");
    free(params);
    free(grads);
    free_step(&s);

    /* a bad regular expression is a diagnostic, not a crash */
    ir_diag d;
    sbp_objective chosen;
    ir_graph *g = front("gpt2_op17_dyn.onnx", B, T, &d, &chosen);
    assert_int_equal(sbp_freeze_params(g, "(unclosed", NULL), IR_ERR);
    assert_true(d.n_errors > 0);
    ir_graph_free(g);
    ir_diag_free(&d);
    free_reference(&r);
}

/* accumulate adds to the gradients; the denominator replaces the batch's count. */
static void test_accumulate(void **state)
{
    (void)state;
    reference r;
    load_reference(&r, "llama");
    step s;
    compile_step(&s, "llama_op17_dyn.onnx", B, T, SBP_STRATEGY_CHECKPOINT, NULL, "llama_acc");
    size_t n = s.info->param_elems;
    float *params = param_block(&s), *g1 = malloc(n * sizeof(float)),
          *g2 = malloc(n * sizeof(float)), *g3 = malloc(n * sizeof(float));
    int64_t scored = 0;
    double l1 = run_step(&s, params, g1, &r.bt, 0, 0, &scored);
    memcpy(g2, g1, n * sizeof(float));
    double l2 = run_step(&s, params, g2, &r.bt, 1, 0, NULL);
    double l3 = run_step(&s, params, g3, &r.bt, 0, 2.0 * (double)scored, NULL);
    assert_true(l1 == l2);
    assert_true(fabs(l3 - l1 / 2) <= 1e-6 * l1);
    /* per tensor: the second step's contributions are added one by one, so elementwise the
     * rounding differs from 2 * g1 */
    for (int i = 0; i < s.info->n_params; i++) {
        const sbp_step_param *q = &s.info->params[i];
        double d2 = 0, d3 = 0, ref = 0;
        for (size_t k = q->offset; k < q->offset + q->numel; k++) {
            d2 += ((double)g2[k] - 2.0 * g1[k]) * ((double)g2[k] - 2.0 * g1[k]);
            d3 += ((double)g3[k] - 0.5 * g1[k]) * ((double)g3[k] - 0.5 * g1[k]);
            ref += (double)g1[k] * g1[k];
        }
        assert_true(sqrt(d2) <= 1e-6 * 2 * sqrt(ref));
        assert_true(sqrt(d3) <= 1e-6 * 0.5 * sqrt(ref));
    }
    free(params);
    free(g1);
    free(g2);
    free(g3);
    free_step(&s);
    free_reference(&r);
}

/* An op on the loss's path without a gradient rule is a compile error that names it. */
static void test_no_gradient_rule(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "handmade");
    ir_graph *g = ir_graph_new(&d, "handmade");
    ir_dim dims[2] = {{2, NULL}, {4, NULL}};
    ir_value *ids = ir_value_new(g, "input_ids", IR_VAL_INPUT, IR_DT_INT64, 2, dims);
    g->inputs = ir_arena_calloc(g->arena, 1, sizeof *g->inputs);
    g->inputs[0] = ids;
    g->n_inputs = 1;
    float w[64];
    for (int i = 0; i < 64; i++)
        w[i] = (float)i / 64;
    ir_value *table = ir_const_new(g, "table", IR_DT_FLOAT, 2, (const int64_t[]){8, 8}, w);
    table->kind = IR_VAL_PARAM;
    ir_node *emb = ir_node_new(g, IR_OP_EMBEDDING, "embed", 2, (ir_value *[]){table, ids}, 1);
    assert_non_null(emb);
    ir_node *sin = ir_node_new(g, IR_OP_SIN, "the_sine", 1, (ir_value *[]){emb->out[0]}, 1);
    assert_non_null(sin);
    g->outputs = ir_arena_calloc(g->arena, 1, sizeof *g->outputs);
    g->outputs[0] = sin->out[0];
    g->n_outputs = 1;
    sin->out[0]->is_output = true;
    sbp_objective chosen;
    assert_int_equal(sbp_pass_objective(g, SBP_OBJECTIVE_SFT, &chosen), IR_OK);
    sbp_train_options to = {.strategy = SBP_STRATEGY_STORE};
    assert_null(sbp_train_build(g, chosen, &to));
    bool found = false;
    for (int i = 0; i < d.n; i++)
        if (strstr(d.entries[i].msg, "no gradient rule for op Sin") &&
            strstr(d.entries[i].msg, "the_sine"))
            found = true;
    print_diag(&d);
    assert_true(found);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* The generated C compiles without a warning under gcc and clang. */
static void test_warnings(void **state)
{
    (void)state;
    const char *models[] = {"gpt2_op17_dyn.onnx", "qwen3_op17_dyn.onnx", "llama_op17_loss.onnx"};
    const char *compilers[] = {"gcc", "clang"};
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        for (int st = 0; st < 2; st++) {
            ir_diag d;
            sbp_objective chosen;
            ir_graph *g = front(models[m], strstr(models[m], "dyn") ? B : 0,
                                strstr(models[m], "dyn") ? T : 0, &d, &chosen);
            sbp_train_options to = {.strategy = st ? SBP_STRATEGY_CHECKPOINT
                                                   : SBP_STRATEGY_STORE};
            sbp_train_program *p = sbp_train_build(g, chosen, &to);
            assert_non_null(p);
            char c[1024];
            snprintf(c, sizeof c, "%s/warn_%zu_%d.txt", SBP_E2E_OUT, m, st);
            FILE *listing = fopen(c, "w"); /* the program listing, for reading */
            assert_non_null(listing);
            sbp_train_print(p, listing);
            fclose(listing);
            snprintf(c, sizeof c, "%s/warn_%zu_%d.c", SBP_E2E_OUT, m, st);
            assert_int_equal(sbp_codegen_write(p, c, models[m], NULL, &d), IR_OK);
            for (int k = 0; k < 2; k++) {
                char cmd[4096];
                snprintf(cmd, sizeof cmd,
                         "command -v %s >/dev/null 2>&1 || exit 0; %s -std=c11 -Wall -Wextra "
                         "-Wpedantic -Werror -fsyntax-only %s %s",
                         compilers[k], compilers[k], SBP_E2E_INCLUDES, c);
                int rc = system(cmd);
                if (rc != 0)
                    print_message("%s\n", cmd);
                assert_int_equal(rc, 0);
            }
            ir_graph_free(g);
            ir_diag_free(&d);
        }
    }
}

int main(void)
{
    /* the shared objects must link the same (sanitizer) runtime as this test */
    setenv("CC", SBP_TEST_CC, 1);
    mkdir(SBP_E2E_OUT, 0777);
    if (sbprt_ctx_create(&ctx, 0) != SBPRT_OK)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama_graph_loss),
        cmocka_unit_test(test_gpt2_nofold),
        cmocka_unit_test(test_qwen3_op14),
        cmocka_unit_test(test_constants_file),
        cmocka_unit_test(test_freeze),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_no_gradient_rule),
        cmocka_unit_test(test_warnings),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    sbprt_ctx_destroy(ctx);
    return rc;
}
