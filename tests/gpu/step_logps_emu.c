/* step_logps_emu.c — sbp_step_logps of a CUDA step on the CUDA emulator (gpu.step_emu_logps).
 *
 * The Llama transformers export (tests/fixtures/hf) bound to B = 4, T = 32 is compiled as a DPO
 * step and a GRPO step (stream, chunks 5 / 13: neither divides its rows) for --target cuda; the
 * C is compiled and linked against libsbprt_cuda_emu.a as tests/gpu/emu_step.cmake does (the
 * CUDA backend's sources on tests/gpu/emu), and sbp_step_logps runs with every buffer in the
 * step's device memory (sbprt_arena_alloc, sbprt_memcpy of the step's own runtime). Its row and
 * token log-probabilities must equal the float64 transformers values of
 * tests/fixtures/hf/ref/logps.safetensors (row 1e-5 relative, token 1e-5 of max(1, |ref|)),
 * with 0 at unscored positions and the workspace filled with garbage first.
 *
 *   step_logps_emu   (SBP_EMU_LIB, SBP_EMU_CC, SBP_EMU_INCLUDES given at build time)
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

#include "codegen.h"
#include "e2e_util.h"

#define LB 4
#define LT 32
#define N (LB * LT)

/* The step's own runtime (the emulated CUDA backend linked into it). */
typedef struct rt {
    int (*ctx_create)(sbprt_ctx **, int);
    void (*ctx_destroy)(sbprt_ctx *);
    int (*alloc)(sbprt_ctx *, void **, size_t);
    void (*free)(sbprt_ctx *, void *);
    int (*memcpy)(sbprt_ctx *, void *, const void *, size_t, int);
    int (*logps)(sbprt_ctx *, const sbp_step_args *, float *, float *);
    const sbp_step_info *(*info)(void);
} rt;

static void *sym(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (!f)
        print_message("the step does not export %s\n", name);
    assert_non_null(f);
    return f;
}

static void *dev_copy(const rt *r, sbprt_ctx *ctx, const void *src, size_t bytes)
{
    void *d = NULL;
    assert_int_equal(r->alloc(ctx, &d, bytes ? bytes : 4), SBPRT_OK);
    if (src)
        assert_int_equal(r->memcpy(ctx, d, src, bytes, SBPRT_COPY_HOST_TO_DEVICE), SBPRT_OK);
    return d;
}

static void emu_case(sbp_objective obj, const char *tag)
{
    e2e_step s = {0};
    sbp_train_options o = {.strategy = SBP_STRATEGY_STREAM, .chunk = 5, .logits_chunk = 13,
                           .eval = true, .beta = obj == SBP_OBJECTIVE_DPO ? 0.1 : 0.04,
                           .epsilon = obj == SBP_OBJECTIVE_GRPO ? 0.2 : 0};
    const char *model = "hf/llama_dynamo_eager.onnx";
    assert_int_equal(e2e_build(&s, model, LB, LT, obj, NULL, &o), obj);
    assert_non_null(s.p->logps);

    char c[1024], so[1024], cmd[8192];
    snprintf(c, sizeof c, "%s/%s.c", SBP_E2E_OUT, tag);
    snprintf(so, sizeof so, "%s/%s.so", SBP_E2E_OUT, tag);
    assert_int_equal(sbp_codegen_write_target(s.p, c, model, NULL, "cuda", &s.diag), IR_OK);
    snprintf(cmd, sizeof cmd,
             "%s -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -I%s %s -o %s %s "
             "-Wl,-Bsymbolic -Wl,--whole-archive %s -Wl,--no-whole-archive -lstdc++ -lm",
             SBP_EMU_CC, SBP_E2E_OUT, SBP_EMU_INCLUDES, so, c, SBP_EMU_LIB);
    int src = system(cmd);
    if (src != 0)
        print_message("failed: %s\n", cmd);
    assert_int_equal(src, 0);
    void *lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        print_message("dlopen: %s\n", dlerror());
    assert_non_null(lib);
    rt r;
    *(void **)&r.ctx_create = sym(lib, "sbprt_ctx_create");
    *(void **)&r.ctx_destroy = sym(lib, "sbprt_ctx_destroy");
    *(void **)&r.alloc = sym(lib, "sbprt_arena_alloc");
    *(void **)&r.free = sym(lib, "sbprt_arena_free");
    *(void **)&r.memcpy = sym(lib, "sbprt_memcpy");
    *(void **)&r.logps = sym(lib, "sbp_step_logps");
    *(void **)&r.info = sym(lib, "sbp_step_get_info");
    const sbp_step_info *in = r.info();
    assert_string_equal(in->target, "cuda");
    assert_int_equal(in->logp_workspace_bytes, s.p->logps->workspace_bytes);

    /* the batch and the float64 references */
    char err[256];
    sbpio_st_file *f = NULL;
    assert_int_equal(sbpio_st_open(e2e_fixture("hf/ref/logps.safetensors"), &f, err, sizeof err),
                     0);
    double tmp[N], ref_row[LB], ref_tok[N];
    int32_t ids[N], labels[N];
    assert_int_equal(sbpio_st_copy_f64(f, "input/ids", tmp, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)tmp[i];
    assert_int_equal(sbpio_st_copy_f64(f, "input/labels", tmp, N, err, sizeof err), 0);
    for (int i = 0; i < N; i++)
        labels[i] = (int32_t)tmp[i];
    assert_int_equal(sbpio_st_copy_f64(f, "llama/row_logps", ref_row, LB, err, sizeof err), 0);
    assert_int_equal(sbpio_st_copy_f64(f, "llama/token_logps", ref_tok, N, err, sizeof err), 0);
    sbpio_st_close(f);

    sbprt_ctx *ctx = NULL;
    assert_int_equal(r.ctx_create(&ctx, 0), SBPRT_OK);
    float *params = e2e_param_block(in, s.g);
    unsigned char *garbage = malloc(in->logp_workspace_bytes + 1);
    assert_non_null(garbage);
    memset(garbage, 0xff, in->logp_workspace_bytes);
    float nan_row[LB], nan_tok[N];
    for (int i = 0; i < N; i++)
        nan_tok[i] = NAN;
    for (int b = 0; b < LB; b++)
        nan_row[b] = NAN;
    sbp_step_args a = {
        .params = dev_copy(&r, ctx, params, sizeof(float) * in->param_elems),
        .input_ids = dev_copy(&r, ctx, ids, sizeof ids),
        .labels = dev_copy(&r, ctx, labels, sizeof labels),
        .workspace = dev_copy(&r, ctx, garbage, in->logp_workspace_bytes),
    };
    float *d_row = dev_copy(&r, ctx, nan_row, sizeof nan_row);
    float *d_tok = dev_copy(&r, ctx, nan_tok, sizeof nan_tok);
    int64_t scored = -1;
    a.n_scored = &scored;
    int rc = r.logps(ctx, &a, d_row, d_tok);
    assert_int_equal(rc, SBPRT_OK);
    float row[LB], tok[N];
    assert_int_equal(r.memcpy(ctx, row, d_row, sizeof row, SBPRT_COPY_DEVICE_TO_HOST), SBPRT_OK);
    assert_int_equal(r.memcpy(ctx, tok, d_tok, sizeof tok, SBPRT_COPY_DEVICE_TO_HOST), SBPRT_OK);
    int64_t n = 0;
    double row_err = 0, tok_err = 0;
    for (int i = 0; i < N; i++) {
        n += labels[i] != -100;
        if (labels[i] == -100) {
            assert_true(tok[i] == 0.0f);
            continue;
        }
        double e = fabs(tok[i] - ref_tok[i]) / fmax(1.0, fabs(ref_tok[i]));
        tok_err = e > tok_err ? e : tok_err;
    }
    for (int b = 0; b < LB; b++) {
        double e = fabs(row[b] - ref_row[b]) / fabs(ref_row[b]);
        row_err = e > row_err ? e : row_err;
    }
    assert_int_equal(scored, n);
    print_message("%-24s (cuda, emulated) rows rel %.1e, tokens %.1e vs float64 transformers; "
                  "workspace %zu\n",
                  tag, row_err, tok_err, in->logp_workspace_bytes);
    assert_true(row_err <= 1e-5);
    assert_true(tok_err <= 1e-5);
    r.free(ctx, (void *)a.params);
    r.free(ctx, (void *)a.input_ids);
    r.free(ctx, (void *)a.labels);
    r.free(ctx, a.workspace);
    r.free(ctx, d_row);
    r.free(ctx, d_tok);
    void (*release)(sbprt_ctx *);
    *(void **)&release = sym(lib, "sbp_step_release");
    release(ctx);
    r.ctx_destroy(ctx);
    free(garbage);
    free(params);
    /* no dlclose: the emulator's threads' state would look leaked (LSan) */
    e2e_free_step(&s);
}

static void test_dpo(void **state)
{
    (void)state;
    emu_case(SBP_OBJECTIVE_DPO, "emu_logps_dpo");
}

static void test_grpo(void **state)
{
    (void)state;
    emu_case(SBP_OBJECTIVE_GRPO, "emu_logps_grpo");
}

int main(void)
{
    e2e_init();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_dpo), cmocka_unit_test(test_grpo)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
