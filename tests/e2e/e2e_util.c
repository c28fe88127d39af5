/* e2e_util.c — the end-to-end tests' shared steps (e2e_util.h): fixture paths, compiling a
 * training step into a shared object and loading it, running it, reading the float64 PyTorch
 * references and comparing gradients. Failures are cmocka assertions, which end the running
 * test wherever they are raised.
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
#include "e2e_util.h"
#include "flow.h"

sbprt_ctx *e2e_ctx;

void e2e_init(void)
{
    setenv("CC", SBP_TEST_CC, 1);
    mkdir(SBP_E2E_OUT, 0777);
}

const char *e2e_fixture(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    if (snprintf(buf[k], sizeof buf[k], "%s/%s", SBP_FIXTURES_DIR, name) >= (int)sizeof buf[k])
        fail_msg("fixture path too long: %s", name);
    return buf[k];
}

void e2e_print_diag(const ir_diag *d)
{
    for (int i = 0; i < d->n; i++)
        if (d->entries[i].sev == IR_SEV_ERROR)
            print_message("  %s: %s\n", d->entries[i].node ? d->entries[i].node : "",
                          d->entries[i].msg);
}

/* ------------------------------------------------------------------ compiling */

ir_graph *e2e_front(const char *model, int64_t b, int64_t t, sbp_objective obj, ir_diag *d,
                    sbp_objective *chosen)
{
    ir_diag_init(d, model);
    const sbp_flow_options fo = {.pass = {.batch = b, .seq_len = t, .verify = true},
                                 .objective = obj};
    sbp_flow f = {.path = e2e_fixture(model)};
    int rc = sbp_flow_run(&f, &fo, d, "objective");
    if (rc != IR_OK)
        e2e_print_diag(d);
    assert_int_equal(rc, IR_OK);
    *chosen = f.chosen;
    return f.g;
}

sbp_objective e2e_build(e2e_step *s, const char *model, int64_t b, int64_t t, sbp_objective obj,
                        const char *freeze, const sbp_train_options *o)
{
    memset(s, 0, sizeof *s);
    ir_diag_init(&s->diag, model);
    /* the whole flow, as sbpc runs it (passes/flow.h) */
    const sbp_flow_options fo = {.pass = {.batch = b, .seq_len = t, .verify = true},
                                 .objective = obj,
                                 .freeze = freeze ? &freeze : NULL,
                                 .n_freeze = freeze ? 1 : 0,
                                 .train = o ? *o : (sbp_train_options){0}};
    sbp_flow f = {.path = e2e_fixture(model)};
    int rc = sbp_flow_run(&f, &fo, &s->diag, NULL);
    s->g = f.g;
    s->p = f.program;
    if (rc != IR_OK)
        e2e_print_diag(&s->diag);
    assert_int_equal(rc, IR_OK);
    assert_non_null(s->p);
    return f.chosen;
}

void e2e_load_so(e2e_step *s, const sbp_train_program *p, const char *model, const char *tag,
                 ir_diag *d)
{
    e2e_load_so_with(s, p, model, &(sbp_codegen_options){0}, tag, d);
}

void e2e_load_so_with(e2e_step *s, const sbp_train_program *p, const char *model,
                      const sbp_codegen_options *cg, const char *tag, ir_diag *d)
{
    char so[1024];
    snprintf(so, sizeof so, "%s/%s.so", SBP_E2E_OUT, tag);
    sbp_codegen_options o = *cg;
    o.model_path = model;
    o.keep_c = true; /* the C beside the .so, for reading a failure (and the constants file) */
    int rc = sbp_codegen_write(p, so, &o, "-Werror", d);
    if (rc != IR_OK || d->n_errors)
        e2e_print_diag(d);
    assert_int_equal(rc, IR_OK);
    assert_int_equal(d->n_errors, 0);
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
}

sbp_objective e2e_compile(e2e_step *s, const char *model, int64_t b, int64_t t,
                          sbp_objective obj, const char *freeze, const sbp_train_options *o,
                          const char *tag)
{
    return e2e_compile_with(s, model, b, t, obj, freeze, o, &(sbp_codegen_options){0}, tag);
}

sbp_objective e2e_compile_with(e2e_step *s, const char *model, int64_t b, int64_t t,
                               sbp_objective obj, const char *freeze,
                               const sbp_train_options *o, const sbp_codegen_options *cg,
                               const char *tag)
{
    sbp_objective chosen = e2e_build(s, model, b, t, obj, freeze, o);
    e2e_load_so_with(s, s->p, model, cg, tag, &s->diag);
    assert_string_equal(s->info->strategy, sbp_strategy_name(o->strategy));
    return chosen;
}

void e2e_free_step(e2e_step *s)
{
    if (s->lib)
        dlclose(s->lib);
    ir_graph_free(s->g);
    ir_diag_free(&s->diag);
}

float *e2e_param_block(const sbp_step_info *info, const ir_graph *g)
{
    float *p = calloc(info->param_elems + 1, sizeof *p);
    assert_non_null(p);
    for (int i = 0; i < info->n_params; i++) {
        const sbp_step_param *q = &info->params[i];
        if (q->tied_to >= 0)
            continue;
        const ir_value *v = ir_value_find(g, q->name);
        assert_non_null(v);
        assert_int_equal(v->nbytes, q->numel * sizeof(float));
        memcpy(p + q->offset, v->data, v->nbytes);
    }
    return p;
}

double e2e_run(const e2e_step *s, sbp_step_args *a, bool poison)
{
    size_t wsb = s->info->workspace_bytes;
    void *ws = aligned_alloc(SBPRT_ALIGN, (wsb + SBPRT_ALIGN - 1) / SBPRT_ALIGN * SBPRT_ALIGN);
    assert_non_null(ws);
    memset(ws, 0xff, wsb); /* garbage: the step must not rely on zeroed memory */
    if (poison)
        for (size_t i = 0; i < s->info->grad_elems; i++)
            a->grads[i] = NAN;
    double loss = NAN;
    a->workspace = ws;
    a->loss = &loss;
    int rc = s->run(e2e_ctx, a);
    if (rc)
        print_message("sbp_step_run: %s\n", sbprt_status_string(rc));
    assert_int_equal(rc, SBPRT_OK);
    free(ws);
    a->workspace = NULL;
    a->loss = NULL;
    return loss;
}

/* ------------------------------------------------------------------ inputs */

/* read: sbpio_npy_read_i32 or _f32; elem: the element size of what it converts to. */
static void read_npy(const char *file, void *dst, int64_t n, size_t elem,
                     int (*read)(const char *, sbpio_array *, char *, size_t))
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/ref/%s", SBP_FIXTURES_DIR, file);
    sbpio_array a;
    if (read(path, &a, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(a.numel, n);
    memcpy(dst, a.data, elem * (size_t)n);
    sbpio_array_free(&a);
}

void e2e_read_i32(const char *file, int32_t *dst, int64_t n)
{
    read_npy(file, dst, n, sizeof *dst, sbpio_npy_read_i32);
}

void e2e_read_f32(const char *file, float *dst, int64_t n)
{
    read_npy(file, dst, n, sizeof *dst, sbpio_npy_read_f32);
}

void e2e_load_batch(const char *family, e2e_batch *bt)
{
    char name[256];
    bt->b = E2E_B;
    bt->t = E2E_T;
    snprintf(name, sizeof name, "%s_input_ids.npy", family);
    e2e_read_i32(name, bt->ids, E2E_B * E2E_T);
    snprintf(name, sizeof name, "%s_labels.npy", family);
    e2e_read_i32(name, bt->labels, E2E_B * E2E_T);
}

/* ------------------------------------------------------------------ comparisons */

void e2e_grad_of(const sbp_step_info *info, const float *grads, int i, double *out)
{
    const sbp_step_param *q = &info->params[i];
    const sbp_step_param *o = q->tied_to < 0 ? q : &info->params[q->tied_to];
    if (o->grad_offset == SIZE_MAX) { /* not trained: no gradient (zero) */
        assert_false(q->trainable);
        for (size_t k = 0; k < q->numel; k++)
            out[k] = 0;
        return;
    }
    assert_true(o->grad_offset + o->numel <= info->grad_elems);
    if (q->tied_to < 0) {
        for (size_t k = 0; k < q->numel; k++)
            out[k] = grads[q->grad_offset + k];
        return;
    }
    int64_t m = o->dims[0], n = o->dims[1];
    for (int64_t a = 0; a < n; a++)
        for (int64_t b = 0; b < m; b++)
            out[a * m + b] = grads[o->grad_offset + (size_t)(b * n + a)];
}

double e2e_rel_err(const double *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t k = 0; k < n; k++) {
        num += (got[k] - ref[k]) * (got[k] - ref[k]);
        den += ref[k] * ref[k];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double e2e_max_rel_vs(const e2e_step *a, const float *ga, const e2e_step *b, const float *gb,
                      double tol)
{
    assert_int_equal(a->info->n_params, b->info->n_params);
    double worst = 0;
    for (int i = 0; i < a->info->n_params; i++) {
        const sbp_step_param *q = &a->info->params[i];
        assert_string_equal(q->name, b->info->params[i].name);
        double *x = malloc(q->numel * sizeof *x), *y = malloc(q->numel * sizeof *y);
        assert_true(x && y);
        e2e_grad_of(a->info, ga, i, x);
        e2e_grad_of(b->info, gb, i, y);
        double r = e2e_rel_err(x, y, q->numel);
        if (!(r <= tol))
            print_message("    %s: rel difference %.3e\n", q->name, r);
        worst = r > worst ? r : worst;
        free(x);
        free(y);
    }
    return worst;
}

/* ------------------------------------------------------------------ references */

void e2e_load_reference(e2e_reference *r, const char *family, const char *file)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s_op17_static.onnx", family);
    ir_diag_init(&r->diag, path);
    r->g = ir_import_onnx(e2e_fixture(path), &r->diag, NULL);
    assert_non_null(r->g);
    if (file)
        snprintf(path, sizeof path, "%s/ref/%s", SBP_FIXTURES_DIR, file);
    else
        snprintf(path, sizeof path, "%s/ref/%s_grads.safetensors", SBP_FIXTURES_DIR, family);
    if (sbpio_st_open(path, &r->st, err, sizeof err) != 0)
        print_message("%s\n", err);
    assert_non_null(r->st);
    const char *l = sbpio_st_meta(r->st, "loss");
    assert_non_null(l);
    r->loss = strtod(l, NULL);
    e2e_load_batch(family, &r->bt);
}

void e2e_free_reference(e2e_reference *r)
{
    sbpio_st_close(r->st);
    ir_graph_free(r->g);
    ir_diag_free(&r->diag);
}

const char *e2e_ref_name(const e2e_reference *r, const ir_value *v)
{
    for (int i = 0; i < r->g->n_values; i++) {
        const ir_value *w = r->g->values[i];
        if (w->kind != IR_VAL_PARAM || w->nbytes != v->nbytes || w->rank != v->rank ||
            memcmp(w->data, v->data, v->nbytes) != 0)
            continue;
        bool same = true;
        for (int k = 0; k < v->rank; k++)
            same = same && w->dims[k].value == v->dims[k].value;
        if (same && sbpio_st_find(r->st, w->name))
            return w->name;
    }
    return NULL;
}

double e2e_max_rel_vs_ref(const e2e_step *s, const float *grads, const e2e_reference *r,
                          bool every_param)
{
    double worst = 0;
    for (int i = 0; i < s->info->n_params; i++) {
        const sbp_step_param *q = &s->info->params[i];
        const ir_value *v = ir_value_find(s->g, q->name);
        assert_non_null(v);
        const char *rn = e2e_ref_name(r, v);
        if (!rn) {
            if (every_param)
                print_message("    %s: no reference gradient\n", q->name);
            assert_true(!every_param);
            continue;
        }
        double *ref = malloc(q->numel * sizeof *ref), *got = malloc(q->numel * sizeof *got);
        assert_true(ref && got);
        char err[256];
        if (sbpio_st_copy_f64(r->st, rn, ref, (int64_t)q->numel, err, sizeof err) != 0)
            fail_msg("%s", err);
        e2e_grad_of(s->info, grads, i, got);
        double e = e2e_rel_err(got, ref, q->numel);
        if (!(e <= E2E_REF_GRAD_TOL))
            print_message("    %s: rel err vs PyTorch %.3e\n", q->name, e);
        worst = e > worst ? e : worst;
        free(ref);
        free(got);
    }
    return worst;
}

/* ------------------------------------------------------------------ the generated C */

void e2e_check_warnings(const sbp_train_program *p, const char *model, const char *stem,
                        ir_diag *d)
{
    /* "" when CMake did not find it: that half is the skipped ctest test e2e.warnings_<cc> */
    static const char *const compilers[] = {SBP_E2E_GCC, SBP_E2E_CLANG};
    char c[1024];
    snprintf(c, sizeof c, "%s/%s.txt", SBP_E2E_OUT, stem);
    FILE *listing = fopen(c, "w"); /* the program listing, for reading */
    assert_non_null(listing);
    sbp_train_print(p, listing);
    fclose(listing);
    snprintf(c, sizeof c, "%s/%s.c", SBP_E2E_OUT, stem);
    assert_int_equal(sbp_codegen_write(p, c, &(sbp_codegen_options){.model_path = model}, NULL, d),
                     IR_OK);
    for (int k = 0; k < 2; k++) {
        if (!compilers[k][0])
            continue;
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "'%s' -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only %s %s",
                 compilers[k], SBP_E2E_INCLUDES, c);
        int rc = system(cmd);
        if (rc != 0)
            print_message("%s\n", cmd);
        assert_int_equal(rc, 0);
    }
}
