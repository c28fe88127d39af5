/* merge_verify.c — checks sbp-train --save OUT.onnx --merge-lora without Python (runs in CI).
 *
 *   merge_verify ORIGINAL.onnx MERGED.onnx ADAPTER_DIR R ALPHA LAYOUT
 *   merge_verify --init ADAPTER_DIR SEED
 *
 * ADAPTER_DIR is the same run's --save-adapter; R and ALPHA are what sbpc was given (--lora,
 * --lora-alpha); LAYOUT says how the model stores its adapted weights: in_out (x @ W: TorchScript's
 * `onnx::MatMul_N`, the dynamo exporter's `val_N`, GPT-2's Conv1D), out_in (nn.Linear's own), or
 * any (either, as the shape says: an adapted weight with a re-tied transposed copy, both of which
 * must hold the one update).
 * The expected merge is computed here, in double, from the saved adapters and the original
 * model alone: D = (ALPHA / R)·B·A [out, in] for each adapter pair, in LAYOUT. Passes when
 *   - adapter_config.json says r R and lora_alpha ALPHA (the step's, not a flag of sbp-train);
 *   - MERGED has exactly ORIGINAL's initializers (same names, shapes), no adapter;
 *   - every initializer that changed equals W + D, within 1e-6 relative (||got - want|| /
 *     ||want||), for exactly one adapter pair: the one of its name when the initializer bears
 *     PyTorch's name (`<module>.weight`), else the one whose D it fits (exporters rename
 *     transposed copies, so values, not names, pair them up);
 *   - every adapter pair changed at least one initializer, and its D is not negligible
 *     (||D|| > 1e-3 ||W||: the check could not tell a merge left out otherwise);
 *   - every other initializer is bit for bit the original's.
 * --init: the adapters of a run with --lr 0 are sbpc's initial values for lora seed SEED
 * (ir_lora_init, lora_B zero): sbp-train took the seed from the step.
 * Prints the figures; exit 1 on a failure.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "sbpio.h"
#include "torch.h"

static int failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("merge_verify: FAIL: ", stdout);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    failures++;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static ir_graph *load(const char *path, ir_diag *d)
{
    ir_diag_init(d, path);
    ir_graph *g = ir_import_onnx(path, d, NULL);
    if (!g || d->n_errors) {
        ir_diag_print(d, stdout, "merge_verify");
        fail("cannot read %s", path);
        return NULL;
    }
    return g;
}

/* A float initializer (a matrix or not) of the imported model. */
static bool is_init(const ir_value *v)
{
    return (v->kind == IR_VAL_PARAM || v->kind == IR_VAL_CONST) && v->data &&
           v->dtype == IR_DT_FLOAT;
}

static int64_t numel(const ir_value *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->rank; d++)
        n *= v->dims[d].value;
    return n;
}

typedef struct pair {
    char module[512];
    const sbpio_st_info *a, *b; /* [r, in], [out, r] */
    double *d;                  /* [out * in]: (alpha / r) B·A, row-major [out, in] */
    int used;
} pair;

/* ||got - (w + D in layout)|| / ||w + D||, or INFINITY when the shape does not fit. */
static double merge_error_in(const ir_value *w, const ir_value *got, const pair *p, bool in_out)
{
    const int64_t out = p->b->shape[0], in = p->a->shape[1];
    if (w->rank != 2 || w->dims[0].value != (in_out ? in : out) ||
        w->dims[1].value != (in_out ? out : in))
        return INFINITY;
    const float *W = w->data, *G = got->data;
    double num = 0, den = 0;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            int64_t k = in_out ? i * out + o : o * in + i;
            double want = (double)W[k] + p->d[o * in + i];
            num += (G[k] - want) * (G[k] - want);
            den += want * want;
        }
    return sqrt(num) / sqrt(den);
}

/* The same in LAYOUT: 0 out_in, 1 in_out, 2 whichever fits better. */
static double merge_error(const ir_value *w, const ir_value *got, const pair *p, int layout)
{
    if (layout < 2)
        return merge_error_in(w, got, p, layout == 1);
    return fmin(merge_error_in(w, got, p, false), merge_error_in(w, got, p, true));
}

static int check_init(const char *dir, long long seed)
{
    char path[4096], err[512];
    sbpio_st_file *ad = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (sbpio_st_open(path, &ad, err, sizeof err)) {
        fail("%s", err);
        return 1;
    }
    int n = 0;
    for (int i = 0; i < sbpio_st_count(ad); i++) {
        const sbpio_st_info *t = sbpio_st_at(ad, i);
        const char *name = t->name + strlen("base_model.model.");
        float *want = calloc((size_t)t->numel + 1, sizeof *want);
        if (!want || t->rank != 2 || t->dtype != SBPIO_DT_F32) {
            fail("'%s': not a float32 matrix", t->name);
            free(want);
            continue;
        }
        ir_lora_init(name, (uint64_t)seed, t->shape[0], t->shape[1], want);
        if (memcmp(want, t->data, (size_t)t->numel * sizeof(float)) != 0)
            fail("'%s' is not sbpc's initial value for seed %lld", t->name, seed);
        free(want);
        n++;
    }
    printf("merge_verify: %d adapters at their initial values for seed %lld\n", n, seed);
    sbpio_st_close(ad);
    printf("merge_verify: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--init") == 0)
        return check_init(argv[2], atoll(argv[3]));
    const int layout = argc != 7 ? -1 : strcmp(argv[6], "out_in") == 0 ? 0
                                      : strcmp(argv[6], "in_out") == 0 ? 1
                                      : strcmp(argv[6], "any") == 0    ? 2
                                                                       : -1;
    if (layout < 0) {
        fprintf(stderr, "usage: merge_verify ORIGINAL.onnx MERGED.onnx ADAPTER_DIR R ALPHA "
                        "in_out|out_in|any\n       merge_verify --init ADAPTER_DIR SEED\n");
        return 2;
    }
    const long long r = atoll(argv[4]);
    const double alpha = strtod(argv[5], NULL), scaling = alpha / (double)r;
    char path[4096], err[512];

    /* the config: the step's r and alpha */
    snprintf(path, sizeof path, "%s/adapter_config.json", argv[3]);
    char *cfg = read_text(path), want_r[64], want_a[64];
    snprintf(want_r, sizeof want_r, "\"r\": %lld,", r);
    snprintf(want_a, sizeof want_a, "\"lora_alpha\": %g,", alpha);
    if (!cfg || !strstr(cfg, want_r) || !strstr(cfg, want_a))
        fail("%s does not say %s %s", path, want_r, want_a);
    free(cfg);

    /* the adapter pairs and their D */
    sbpio_st_file *ad = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", argv[3]);
    if (sbpio_st_open(path, &ad, err, sizeof err)) {
        fail("%s", err);
        return 1;
    }
    int n_pairs = 0;
    pair *pairs = calloc((size_t)sbpio_st_count(ad) + 1, sizeof *pairs);
    for (int i = 0; pairs && i < sbpio_st_count(ad); i++) {
        const sbpio_st_info *a = sbpio_st_at(ad, i);
        const char *pre = "base_model.model.", *sfx = ".lora_A.weight";
        size_t n = strlen(a->name);
        if (n < strlen(pre) + strlen(sfx) || strcmp(a->name + n - strlen(sfx), sfx) != 0)
            continue;
        pair *p = &pairs[n_pairs];
        snprintf(p->module, sizeof p->module, "%.*s", (int)(n - strlen(pre) - strlen(sfx)),
                 a->name + strlen(pre));
        char bname[1024];
        snprintf(bname, sizeof bname, "%s%s.lora_B.weight", pre, p->module);
        p->a = a;
        p->b = sbpio_st_find(ad, bname);
        if (!p->b || a->rank != 2 || p->b->rank != 2 || a->shape[0] != r ||
            p->b->shape[1] != r || a->dtype != SBPIO_DT_F32 || p->b->dtype != SBPIO_DT_F32) {
            fail("adapter '%s': no float32 rank-%lld pair", a->name, r);
            continue;
        }
        const int64_t out = p->b->shape[0], in = a->shape[1];
        const float *A = a->data, *B = p->b->data;
        if (!(p->d = calloc((size_t)(out * in) + 1, sizeof *p->d)))
            return 1;
        for (int64_t o = 0; o < out; o++)
            for (int64_t k = 0; k < r; k++)
                for (int64_t j = 0; j < in; j++)
                    p->d[o * in + j] += scaling * (double)B[o * r + k] * (double)A[k * in + j];
        n_pairs++;
    }

    /* the two models */
    ir_diag d0, d1;
    ir_graph *g0 = load(argv[1], &d0), *g1 = load(argv[2], &d1);
    if (!g0 || !g1)
        return 1;
    int n_init = 0, n_changed = 0;
    double worst = 0, weakest = INFINITY;
    for (int i = 0; i < g1->n_values; i++) {
        const ir_value *v = g1->values[i];
        if (is_init(v) && ir_lora_kind(v->name))
            fail("the merged model holds the adapter '%s'", v->name);
    }
    for (int i = 0; i < g0->n_values; i++) {
        const ir_value *w = g0->values[i];
        if (!is_init(w))
            continue;
        n_init++;
        const ir_value *m = ir_value_find(g1, w->name);
        if (!m || !is_init(m) || m->rank != w->rank || numel(m) != numel(w)) {
            fail("initializer '%s' is missing from the merged model or changed shape", w->name);
            continue;
        }
        for (int k = 0; k < w->rank; k++)
            if (m->dims[k].value != w->dims[k].value)
                fail("initializer '%s' changed shape", w->name);
        if (memcmp(w->data, m->data, (size_t)numel(w) * sizeof(float)) == 0)
            continue; /* untouched, bit for bit */
        n_changed++;
        /* its adapter: by PyTorch's name, else the one pair whose update it holds */
        int hit = -1, n_fit = 0;
        size_t wl = strlen(w->name);
        for (int k = 0; k < n_pairs; k++)
            if (wl == strlen(pairs[k].module) + strlen(".weight") &&
                strncmp(w->name, pairs[k].module, strlen(pairs[k].module)) == 0 &&
                strcmp(w->name + strlen(pairs[k].module), ".weight") == 0)
                hit = k;
        for (int k = 0, by_name = hit >= 0; !by_name && k < n_pairs; k++)
            if (merge_error(w, m, &pairs[k], layout) <= 1e-6) {
                n_fit++;
                hit = k;
            }
        if (hit < 0 || n_fit > 1) {
            fail("initializer '%s' changed, but not to W + (alpha/r)·B·A (%s) of %s adapter",
                 w->name, argv[6], hit < 0 ? "any" : "exactly one");
            continue;
        }
        double e = merge_error(w, m, &pairs[hit], layout);
        worst = fmax(worst, e);
        if (!(e <= 1e-6))
            fail("initializer '%s': relative error %.3g > 1e-6 against W + (alpha/r)·B·A of '%s'",
                 w->name, e, pairs[hit].module);
        const pair *p = &pairs[hit];
        double dn = 0, wn = 0;
        for (int64_t k = 0; k < p->b->shape[0] * p->a->shape[1]; k++)
            dn += p->d[k] * p->d[k];
        for (int64_t k = 0; k < numel(w); k++)
            wn += (double)((const float *)w->data)[k] * ((const float *)w->data)[k];
        weakest = fmin(weakest, sqrt(dn / wn));
        pairs[hit].used++;
    }
    for (int k = 0; k < n_pairs; k++)
        if (!pairs[k].used)
            fail("the adapter of '%s' changed no initializer", pairs[k].module);
    if (!(weakest > 1e-3))
        fail("the smallest update is %.3g of its weight: too small to tell a merge left out",
             weakest);
    printf("merge_verify: %d initializers, %d merged (%d adapter pairs, scaling %g, %s), worst "
           "relative error %.3g, smallest update %.3g of its weight\n",
           n_init, n_changed, n_pairs, scaling, argv[6], worst, weakest);
    for (int k = 0; k < n_pairs; k++)
        free(pairs[k].d);
    free(pairs);
    sbpio_st_close(ad);
    ir_graph_free(g0);
    ir_graph_free(g1);
    ir_diag_free(&d0);
    ir_diag_free(&d1);
    printf("merge_verify: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
