/*
 * attention.c — causal grouped-query self-attention over a chunk of query rows, forward and
 * backward, without ever holding a [t, tk] score matrix.
 *
 * Forward (FlashAttention style): a task is one (batch, query head, tile of ATT_BR query
 * rows).  It walks the key tiles of ATT_BC keys in order, stopping after the tile that holds
 * its last query row's position (later tiles are fully masked and never touched); inside a
 * tile each query row stops at its own position.  Each row keeps a running max m, running
 * sum l and an unnormalised output accumulator, rescaled by exp(m_old - m_new) when the max
 * grows (online softmax).  Output = acc / l, and lse = m + log l is saved.
 *
 * Backward (FlashAttention-2 recompute): delta = rowsum(dout ∘ out) is computed first; then
 * for any (query row i, key j) pair, P_ij = exp(scale q_i·k_j - lse_i) is recomputed exactly
 * as the forward saw it, dP_ij = dout_i·v_j and dS_ij = P_ij (dP_ij - delta_i).  Then
 *   dq_i += scale Σ_j dS_ij k_j,   dk_j += scale Σ_i dS_ij q_i,   dv_j += Σ_i P_ij dout_i.
 * GPU kernels usually produce dq with atomics from the key-tile loop; to stay deterministic
 * without atomics this backend runs two passes instead, each owning its outputs: pass 1 is
 * partitioned like the forward (by query tile) and writes dq; pass 2 is partitioned by
 * (batch, kv head, key tile) and visits every query head of the group and every query row
 * that can see the tile, so the GQA reduction over heads happens inside one task too.  The
 * price is computing the scores twice, which a CPU backend can afford; every output element
 * is summed in an order fixed by the tiling alone, so results do not depend on threads.
 */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"

#define ATT_BR 32 /* query rows per tile */
#define ATT_BC 64 /* keys per tile */

/* Per-thread scratch strides are rounded to 16 floats (64 bytes) so threads never share a
 * cache line. */
static size_t att_round16(size_t nfloats) { return (nfloats + 15) / 16 * 16; }

static int att_check(const float *q, const float *k, const float *v, int b, int t, int tk,
                     int hq, int hkv, int d, int q_start)
{
    if (b < 0 || t < 0 || tk < 0 || hq < 0 || hkv <= 0 || d <= 0 || q_start < 0)
        return SBPRT_ERR_INVALID;
    if (hq % hkv != 0 || (int64_t)q_start + t > tk)
        return SBPRT_ERR_INVALID;
    if (b > 0 && t > 0 && hq > 0 && (!q || !k || !v))
        return SBPRT_ERR_INVALID;
    return SBPRT_OK;
}

int sbprt_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                            const float *k, const float *v, int b, int t, int tk, int hq,
                            int hkv, int d, int q_start, float scale)
{
    CPU_CHECK(ctx);
    int st = att_check(q, k, v, b, t, tk, hq, hkv, d, q_start);
    if (st)
        return st;
    if (b == 0 || t == 0 || hq == 0)
        return SBPRT_OK;
    CPU_CHECK(out);

    const int group = hq / hkv;
    const int nqt = (t + ATT_BR - 1) / ATT_BR;
    const int64_t ntasks = (int64_t)b * hq * nqt;
    /* per thread: acc [ATT_BR, d], m [ATT_BR], l [ATT_BR], s [ATT_BC] */
    const size_t per_thread = att_round16((size_t)ATT_BR * d + 2 * ATT_BR + ATT_BC);
    float *scratch;
    st = cpu_scratch(ctx, per_thread * ctx->nthreads * sizeof(float), (void **)&scratch);
    if (st)
        return st;

#pragma omp parallel for schedule(static, 1) num_threads(ctx->nthreads)
    for (int64_t task = 0; task < ntasks; task++) {
        const int qt = (int)(task % nqt);
        const int h = (int)(task / nqt % hq);
        const int bi = (int)(task / nqt / hq);
        const int g = h / group;
        const int i0 = qt * ATT_BR;
        const int nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;

        float *acc = scratch + per_thread * omp_get_thread_num();
        float *m = acc + (size_t)ATT_BR * d, *l = m + ATT_BR, *s = l + ATT_BR;
        memset(acc, 0, (size_t)nr * d * sizeof(float));
        for (int r = 0; r < nr; r++) {
            m[r] = -INFINITY;
            l[r] = 0;
        }

        /* Keys [0, kend) are visible to some row of this tile; tiles past it are skipped. */
        const int kend = q_start + i0 + nr;
        for (int j0 = 0; j0 < kend; j0 += ATT_BC) {
            const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
            for (int r = 0; r < nr; r++) {
                const int pos = q_start + i0 + r;
                const int jmax = j1 < pos + 1 ? j1 : pos + 1;
                if (jmax <= j0)
                    continue; /* the whole key tile lies after this row's position */
                const float *qr = q + (((size_t)bi * t + i0 + r) * hq + h) * d;
                float mt = -INFINITY;
                for (int j = j0; j < jmax; j++) {
                    const float *kj = k + (((size_t)bi * tk + j) * hkv + g) * d;
                    s[j - j0] = scale * cpu_dot(qr, kj, d);
                    mt = s[j - j0] > mt ? s[j - j0] : mt;
                }
                const float mnew = m[r] > mt ? m[r] : mt;
                const float alpha = expf(m[r] - mnew); /* 0 on the first tile (m = -inf) */
                float *ar = acc + (size_t)r * d;
                l[r] *= alpha;
                for (int c = 0; c < d; c++)
                    ar[c] *= alpha;
                for (int j = j0; j < jmax; j++) {
                    const float p = expf(s[j - j0] - mnew);
                    l[r] += p;
                    cpu_axpy(ar, p, v + (((size_t)bi * tk + j) * hkv + g) * d, d);
                }
                m[r] = mnew;
            }
        }

        for (int r = 0; r < nr; r++) {
            float *orow = out + (((size_t)bi * t + i0 + r) * hq + h) * d;
            const float inv = 1.0f / l[r];
            for (int c = 0; c < d; c++)
                orow[c] = acc[(size_t)r * d + c] * inv;
            if (lse)
                lse[((size_t)bi * hq + h) * t + i0 + r] = m[r] + logf(l[r]);
        }
    }
    return SBPRT_OK;
}

int sbprt_attention_backward(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, int b, int t, int tk, int hq,
                             int hkv, int d, int q_start, float scale)
{
    CPU_CHECK(ctx);
    int st = att_check(q, k, v, b, t, tk, hq, hkv, d, q_start);
    if (st)
        return st;
    CPU_CHECK((dk == NULL) == (dv == NULL));
    if (b == 0 || t == 0 || hq == 0 || (!dq && !dk))
        return SBPRT_OK;
    CPU_CHECK(dout && out && lse);

    const int group = hq / hkv;
    const size_t nrows = (size_t)b * hq * t; /* delta has one entry per (b, h, i), as lse */
    const size_t per_thread = att_round16((size_t)2 * ATT_BC * d > (size_t)ATT_BR * d
                                              ? (size_t)2 * ATT_BC * d
                                              : (size_t)ATT_BR * d);
    float *scratch;
    st = cpu_scratch(ctx, (att_round16(nrows) + per_thread * ctx->nthreads) * sizeof(float),
                     (void **)&scratch);
    if (st)
        return st;
    float *delta = scratch;                       /* [b, hq, t] */
    float *thread_base = scratch + att_round16(nrows);

    /* delta[b, h, i] = dout[b, i, h, :] · out[b, i, h, :] */
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (nrows * d >= CPU_PARALLEL_MIN)
    for (int64_t row = 0; row < (int64_t)b * t; row++) {
        const int bi = (int)(row / t), i = (int)(row % t);
        for (int h = 0; h < hq; h++) {
            const size_t off = (((size_t)bi * t + i) * hq + h) * d;
            delta[((size_t)bi * hq + h) * t + i] = cpu_dot(dout + off, out + off, d);
        }
    }

    /* Pass 1: dq, one task per (batch, query head, query tile), as in the forward. */
    if (dq) {
        const int nqt = (t + ATT_BR - 1) / ATT_BR;
        const int64_t ntasks = (int64_t)b * hq * nqt;
#pragma omp parallel for schedule(static, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int qt = (int)(task % nqt);
            const int h = (int)(task / nqt % hq);
            const int bi = (int)(task / nqt / hq);
            const int g = h / group;
            const int i0 = qt * ATT_BR;
            const int nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;
            float *acc = thread_base + per_thread * omp_get_thread_num(); /* [ATT_BR, d] */
            memset(acc, 0, (size_t)nr * d * sizeof(float));

            const int kend = q_start + i0 + nr;
            for (int j0 = 0; j0 < kend; j0 += ATT_BC) {
                const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
                for (int r = 0; r < nr; r++) {
                    const int pos = q_start + i0 + r;
                    const int jmax = j1 < pos + 1 ? j1 : pos + 1;
                    const size_t qoff = (((size_t)bi * t + i0 + r) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i0 + r;
                    const float lse_r = lse[srow], delta_r = delta[srow];
                    float *ar = acc + (size_t)r * d;
                    for (int j = j0; j < jmax; j++) {
                        const size_t koff = (((size_t)bi * tk + j) * hkv + g) * d;
                        const float p = expf(scale * cpu_dot(q + qoff, k + koff, d) - lse_r);
                        const float dp = cpu_dot(dout + qoff, v + koff, d);
                        cpu_axpy(ar, p * (dp - delta_r), k + koff, d);
                    }
                }
            }
            for (int r = 0; r < nr; r++)
                cpu_axpy(dq + (((size_t)bi * t + i0 + r) * hq + h) * d, scale,
                         acc + (size_t)r * d, d);
        }
    }

    /* Pass 2: dk and dv, one task per (batch, kv head, key tile) over the keys the chunk
     * reads, summing over the group's query heads and every query row at or after the tile. */
    if (dk) {
        const int kend = q_start + t;
        const int nkt = (kend + ATT_BC - 1) / ATT_BC;
        const int64_t ntasks = (int64_t)b * hkv * nkt;
#pragma omp parallel for schedule(static, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int kt = (int)(task % nkt);
            const int g = (int)(task / nkt % hkv);
            const int bi = (int)(task / nkt / hkv);
            const int j0 = kt * ATT_BC;
            const int nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
            float *dkacc = thread_base + per_thread * omp_get_thread_num(); /* [ATT_BC, d] */
            float *dvacc = dkacc + (size_t)ATT_BC * d;                         /* [ATT_BC, d] */
            memset(dkacc, 0, (size_t)2 * ATT_BC * d * sizeof(float));

            const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
            for (int hh = 0; hh < group; hh++) {
                const int h = g * group + hh;
                for (int i = ifirst; i < t; i++) {
                    const int pos = q_start + i;
                    const int jmax = j0 + nc < pos + 1 ? j0 + nc : pos + 1;
                    const size_t qoff = (((size_t)bi * t + i) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i;
                    const float lse_i = lse[srow], delta_i = delta[srow];
                    for (int j = j0; j < jmax; j++) {
                        const size_t koff = (((size_t)bi * tk + j) * hkv + g) * d;
                        const float p = expf(scale * cpu_dot(q + qoff, k + koff, d) - lse_i);
                        const float dp = cpu_dot(dout + qoff, v + koff, d);
                        cpu_axpy(dvacc + (size_t)(j - j0) * d, p, dout + qoff, d);
                        cpu_axpy(dkacc + (size_t)(j - j0) * d, p * (dp - delta_i), q + qoff, d);
                    }
                }
            }
            for (int jj = 0; jj < nc; jj++) {
                const size_t koff = (((size_t)bi * tk + j0 + jj) * hkv + g) * d;
                cpu_axpy(dk + koff, scale, dkacc + (size_t)jj * d, d);
                cpu_axpy(dv + koff, 1.0f, dvacc + (size_t)jj * d, d);
            }
        }
    }
    return SBPRT_OK;
}
