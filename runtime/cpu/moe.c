/*
 * moe.c — a routed layer of SwiGLU experts (sbprt_moe_forward / sbprt_moe_backward).
 *
 * The work is sparse: the n*k (row, choice) pairs are counting-sorted by expert, stably (row,
 * then choice, within an expert), the selected rows are gathered into one contiguous copy in
 * that order, and every expert that received c > 0 rows runs one sbprt_gemm per matrix over
 * its own c rows.  The output is then combined per row over the k copies in choice order.
 * The backward recomputes the same sort and the gate/up activations from x (nothing but probs,
 * sel and wts is kept between the two calls), bitwise as the forward had them; it never
 * recomputes the experts' outputs: the routing weights' gradient is taken through the down
 * projection's input gradient (G · u below), which the backward forms anyway.  A forward without
 * y (a recomputation for the routing alone) runs the router and no expert.
 *
 * Determinism: the sort runs on one thread; every other loop is a static split over rows or
 * pairs (or experts, for the statistics) in which each item's result is computed in a fixed
 * order by one thread, and nothing is summed across items except by the GEMMs.  So results
 * depend on the thread count only through sbprt_gemm (see sbprt.h).
 *
 * LoRA on the experts (sbprt_moe_lora_forward / _backward) rides on the same sorted rows: each
 * adapted projection adds, per expert, the two thin GEMMs (rows · Aᵀ, then · Bᵀ times scale)
 * after the dense one, and in the backward the three of their gradients; PEFT's B, whose
 * columns interleave the experts, is copied expert-major first and its gradient scattered
 * back, so every operand is contiguous and no per-expert delta W is ever formed.
 *
 * All temporaries live in the caller's scratch (sbprt_moe_scratch_floats floats):
 * sbprt_moe_layout_plan (runtime/moe_layout.h, shared with the CUDA twin) carves it into
 * pieces whose offsets are multiples of 64 floats and checks, for the sizes given, that the
 * carving fits the formula.
 */
#include <math.h>
#include <stdint.h>

#include "cpu.h"
#include "moe_layout.h"

_Static_assert(sizeof(int32_t) == sizeof(float), "routing tables are int32 in float slots");

/* The same formulas as elementwise.c's SwiGLU, so an expert's product is bitwise what
 * sbprt_swiglu_forward / sbprt_swiglu_backward give. */
static inline float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static inline float moe_silu_grad(float x)
{
    float s = moe_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* Whether expert a ranks before expert b in the top-k order: the larger probability, and on
 * equal values the lower index (ONNX TopK).  A NaN ranks before nothing. */
static inline int moe_before(const float *p, int a, int b)
{
    return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* Softmax of one row of logits in place, its top-k and the routing weights.
 *   p: [e] (logits in, probabilities out)    sel, wts: [k] */
static void moe_route_row(float *p, int32_t *sel, float *wts, int e, int k, int norm_topk)
{
    float mx = p[0];
    for (int i = 1; i < e; i++)
        mx = p[i] > mx ? p[i] : mx;
    float s = 0;
    for (int i = 0; i < e; i++) {
        p[i] = expf(p[i] - mx);
        s += p[i];
    }
    for (int i = 0; i < e; i++)
        p[i] /= s;
    /* Each choice is the best expert ranked after the previous choice: k passes over the row
     * and no marks, since the order is total on non-NaN values. */
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < e; i++) {
            if (j > 0 && !moe_before(p, sel[j - 1], i))
                continue;
            if (best < 0 || moe_before(p, i, best))
                best = i;
        }
        if (best < 0) { /* only after a NaN: the lowest expert not chosen yet, so sel is valid */
            for (int i = 0; i < e && best < 0; i++) {
                int taken = 0;
                for (int jj = 0; jj < j; jj++)
                    taken |= sel[jj] == i;
                if (!taken)
                    best = i;
            }
        }
        sel[j] = best;
    }
    float vs = 0;
    for (int j = 0; j < k; j++) {
        wts[j] = p[sel[j]];
        vs += wts[j];
    }
    if (norm_topk)
        for (int j = 0; j < k; j++)
            wts[j] /= vs;
}

/* Stable counting sort of the pairs by expert: start [e + 1], order and pos [nk] (see
 * sbprt_moe_layout).  One thread, pairs in row-major order.  A sel value outside [0, e) gives
 * SBPRT_ERR_RANGE before anything but the counts is written. */
static int moe_sort(const int32_t *sel, size_t nk, int e, int32_t *start, int32_t *order,
                    int32_t *pos)
{
    for (int i = 0; i <= e; i++)
        start[i] = 0;
    for (size_t q = 0; q < nk; q++) {
        if (sel[q] < 0 || sel[q] >= e)
            return SBPRT_ERR_RANGE;
        start[sel[q] + 1]++;
    }
    for (int i = 0; i < e; i++)
        start[i + 1] += start[i];
    /* start[i] doubles as expert i's next free slot and is restored afterwards */
    for (size_t q = 0; q < nk; q++) {
        int32_t p = start[sel[q]]++;
        order[p] = (int32_t)q;
        pos[q] = p;
    }
    for (int i = e; i > 0; i--)
        start[i] = start[i - 1];
    start[0] = 0;
    return SBPRT_OK;
}

/* LoRA on the experts (sbprt_moe_lora_forward): the adapters, their gradients and where
 * their temporaries live.  NULL pointers: that projection is not adapted / no gradient. */
typedef struct moe_lora {
    const float *a1, *b1, *a2, *b2; /* [e r, d], [2f, r e], [e r, f], [d, r e] */
    float *da1, *db1, *da2, *db2;   /* their gradients (backward), same shapes */
    int r;
    float scale;
    sbprt_moe_lora_layout L;
} moe_lora;

/* b [out, r e] (PEFT's column j e + i for expert i's column j) copied expert-major into
 * bg [e, out, r], so that each expert's factor is one contiguous GEMM operand. */
static void moe_lora_gather_b(sbprt_ctx *ctx, float *bg, const float *b, int e, int out, int r)
{
    const int64_t rows = (int64_t)e * out;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)rows * r >= CPU_PARALLEL_MIN)
    for (int64_t q = 0; q < rows; q++) {
        int i = (int)(q / out), o = (int)(q % out);
        const float *src = b + (size_t)o * r * e + i;
        float *dst = bg + (size_t)q * r;
        for (int j = 0; j < r; j++)
            dst[j] = src[(size_t)j * e];
    }
}

/* The inverse of the gather, accumulating: b [out, r e] += the tiles db [e, out, r] of the
 * experts that received rows (the others' tiles were not written). */
static void moe_lora_scatter_b(sbprt_ctx *ctx, float *b, const float *db, const int32_t *start,
                               int e, int out, int r)
{
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)e * out * r >= CPU_PARALLEL_MIN)
    for (int o = 0; o < out; o++)
        for (int i = 0; i < e; i++) {
            if (start[i + 1] == start[i])
                continue;
            const float *src = db + ((size_t)i * out + o) * r;
            float *dst = b + (size_t)o * r * e + i;
            for (int j = 0; j < r; j++)
                dst[(size_t)j * e] += src[j];
        }
}

/* Expert i's first factor on its c rows u [c, in] (sorted positions from s0): t = u A_iᵀ
 * [c, r], kept in t (the backward's dB reads it). */
static int moe_lora_t(sbprt_ctx *ctx, float *t, const float *u, const float *a,
                      const moe_lora *lo, int i, int s0, int c, int in)
{
    const int r = lo->r;
    return sbprt_gemm(ctx, t + (size_t)s0 * r, u, a + (size_t)i * r * in, 0, 1, c, r, in, 1.0f,
                      0.0f);
}

/* Expert i's adapter on its c rows: t as moe_lora_t, then out [c, n_out] += scale · t B_iᵀ. */
static int moe_lora_apply(sbprt_ctx *ctx, float *out, float *t, const float *u, const float *a,
                          const float *bg, const moe_lora *lo, int i, int s0, int c, int in,
                          int n_out)
{
    const int r = lo->r;
    int st = moe_lora_t(ctx, t, u, a, lo, i, s0, c, in);
    if (st)
        return st;
    return sbprt_gemm(ctx, out, t + (size_t)s0 * r, bg + (size_t)i * n_out * r, 0, 1, c, n_out,
                      r, lo->scale, 1.0f);
}

/* The backward of one adapted projection of expert i: out = u Wᵀ + scale (u Aᵀ) Bᵀ, given
 * dout [c, n_out] (its rows of the sorted pairs from s0).  db's tile [n_out, r] = scale doutᵀ t
 * (written, scattered later); g = scale dout B [c, r] (kept for du); da [r, in] += gᵀ u.
 * du (the caller's dense product already in it) gets += g A afterwards: moe_lora_du. */
static int moe_lora_backward_w(sbprt_ctx *ctx, const float *dout, const float *u, float *t,
                               float *g, const float *bg, float *dbt, float *da, int need_g,
                               const moe_lora *lo, int i, int s0, int c, int in, int n_out)
{
    const int r = lo->r;
    const float *ti = t + (size_t)s0 * r;
    float *gi = g + (size_t)s0 * r;
    int st = SBPRT_OK;
    if (dbt)
        st = sbprt_gemm(ctx, dbt + (size_t)i * n_out * r, dout, ti, 1, 0, n_out, r, c,
                        lo->scale, 0.0f);
    if (!st && (need_g || da))
        st = sbprt_gemm(ctx, gi, dout, bg + (size_t)i * n_out * r, 0, 0, c, r, n_out,
                        lo->scale, 0.0f);
    if (!st && da)
        st = sbprt_gemm(ctx, da + (size_t)i * r * in, gi, u, 1, 0, r, in, c, 1.0f, 1.0f);
    return st;
}

/* du [c, in] += g A_i (g from moe_lora_backward_w). */
static int moe_lora_du(sbprt_ctx *ctx, float *du, const float *g, const float *a,
                       const moe_lora *lo, int i, int s0, int c, int in)
{
    return sbprt_gemm(ctx, du, g + (size_t)s0 * lo->r, a + (size_t)i * lo->r * in, 0, 0, c,
                      in, lo->r, 1.0f, 1.0f);
}

/* The experts over the sorted pairs: xs gathered from x, h = xs w1ᵀ, a = swiglu(h),
 * ye = a w2ᵀ, per expert one GEMM each over its rows.  Scratch pieces as sbprt_moe_layout.
 * down 0 (the backward's recomputation): ye is not formed, only the down adapter's x A_iᵀ,
 * since the backward takes dL/dwts through the down projection's input gradient instead.
 *   x: [n, d]    w1: [e, 2f, d]    w2: [e, d, f] */
static int moe_experts(sbprt_ctx *ctx, float *scratch, const sbprt_moe_layout *L,
                       const moe_lora *lo, const float *x, const float *w1, const float *w2,
                       int d, int e, int k, int f, int down)
{
    float *xs = scratch + L->xs, *h = scratch + L->h, *a = scratch + L->a;
    float *ye = scratch + L->ye;
    const int32_t *order = (const int32_t *)(scratch + L->order);
    const int32_t *start = (const int32_t *)(scratch + L->start);
    const int64_t nk = (int64_t)L->nk, f2 = 2 * (int64_t)f;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L->nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        const float *src = x + (size_t)(order[p] / k) * d;
        float *dst = xs + (size_t)p * d;
        for (int c = 0; c < d; c++)
            dst[c] = src[c];
    }
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        int st = sbprt_gemm(ctx, h + (size_t)start[i] * f2, xs + (size_t)start[i] * d,
                            w1 + (size_t)i * f2 * d, 0, 1, c, (int)f2, d, 1.0f, 0.0f);
        if (!st && lo && lo->a1)
            st = moe_lora_apply(ctx, h + (size_t)start[i] * f2, scratch + lo->L.t1,
                                xs + (size_t)start[i] * d, lo->a1, scratch + lo->L.bg1, lo, i,
                                start[i], c, d, (int)f2);
        if (st)
            return st;
    }
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L->nk * (size_t)f >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        const float *gate = h + (size_t)p * f2, *up = gate + f;
        float *ap = a + (size_t)p * f;
        for (int c = 0; c < f; c++)
            ap[c] = gate[c] * moe_sigmoid(gate[c]) * up[c];
    }
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0 || (!down && !(lo && lo->a2)))
            continue;
        if (!down) {
            int st = moe_lora_t(ctx, scratch + lo->L.t2, a + (size_t)start[i] * f, lo->a2, lo,
                                i, start[i], c, f);
            if (st)
                return st;
            continue;
        }
        int st = sbprt_gemm(ctx, ye + (size_t)start[i] * d, a + (size_t)start[i] * f,
                            w2 + (size_t)i * d * f, 0, 1, c, d, f, 1.0f, 0.0f);
        if (!st && lo && lo->a2)
            st = moe_lora_apply(ctx, ye + (size_t)start[i] * d, scratch + lo->L.t2,
                                a + (size_t)start[i] * f, lo->a2, scratch + lo->L.bg2, lo, i,
                                start[i], c, f, d);
        if (st)
            return st;
    }
    return SBPRT_OK;
}

/* Validates the adapters' arguments and fills lo (lo->r = 0: no LoRA); gathers b1, b2 into
 * their expert-major copies.  SBPRT_ERR_INVALID for an adapter without its pair or a rank
 * that does not fit. */
static int moe_lora_setup(sbprt_ctx *ctx, moe_lora *lo, float *scratch, const float *a1,
                          const float *b1, const float *a2, const float *b2, int n, int d,
                          int e, int k, int f, int r, float scale, int gather)
{
    *lo = (moe_lora){.a1 = a1, .b1 = b1, .a2 = a2, .b2 = b2, .r = r, .scale = scale};
    if (!a1 != !b1 || !a2 != !b2)
        return SBPRT_ERR_INVALID;
    if (!a1 && !a2) {
        lo->r = 0;
        return SBPRT_OK;
    }
    int st = sbprt_moe_lora_layout_plan(n, d, e, k, f, r, &lo->L);
    if (st || n == 0 || !scratch || !gather)
        return st;
    if (b1)
        moe_lora_gather_b(ctx, scratch + lo->L.bg1, b1, e, 2 * f, r);
    if (b2)
        moe_lora_gather_b(ctx, scratch + lo->L.bg2, b2, e, d, r);
    return SBPRT_OK;
}

int sbprt_moe_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel, float *wts,
                      float *stats, const float *x, const float *wr, const float *w1,
                      const float *w2, float *scratch, int n, int d, int e, int k, int f,
                      int norm_topk)
{
    return sbprt_moe_lora_forward(ctx, y, probs, sel, wts, stats, x, wr, w1, w2, NULL, NULL,
                                  NULL, NULL, scratch, n, d, e, k, f, norm_topk, 0, 0.0f);
}

int sbprt_moe_lora_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel, float *wts,
                           float *stats, const float *x, const float *wr, const float *w1,
                           const float *w2, const float *a1, const float *b1, const float *a2,
                           const float *b2, float *scratch, int n, int d, int e, int k, int f,
                           int norm_topk, int r, float scale)
{
    CPU_CHECK(ctx);
    sbprt_moe_layout L;
    int st = sbprt_moe_layout_plan(n, d, e, k, f, &L);
    if (st)
        return st;
    CPU_CHECK(n == 0 || scratch);
    moe_lora lo;
    if ((st = moe_lora_setup(ctx, &lo, scratch, a1, b1, a2, b2, n, d, e, k, f, r, scale,
                             y != NULL)))
        return st;
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(probs && sel && wts && x && wr && scratch && (!y || (w1 && w2)));

    /* router: logits straight into probs, then softmax and top-k per row */
    st = sbprt_gemm(ctx, probs, x, wr, 0, 1, n, e, d, 1.0f, 0.0f);
    if (st)
        return st;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e * k >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++)
        moe_route_row(probs + (size_t)r * e, sel + (size_t)r * k, wts + (size_t)r * k, e, k,
                      norm_topk);

    int32_t *start = (int32_t *)(scratch + L.start);
    int32_t *pos = (int32_t *)(scratch + L.pos);
    st = moe_sort(sel, L.nk, e, start, (int32_t *)(scratch + L.order), pos);
    if (st)
        return st; /* not reached: the routing above only writes valid experts */
    if (y) {
        st = moe_experts(ctx, scratch, &L, lo.r ? &lo : NULL, x, w1, w2, d, e, k, f, 1);
        if (st)
            return st;
    }

    /* y[r] = Σ_j wts[r, j] ye[pos(r, j)], j in order */
    const float *ye = scratch + L.ye;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (y && L.nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int r = 0; r < (y ? n : 0); r++) {
        float *yr = y + (size_t)r * d;
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)r * k + j;
            const float *src = ye + (size_t)pos[q] * d;
            float w = wts[q];
            if (j == 0)
                for (int c = 0; c < d; c++)
                    yr[c] = w * src[c];
            else
                for (int c = 0; c < d; c++) {
                    float t = w * src[c];
                    yr[c] += t;
                }
        }
    }

    /* The load-balancing sums: this call's share per expert in double (the probabilities
     * in row order), added to the fp32 totals once. */
    if (stats) {
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e >= CPU_PARALLEL_MIN)
        for (int i = 0; i < e; i++) {
            double ps = 0;
            for (int r = 0; r < n; r++)
                ps += probs[(size_t)r * e + i];
            stats[i] += (float)(double)(start[i + 1] - start[i]);
            stats[e + i] += (float)ps;
        }
    }
    return SBPRT_OK;
}

int sbprt_moe_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                       const float *dy, const float *x, const float *wr, const float *w1,
                       const float *w2, const float *probs, const int32_t *sel,
                       const float *wts, const float *stats, float *scratch, int n, int d,
                       int e, int k, int f, int norm_topk, float aux_scale)
{
    return sbprt_moe_lora_backward(ctx, dx, dwr, dw1, dw2, NULL, NULL, NULL, NULL, dy, x, wr,
                                   w1, w2, NULL, NULL, NULL, NULL, probs, sel, wts, stats,
                                   scratch, n, d, e, k, f, norm_topk, aux_scale, 0, 0.0f);
}

int sbprt_moe_lora_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                            float *da1, float *db1, float *da2, float *db2, const float *dy,
                            const float *x, const float *wr, const float *w1, const float *w2,
                            const float *a1, const float *b1, const float *a2, const float *b2,
                            const float *probs, const int32_t *sel, const float *wts,
                            const float *stats, float *scratch, int n, int d, int e, int k,
                            int f, int norm_topk, float aux_scale, int r, float scale)
{
    CPU_CHECK(ctx);
    sbprt_moe_layout L;
    int st = sbprt_moe_layout_plan(n, d, e, k, f, &L);
    if (st)
        return st;
    CPU_CHECK(n == 0 || scratch);
    moe_lora lo;
    if ((st = moe_lora_setup(ctx, &lo, scratch, a1, b1, a2, b2, n, d, e, k, f, r, scale, 1)))
        return st;
    if (n == 0)
        return SBPRT_OK;
    lo.da1 = a1 ? da1 : NULL;
    lo.db1 = a1 ? db1 : NULL;
    lo.da2 = a2 ? da2 : NULL;
    lo.db2 = a2 ? db2 : NULL;
    const int lora_g1 = lo.da1 || lo.db1, lora_g2 = lo.da2 || lo.db2;
    CPU_CHECK(dy && x && wr && w1 && w2 && probs && sel && wts && scratch);
    const int32_t *start = (const int32_t *)(scratch + L.start);
    const int32_t *order = (const int32_t *)(scratch + L.order);
    const int32_t *pos = (const int32_t *)(scratch + L.pos);
    st = moe_sort(sel, L.nk, e, (int32_t *)(scratch + L.start), (int32_t *)(scratch + L.order),
                  (int32_t *)(scratch + L.pos));
    if (st)
        return st;
    if (!dx && !dwr && !dw1 && !dw2 && !lora_g1 && !lora_g2)
        return SBPRT_OK;
    st = moe_experts(ctx, scratch, &L, lo.r ? &lo : NULL, x, w1, w2, d, e, k, f, 0);
    if (st)
        return st;

    float *xs = scratch + L.xs, *h = scratch + L.h, *a = scratch + L.a, *ye = scratch + L.ye;
    float *da = scratch + L.da, *dh = scratch + L.dh, *dw = scratch + L.dw;
    float *dz = scratch + L.dz;
    const int64_t nk = (int64_t)L.nk, f2 = 2 * (int64_t)f;

    /* The down projection.  With u the pair's activations and W its expert's effective down
     * projection (w2[i] + scale B_i A_i), the pair's output is wts · u Wᵀ; so, with G = dy[r] W
     * (dy unweighted), dL/dwts = G · u and dL/du = wts · G: the expert outputs are never
     * recomputed.  Then dw2[i] += dyeᵀ u with dye = wts dy[r]. */
    const int need_dh = dw1 || dx || lora_g1;
    const int need_g = need_dh || dwr;       /* G: for dh, and for dL/dwts (the router) */
    const int lora_gd = lo.a2 && (need_g || lo.da2);
    float *t1 = scratch + lo.L.t1, *t2 = scratch + lo.L.t2;
    float *g1 = scratch + lo.L.g1, *g2 = scratch + lo.L.g2;
    const int rr = lo.r;
    /* ye <- dy of each pair's row, in sorted order */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)d >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        const float *dyr = dy + (size_t)(order[p] / k) * d;
        float *yp = ye + (size_t)p * d;
        for (int c = 0; c < d; c++)
            yp[c] = dyr[c];
    }
    for (int i = 0; i < e && (need_g || lora_gd); i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        const float *dys_i = ye + (size_t)start[i] * d;
        float *da_i = da + (size_t)start[i] * f;
        if (lora_gd) { /* g = scale dy B_i, unweighted for now */
            st = sbprt_gemm(ctx, g2 + (size_t)start[i] * rr, dys_i,
                            scratch + lo.L.bg2 + (size_t)i * d * rr, 0, 0, c, rr, d, lo.scale,
                            0.0f);
            if (st)
                return st;
        }
        if (need_g) {
            st = sbprt_gemm(ctx, da_i, dys_i, w2 + (size_t)i * d * f, 0, 0, c, f, d, 1.0f, 0.0f);
            if (!st && lo.a2)
                st = moe_lora_du(ctx, da_i, g2, lo.a2, &lo, i, start[i], c, f);
            if (st)
                return st;
        }
    }
    /* per pair: dL/dwts = G · u, then G, dy and g take the routing weight */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)(d + f) >= CPU_PARALLEL_MIN)
    for (int64_t p = 0; p < nk; p++) {
        int32_t q = order[p];
        float w = wts[q];
        float *gp = da + (size_t)p * f, *yp = ye + (size_t)p * d;
        if (need_g) {
            dw[q] = cpu_dot(gp, a + (size_t)p * f, f);
            for (int c = 0; c < f; c++)
                gp[c] *= w;
        }
        for (int c = 0; c < d; c++)
            yp[c] *= w;
        if (lora_gd)
            for (int j = 0; j < rr; j++)
                g2[(size_t)p * rr + j] *= w;
    }
    /* the weight gradients: dw2[i] += dyeᵀ u, the adapter's dB tile = scale dyeᵀ t and
     * dA_i += gᵀ u */
    for (int i = 0; i < e; i++) {
        int c = start[i + 1] - start[i];
        if (c == 0)
            continue;
        const float *dye_i = ye + (size_t)start[i] * d, *a_i = a + (size_t)start[i] * f;
        if (dw2) {
            st = sbprt_gemm(ctx, dw2 + (size_t)i * d * f, dye_i, a_i, 1, 0, d, f, c, 1.0f, 1.0f);
            if (st)
                return st;
        }
        if (lo.db2) {
            st = sbprt_gemm(ctx, scratch + lo.L.db2 + (size_t)i * d * rr, dye_i,
                            t2 + (size_t)start[i] * rr, 1, 0, d, rr, c, lo.scale, 0.0f);
            if (st)
                return st;
        }
        if (lo.da2) {
            st = sbprt_gemm(ctx, lo.da2 + (size_t)i * rr * f, g2 + (size_t)start[i] * rr, a_i,
                            1, 0, rr, f, c, 1.0f, 1.0f);
            if (st)
                return st;
        }
    }
    if (lo.db2)
        moe_lora_scatter_b(ctx, lo.db2, scratch + lo.L.db2, start, e, d, lo.r);

    if (need_dh) {
        /* SwiGLU backward, written (dh is a temporary) */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)f >= CPU_PARALLEL_MIN)
        for (int64_t p = 0; p < nk; p++) {
            const float *gate = h + (size_t)p * f2, *up = gate + f, *dap = da + (size_t)p * f;
            float *dg = dh + (size_t)p * f2, *du = dg + f;
            for (int c = 0; c < f; c++) {
                dg[c] = dap[c] * up[c] * moe_silu_grad(gate[c]);
                du[c] = dap[c] * gate[c] * moe_sigmoid(gate[c]);
            }
        }
        /* up/gate projection: dw1[i] += dhᵀ xs, then dxs = dh w1[i] over xs (each expert's
         * rows of xs are read by its own dw1 product only, which comes first) */
        for (int i = 0; i < e; i++) {
            int c = start[i + 1] - start[i];
            if (c == 0)
                continue;
            const float *dh_i = dh + (size_t)start[i] * f2;
            float *xs_i = xs + (size_t)start[i] * d;
            if (lo.a1 && (lora_g1 || dx)) { /* before dxs overwrites xs_i */
                st = moe_lora_backward_w(ctx, dh_i, xs_i, t1, g1, scratch + lo.L.bg1,
                                         lo.db1 ? scratch + lo.L.db1 : NULL, lo.da1, dx != NULL,
                                         &lo, i, start[i], c, d, (int)f2);
                if (st)
                    return st;
            }
            if (dw1) {
                st = sbprt_gemm(ctx, dw1 + (size_t)i * f2 * d, dh_i, xs_i, 1, 0, (int)f2, d, c,
                                1.0f, 1.0f);
                if (st)
                    return st;
            }
            if (dx) {
                st = sbprt_gemm(ctx, xs_i, dh_i, w1 + (size_t)i * f2 * d, 0, 0, c, d, (int)f2,
                                1.0f, 0.0f);
                if (!st && lo.a1)
                    st = moe_lora_du(ctx, xs_i, g1, lo.a1, &lo, i, start[i], c, d);
                if (st)
                    return st;
            }
        }
        if (lo.db1)
            moe_lora_scatter_b(ctx, lo.db1, scratch + lo.L.db1, start, e, (int)f2, lo.r);
    }

    if (dx) {
        /* scatter-add: the k copies of row r summed in choice order, then added to dx[r] */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (L.nk * (size_t)d >= CPU_PARALLEL_MIN)
        for (int r = 0; r < n; r++) {
            const int32_t *pr = pos + (size_t)r * k;
            float *dxr = dx + (size_t)r * d;
            for (int c = 0; c < d; c++) {
                float s = 0;
                for (int j = 0; j < k; j++)
                    s += xs[(size_t)pr[j] * d + c];
                dxr[c] += s;
            }
        }
    }

    if (!dx && !dwr)
        return SBPRT_OK;
    /* Router, per row: dL/dv through the renormalisation w = v / s (dv_j = (dw_j -
     * Σ_i dw_i w_i) / s), scattered into dL/dp with the load-balancing term's aux_scale c_i
     * on every expert, then the softmax backward dz = p ⊙ (dp - dp · p). */
    const int aux = stats && aux_scale != 0.0f;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * e >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *pr = probs + (size_t)r * e;
        const int32_t *sr = sel + (size_t)r * k;
        const float *wr_ = wts + (size_t)r * k;
        float *dvr = dw + (size_t)r * k, *dzr = dz + (size_t)r * e;
        if (norm_topk) {
            float s = 0, g = 0;
            for (int j = 0; j < k; j++)
                s += pr[sr[j]];
            for (int j = 0; j < k; j++)
                g += dvr[j] * wr_[j];
            for (int j = 0; j < k; j++)
                dvr[j] = (dvr[j] - g) / s;
        }
        for (int i = 0; i < e; i++)
            dzr[i] = aux ? aux_scale * stats[i] : 0.0f;
        for (int j = 0; j < k; j++)
            dzr[sr[j]] += dvr[j];
        float g = cpu_dot(dzr, pr, e);
        for (int i = 0; i < e; i++)
            dzr[i] = pr[i] * (dzr[i] - g);
    }
    if (dwr) {
        st = sbprt_gemm(ctx, dwr, dz, x, 1, 0, e, d, n, 1.0f, 1.0f);
        if (st)
            return st;
    }
    if (dx) {
        st = sbprt_gemm(ctx, dx, dz, wr, 0, 0, n, d, e, 1.0f, 1.0f);
        if (st)
            return st;
    }
    return SBPRT_OK;
}
