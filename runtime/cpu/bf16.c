/*
 * bf16.c — the bf16 entry points of sbprt.h on the CPU backend, by their definition.
 *
 * Each function converts its bf16 operands to fp32 temporaries, calls this backend's fp32
 * kernel on them, and rounds the bf16 outputs back to nearest even.  That is exactly the
 * contract of the bf16 API ("the fp32 function applied to the bf16 values, each bf16 output
 * rounded once"), which makes these the reference twins of the CUDA bf16 kernels in
 * tests/gpu; they are not meant to be fast (the CPU target does not compile bf16 steps).
 *
 * Aliasing: operands that are the same pointer share one temporary, so an in-place call
 * (out == x) reaches the fp32 kernel as the same in-place call.  Outputs the fp32 kernel
 * accumulates into (dx +=) are converted in, so the sum is formed in fp32 and rounded once.
 * A temporary that cannot be allocated gives SBPRT_ERR_NOMEM before anything is written.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static float bf_to_f(sbprt_bf16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static sbprt_bf16 f_to_bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    sbprt_bf16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep it a (quiet) NaN */
        h.bits = (uint16_t)((u >> 16) | 0x40u);
        return h;
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    h.bits = (uint16_t)(u >> 16);
    return h;
}

int sbprt_convert_f32_to_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const float *src, size_t n)
{
    if (!ctx || (n && (!dst || !src)))
        return SBPRT_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        dst[i] = f_to_bf(src[i]);
    return SBPRT_OK;
}

int sbprt_convert_bf16_to_f32(sbprt_ctx *ctx, float *dst, const sbprt_bf16 *src, size_t n)
{
    if (!ctx || (n && (!dst || !src)))
        return SBPRT_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        dst[i] = bf_to_f(src[i]);
    return SBPRT_OK;
}

/* ---- the temporaries of one call ------------------------------------------------------- */

#define BF_SLOTS 10

typedef struct {
    struct {
        const sbprt_bf16 *src;
        float *tmp;
        size_t n;
        int out; /* rounded back at the end */
    } s[BF_SLOTS];
    int ns;
    int nomem;
} bf_call;

/* The fp32 temporary of bf16 operand p (n elements), converted in; NULL for NULL. */
static float *bf_arg(bf_call *t, const sbprt_bf16 *p, size_t n, int out)
{
    if (!p)
        return NULL;
    for (int i = 0; i < t->ns; i++)
        if (t->s[i].src == p) {
            t->s[i].out |= out;
            if (n <= t->s[i].n)
                return t->s[i].tmp;
            /* the same pointer with a larger extent: grow (keeps the converted prefix) */
            float *g = realloc(t->s[i].tmp, n * sizeof(float));
            if (!g) {
                t->nomem = 1;
                return t->s[i].tmp;
            }
            for (size_t k = t->s[i].n; k < n; k++)
                g[k] = bf_to_f(p[k]);
            t->s[i].tmp = g;
            t->s[i].n = n;
            return g;
        }
    if (t->ns == BF_SLOTS) {
        t->nomem = 1;
        return NULL;
    }
    float *tmp = malloc((n ? n : 1) * sizeof(float));
    if (!tmp) {
        t->nomem = 1;
        return NULL;
    }
    for (size_t k = 0; k < n; k++)
        tmp[k] = bf_to_f(p[k]);
    t->s[t->ns].src = p;
    t->s[t->ns].tmp = tmp;
    t->s[t->ns].n = n;
    t->s[t->ns].out = out;
    t->ns++;
    return tmp;
}
#define IN(p, n) bf_arg(&t, (p), (size_t)(n), 0)
#define OUT(p, n) bf_arg(&t, (p), (size_t)(n), 1)

/* Rounds the outputs back when rc is SBPRT_OK, frees everything, returns rc. */
static int bf_finish(bf_call *t, int rc)
{
    for (int i = 0; i < t->ns; i++) {
        if (rc == SBPRT_OK && t->s[i].out) {
            sbprt_bf16 *dst = (sbprt_bf16 *)t->s[i].src;
            for (size_t k = 0; k < t->s[i].n; k++)
                dst[k] = f_to_bf(t->s[i].tmp[k]);
        }
        free(t->s[i].tmp);
    }
    t->ns = 0;
    return rc;
}
#define CALL(expr) return bf_finish(&t, t.nomem ? SBPRT_ERR_NOMEM : (expr))
#define BEGIN                                                                                  \
    bf_call t;                                                                                 \
    t.ns = 0;                                                                                  \
    t.nomem = 0

/* The element count of dims, or 0 when it does not fit (checked: eight int extents can wrap
 * size_t): nothing is converted then, and the fp32 kernel refuses the dims itself. */
static size_t prod(int rank, const int *dims)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        if (!cpu_mul_size(n, dims && dims[i] > 0 ? (size_t)dims[i] : 0, &n))
            return 0;
    return n;
}

/* Sizes come from arguments the fp32 kernel validates; a negative one gives 0 elements here
 * and the kernel's own SBPRT_ERR_INVALID. */
static size_t nz(int64_t x) { return x > 0 ? (size_t)x : 0; }

/* ---- GEMM, bias, elementwise ------------------------------------------------------------- */

int sbprt_gemm_bf16(sbprt_ctx *ctx, sbprt_bf16 *c, const sbprt_bf16 *a, const sbprt_bf16 *b,
                    int trans_a, int trans_b, int m, int n, int k, float alpha, float beta)
{
    BEGIN;
    const size_t mn = nz(m) * nz(n);
    float *fc = mn ? OUT(c, mn) : NULL;
    float *fa = mn ? IN(a, nz(m) * nz(k)) : NULL, *fb = mn ? IN(b, nz(k) * nz(n)) : NULL;
    CALL(sbprt_gemm(ctx, fc, fa, fb, trans_a, trans_b, m, n, k, alpha, beta));
}

int sbprt_gemm_bf16_f32(sbprt_ctx *ctx, float *c, const sbprt_bf16 *a, const sbprt_bf16 *b,
                        int trans_a, int trans_b, int m, int n, int k, float alpha, float beta)
{
    BEGIN;
    const size_t mn = nz(m) * nz(n);
    float *fa = mn ? IN(a, nz(m) * nz(k)) : NULL, *fb = mn ? IN(b, nz(k) * nz(n)) : NULL;
    CALL(sbprt_gemm(ctx, c, fa, fb, trans_a, trans_b, m, n, k, alpha, beta));
}

int sbprt_bias_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const float *bias, int n, int c)
{
    BEGIN;
    CALL(sbprt_bias_add(ctx, OUT(y, nz(n) * nz(c)), bias, n, c));
}

int sbprt_bias_backward_bf16(sbprt_ctx *ctx, float *dbias, const sbprt_bf16 *dy, int n, int c)
{
    BEGIN;
    CALL(sbprt_bias_backward(ctx, dbias, IN(dy, nz(n) * nz(c)), n, c));
}

int sbprt_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a, const sbprt_bf16 *b,
                   size_t n)
{
    BEGIN;
    float *fa = IN(a, n), *fb = IN(b, n);
    CALL(sbprt_add(ctx, OUT(out, n), fa, fb, n));
}

int sbprt_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const sbprt_bf16 *x, size_t n)
{
    BEGIN;
    float *fx = IN(x, n);
    CALL(sbprt_accumulate(ctx, OUT(y, n), fx, n));
}

typedef int (*scalar_fn)(sbprt_ctx *, float *, const float *, size_t, float);

/* sbprt_scale and friends: dst is written (fwd) or accumulated into (the fp32 kernel reads
 * it; OUT converts it in either way). */
static int scalar_op(scalar_fn f, sbprt_ctx *ctx, sbprt_bf16 *dst, const sbprt_bf16 *src,
                     size_t n, float c)
{
    BEGIN;
    float *fs = IN(src, n);
    CALL(f(ctx, OUT(dst, n), fs, n, c));
}

int sbprt_scale_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n, float alpha)
{
    return scalar_op(sbprt_scale, ctx, out, x, n, alpha);
}
int sbprt_scale_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dy, size_t n,
                                float alpha)
{
    return scalar_op(sbprt_scale_accumulate, ctx, dx, dy, n, alpha);
}
int sbprt_div_scalar_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n,
                          float divisor)
{
    return scalar_op(sbprt_div_scalar, ctx, out, x, n, divisor);
}
int sbprt_div_scalar_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dy,
                                     size_t n, float divisor)
{
    return scalar_op(sbprt_div_scalar_accumulate, ctx, dx, dy, n, divisor);
}

typedef int (*fwd_fn)(sbprt_ctx *, float *, const float *, size_t);
typedef int (*bwd_fn)(sbprt_ctx *, float *, const float *, const float *, size_t);

static int act_fwd(fwd_fn f, sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    BEGIN;
    float *fx = IN(x, n);
    CALL(f(ctx, OUT(out, n), fx, n));
}

static int act_bwd(bwd_fn f, sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                   const sbprt_bf16 *x, size_t n)
{
    BEGIN;
    float *fd = IN(dout, n), *fx = IN(x, n);
    CALL(f(ctx, OUT(dx, n), fd, fx, n));
}

int sbprt_gelu_tanh_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    return act_fwd(sbprt_gelu_tanh_forward, ctx, out, x, n);
}
int sbprt_gelu_tanh_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                  const sbprt_bf16 *x, size_t n)
{
    return act_bwd(sbprt_gelu_tanh_backward, ctx, dx, dout, x, n);
}
int sbprt_gelu_erf_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    return act_fwd(sbprt_gelu_erf_forward, ctx, out, x, n);
}
int sbprt_gelu_erf_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                 const sbprt_bf16 *x, size_t n)
{
    return act_bwd(sbprt_gelu_erf_backward, ctx, dx, dout, x, n);
}
int sbprt_silu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    return act_fwd(sbprt_silu_forward, ctx, out, x, n);
}
int sbprt_silu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *x, size_t n)
{
    return act_bwd(sbprt_silu_backward, ctx, dx, dout, x, n);
}
int sbprt_relu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    return act_fwd(sbprt_relu_forward, ctx, out, x, n);
}
int sbprt_relu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *x, size_t n)
{
    return act_bwd(sbprt_relu_backward, ctx, dx, dout, x, n);
}
int sbprt_tanh_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n)
{
    return act_fwd(sbprt_tanh_forward, ctx, out, x, n);
}
int sbprt_tanh_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *y, size_t n)
{
    return act_bwd(sbprt_tanh_backward, ctx, dx, dout, y, n);
}

int sbprt_swiglu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *gate,
                              const sbprt_bf16 *up, size_t n)
{
    BEGIN;
    float *fg = IN(gate, n), *fu = IN(up, n);
    CALL(sbprt_swiglu_forward(ctx, OUT(out, n), fg, fu, n));
}

int sbprt_swiglu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dgate, sbprt_bf16 *dup,
                               const sbprt_bf16 *dout, const sbprt_bf16 *gate,
                               const sbprt_bf16 *up, size_t n)
{
    BEGIN;
    float *fd = IN(dout, n), *fg = IN(gate, n), *fu = IN(up, n);
    float *dg = OUT(dgate, n), *du = OUT(dup, n);
    CALL(sbprt_swiglu_backward(ctx, dg, du, fd, fg, fu, n));
}

/* ---- embedding, norms, RoPE --------------------------------------------------------------- */

int sbprt_embedding_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const float *table,
                                 const int32_t *ids, int n, int v, int c)
{
    BEGIN;
    CALL(sbprt_embedding_forward(ctx, OUT(out, nz(n) * nz(c)), table, ids, n, v, c));
}

int sbprt_embedding_forward_bf16_table(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *table,
                                       const int32_t *ids, int n, int v, int c)
{
    BEGIN;
    CALL(sbprt_embedding_forward(ctx, OUT(out, nz(n) * nz(c)), IN(table, nz(v) * nz(c)), ids, n,
                                 v, c));
}

int sbprt_embedding_backward_bf16(sbprt_ctx *ctx, float *dtable, const sbprt_bf16 *dout,
                                  const int32_t *ids, int n, int v, int c)
{
    BEGIN;
    CALL(sbprt_embedding_backward(ctx, dtable, IN(dout, nz(n) * nz(c)), ids, n, v, c));
}

int sbprt_layernorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *mean, float *rstd,
                                 const sbprt_bf16 *x, const float *gamma, const float *beta,
                                 int n, int c, float eps)
{
    BEGIN;
    const size_t nc = nz(n) * nz(c);
    float *fx = IN(x, nc);
    CALL(sbprt_layernorm_forward(ctx, OUT(out, nc), mean, rstd, fx, gamma, beta, n, c, eps));
}

int sbprt_layernorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma, float *dbeta,
                                  const sbprt_bf16 *dout, const sbprt_bf16 *x,
                                  const float *gamma, const float *mean, const float *rstd,
                                  int n, int c)
{
    BEGIN;
    const size_t nc = nz(n) * nz(c);
    float *fd = IN(dout, nc), *fx = IN(x, nc);
    CALL(sbprt_layernorm_backward(ctx, OUT(dx, nc), dgamma, dbeta, fd, fx, gamma, mean, rstd, n,
                                  c));
}

int sbprt_rmsnorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *rstd,
                               const sbprt_bf16 *x, const float *gamma, int n, int c, float eps)
{
    BEGIN;
    const size_t nc = nz(n) * nz(c);
    float *fx = IN(x, nc);
    CALL(sbprt_rmsnorm_forward(ctx, OUT(out, nc), rstd, fx, gamma, n, c, eps));
}

int sbprt_rmsnorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma,
                                const sbprt_bf16 *dout, const sbprt_bf16 *x, const float *gamma,
                                const float *rstd, int n, int c)
{
    BEGIN;
    const size_t nc = nz(n) * nz(c);
    float *fd = IN(dout, nc), *fx = IN(x, nc);
    CALL(sbprt_rmsnorm_backward(ctx, OUT(dx, nc), dgamma, fd, fx, gamma, rstd, n, c));
}

int sbprt_rope_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x,
                            const int32_t *pos, const float *cos_tab, const float *sin_tab,
                            int rows, int heads, int head_dim, int rot_dim, int max_pos)
{
    BEGIN;
    const size_t n = nz(rows) * nz(heads) * nz(head_dim);
    float *fx = IN(x, n);
    CALL(sbprt_rope_forward(ctx, OUT(out, n), fx, pos, cos_tab, sin_tab, rows, heads, head_dim,
                            rot_dim, max_pos));
}

int sbprt_rope_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const int32_t *pos, const float *cos_tab, const float *sin_tab,
                             int rows, int heads, int head_dim, int rot_dim, int max_pos)
{
    BEGIN;
    const size_t n = nz(rows) * nz(heads) * nz(head_dim);
    float *fd = IN(dout, n);
    CALL(sbprt_rope_backward(ctx, OUT(dx, n), fd, pos, cos_tab, sin_tab, rows, heads, head_dim,
                             rot_dim, max_pos));
}

/* ---- attention, loss ---------------------------------------------------------------------- */

int sbprt_attention_forward_packed_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                        const sbprt_bf16 *q, const sbprt_bf16 *k,
                                        const sbprt_bf16 *v, const int32_t *doc_start, int b,
                                        int t_, int tk, int hq, int hkv, int d, int q_start,
                                        float scale, int window, float softcap)
{
    BEGIN;
    const size_t nq = nz(b) * nz(t_) * nz(hq) * nz(d), nkv = nz(b) * nz(tk) * nz(hkv) * nz(d);
    float *fq = nq ? IN(q, nq) : NULL, *fk = nq ? IN(k, nkv) : NULL;
    float *fv = nq ? IN(v, nkv) : NULL;
    CALL(sbprt_attention_forward_packed(ctx, nq ? OUT(out, nq) : NULL, lse, fq, fk, fv,
                                        doc_start, b, t_, tk, hq, hkv, d, q_start, scale, window,
                                        softcap));
}

int sbprt_attention_forward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                    const sbprt_bf16 *q, const sbprt_bf16 *k,
                                    const sbprt_bf16 *v, int b, int t_, int tk, int hq, int hkv,
                                    int d, int q_start, float scale, int window, float softcap)
{
    return sbprt_attention_forward_packed_bf16(ctx, out, lse, q, k, v, NULL, b, t_, tk, hq, hkv,
                                               d, q_start, scale, window, softcap);
}

int sbprt_attention_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                 const sbprt_bf16 *q, const sbprt_bf16 *k, const sbprt_bf16 *v,
                                 int b, int t_, int tk, int hq, int hkv, int d, int q_start,
                                 float scale)
{
    return sbprt_attention_forward_ex_bf16(ctx, out, lse, q, k, v, b, t_, tk, hq, hkv, d, q_start,
                                           scale, 0, 0.0f);
}

int sbprt_attention_backward_packed_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                         sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                         const sbprt_bf16 *q, const sbprt_bf16 *k,
                                         const sbprt_bf16 *v, const sbprt_bf16 *out,
                                         const float *lse, const int32_t *doc_start, int b,
                                         int t_, int tk, int hq, int hkv, int d, int q_start,
                                         float scale, int window, float softcap)
{
    BEGIN;
    const size_t nq = nz(b) * nz(t_) * nz(hq) * nz(d), nkv = nz(b) * nz(tk) * nz(hkv) * nz(d);
    if (nq == 0)
        return sbprt_attention_backward_packed(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               NULL, lse, doc_start, b, t_, tk, hq, hkv, d,
                                               q_start, scale, window, softcap);
    float *fdo = IN(dout, nq), *fq = IN(q, nq), *fk = IN(k, nkv), *fv = IN(v, nkv);
    float *fo = IN(out, nq);
    float *gq = OUT(dq, nq), *gk = OUT(dk, nkv), *gv = OUT(dv, nkv);
    CALL(sbprt_attention_backward_packed(ctx, gq, gk, gv, fdo, fq, fk, fv, fo, lse, doc_start, b,
                                         t_, tk, hq, hkv, d, q_start, scale, window, softcap));
}

int sbprt_attention_backward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                     sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                     const sbprt_bf16 *q, const sbprt_bf16 *k,
                                     const sbprt_bf16 *v, const sbprt_bf16 *out,
                                     const float *lse, int b, int t_, int tk, int hq, int hkv,
                                     int d, int q_start, float scale, int window, float softcap)
{
    return sbprt_attention_backward_packed_bf16(ctx, dq, dk, dv, dout, q, k, v, out, lse, NULL,
                                                b, t_, tk, hq, hkv, d, q_start, scale, window,
                                                softcap);
}

int sbprt_attention_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                  sbprt_bf16 *dv, const sbprt_bf16 *dout, const sbprt_bf16 *q,
                                  const sbprt_bf16 *k, const sbprt_bf16 *v,
                                  const sbprt_bf16 *out, const float *lse, int b, int t_, int tk,
                                  int hq, int hkv, int d, int q_start, float scale)
{
    return sbprt_attention_backward_ex_bf16(ctx, dq, dk, dv, dout, q, k, v, out, lse, b, t_, tk,
                                            hq, hkv, d, q_start, scale, 0, 0.0f);
}

int sbprt_cross_entropy_forward_backward_bf16(sbprt_ctx *ctx, float *loss_sum,
                                              sbprt_bf16 *dlogits, const sbprt_bf16 *logits,
                                              const int32_t *labels, int n, int v, float scale)
{
    BEGIN;
    const size_t nv = nz(n) * nz(v);
    float *fl = IN(logits, nv);
    CALL(sbprt_cross_entropy_forward_backward(ctx, loss_sum, OUT(dlogits, nv), fl, labels, n, v,
                                              scale));
}

/* ---- layout and broadcasting -------------------------------------------------------------- */

int sbprt_permute_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, int rank,
                               const int *dims, const int *perm)
{
    BEGIN;
    const size_t n = rank >= 0 && rank <= 8 ? prod(rank, dims) : 0;
    float *fx = IN(x, n);
    CALL(sbprt_permute_forward(ctx, OUT(out, n), fx, rank, dims, perm));
}

int sbprt_permute_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                int rank, const int *dims, const int *perm)
{
    BEGIN;
    const size_t n = rank >= 0 && rank <= 8 ? prod(rank, dims) : 0;
    float *fd = IN(dout, n);
    CALL(sbprt_permute_backward(ctx, OUT(dx, n), fd, rank, dims, perm));
}

int sbprt_copy_cols_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const sbprt_bf16 *src, int rows,
                         int w, int dst_ld, int dst_off, int src_ld, int src_off,
                         int accumulate)
{
    BEGIN;
    /* exactly the elements the call may touch: a slice of a larger buffer is common */
    const size_t nd = rows > 0 && w > 0 ? nz(rows - 1) * nz(dst_ld) + nz(dst_off) + nz(w) : 0;
    const size_t ns = rows > 0 && w > 0 ? nz(rows - 1) * nz(src_ld) + nz(src_off) + nz(w) : 0;
    float *fs = ns ? IN(src, ns) : NULL;
    CALL(sbprt_copy_cols(ctx, nd ? OUT(dst, nd) : NULL, fs, rows, w, dst_ld, dst_off, src_ld,
                         src_off, accumulate));
}

int sbprt_broadcast_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a,
                                 const sbprt_bf16 *b, int op, int rank, const int *dims,
                                 const int *a_dims, const int *b_dims)
{
    BEGIN;
    const int ok = rank >= 0 && rank <= 8;
    float *fa = IN(a, ok ? prod(rank, a_dims) : 0), *fb = IN(b, ok ? prod(rank, b_dims) : 0);
    CALL(sbprt_broadcast_forward(ctx, OUT(out, ok ? prod(rank, dims) : 0), fa, fb, op, rank, dims,
                                 a_dims, b_dims));
}

int sbprt_broadcast_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *da, sbprt_bf16 *db,
                                  const sbprt_bf16 *dout, const sbprt_bf16 *a,
                                  const sbprt_bf16 *b, int op, int rank, const int *dims,
                                  const int *a_dims, const int *b_dims)
{
    BEGIN;
    const int ok = rank >= 0 && rank <= 8;
    const size_t na = ok ? prod(rank, a_dims) : 0, nb = ok ? prod(rank, b_dims) : 0;
    float *fd = IN(dout, ok ? prod(rank, dims) : 0), *fa = IN(a, na), *fb = IN(b, nb);
    float *ga = OUT(da, na), *gb = OUT(db, nb);
    CALL(sbprt_broadcast_backward(ctx, ga, gb, fd, fa, fb, op, rank, dims, a_dims, b_dims));
}
