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
 *
 * Inner loops: a task copies its key tile (and, in the backward, its value tile) transposed
 * into [d, ATT_BC] scratch, so a row's scores for 16 keys at once accumulate over d in
 * vector registers instead of one horizontal reduction per key; with the P·V and gradient
 * updates (axpys over d) every hot loop vectorises without reassociating a sum.  A row's
 * arithmetic never depends on which other rows share its tile or where its chunk starts,
 * which is why a chunk's rows come out bitwise equal to the same rows of an unchunked call.
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

/* dst[c, jj] = src[jj * row_stride + c] for jj < nj: a K or V tile, transposed. */
static void att_transpose_tile(float *restrict dst, const float *restrict src, size_t row_stride,
                               int nj, int d)
{
    for (int jj = 0; jj < nj; jj++)
        for (int c = 0; c < d; c++)
            dst[(size_t)c * ATT_BC + jj] = src[jj * row_stride + c];
}

/* s[jj] = scale * (x · tile[:, jj]) for jj < n, tile being a transposed [d, ATT_BC] tile.
 * Keys go in blocks of 16 whose partial sums stay in registers across the whole c loop;
 * every s[jj] is summed over c in the same order in the block and in the remainder, so the
 * value never depends on n (that is, on the row's causal cut). */
static void att_row_scores(float *restrict s, const float *restrict x, const float *restrict tile,
                           int n, int d, float scale)
{
    int jj = 0;
    for (; jj + 16 <= n; jj += 16) {
        float a[16] = {0};
        for (int c = 0; c < d; c++) {
            const float xc = x[c];
            const float *tc = tile + (size_t)c * ATT_BC + jj;
#pragma GCC unroll 16 /* fully unrolled, a[] becomes registers */
            for (int l = 0; l < 16; l++)
                a[l] += xc * tc[l];
        }
        for (int l = 0; l < 16; l++)
            s[jj + l] = a[l] * scale;
    }
    for (; jj < n; jj++) {
        float a = 0;
        for (int c = 0; c < d; c++)
            a += x[c] * tile[(size_t)c * ATT_BC + jj];
        s[jj] = a * scale;
    }
}

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
    const size_t kv_row = (size_t)hkv * d; /* stride between consecutive keys */
    /* per thread: acc [ATT_BR, d], kt [d, ATT_BC], m [ATT_BR], l [ATT_BR], s [ATT_BC] */
    const size_t per_thread =
        att_round16((size_t)ATT_BR * d + (size_t)d * ATT_BC + 2 * ATT_BR + ATT_BC);
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
        float *kt = acc + (size_t)ATT_BR * d;
        float *m = kt + (size_t)d * ATT_BC, *l = m + ATT_BR, *s = l + ATT_BR;
        memset(acc, 0, (size_t)nr * d * sizeof(float));
        for (int r = 0; r < nr; r++) {
            m[r] = -INFINITY;
            l[r] = 0;
        }

        /* Keys [0, kend) are visible to some row of this tile; tiles past it are skipped. */
        const int kend = q_start + i0 + nr;
        for (int j0 = 0; j0 < kend; j0 += ATT_BC) {
            const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
            const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
            const float *vbase = v + (((size_t)bi * tk + j0) * hkv + g) * d;
            att_transpose_tile(kt, kbase, kv_row, j1 - j0, d);
            for (int r = 0; r < nr; r++) {
                const int pos = q_start + i0 + r;
                const int nj = (j1 < pos + 1 ? j1 : pos + 1) - j0; /* keys of the tile it sees */
                if (nj <= 0)
                    continue; /* the whole key tile lies after this row's position */
                att_row_scores(s, q + (((size_t)bi * t + i0 + r) * hq + h) * d, kt, nj, d, scale);
                float mt = -INFINITY;
                for (int jj = 0; jj < nj; jj++)
                    mt = s[jj] > mt ? s[jj] : mt;
                const float mnew = m[r] > mt ? m[r] : mt;
                const float alpha = expf(m[r] - mnew); /* 0 on the first tile (m = -inf) */
                float *ar = acc + (size_t)r * d;
                l[r] *= alpha;
                for (int c = 0; c < d; c++)
                    ar[c] *= alpha;
                for (int jj = 0; jj < nj; jj++) {
                    const float p = expf(s[jj] - mnew);
                    l[r] += p;
                    cpu_axpy(ar, p, vbase + jj * kv_row, d);
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
    const size_t kv_row = (size_t)hkv * d;
    const size_t nrows = (size_t)b * hq * t; /* delta has one entry per (b, h, i), as lse */
    /* per thread: kt, vt [d, ATT_BC]; s, dp [ATT_BC]; then acc [ATT_BR, d] (pass 1) or
     * dkacc, dvacc [ATT_BC, d] (pass 2) */
    const size_t acc_len = (size_t)(2 * ATT_BC > ATT_BR ? 2 * ATT_BC : ATT_BR) * d;
    const size_t per_thread = att_round16((size_t)2 * d * ATT_BC + 2 * ATT_BC + acc_len);
    float *scratch;
    st = cpu_scratch(ctx, (att_round16(nrows) + per_thread * ctx->nthreads) * sizeof(float),
                     (void **)&scratch);
    if (st)
        return st;
    float *delta = scratch; /* [b, hq, t] */
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
            float *kt = thread_base + per_thread * omp_get_thread_num();
            float *vt = kt + (size_t)d * ATT_BC;
            float *s = vt + (size_t)d * ATT_BC, *dp = s + ATT_BC;
            float *acc = dp + ATT_BC; /* [ATT_BR, d] */
            memset(acc, 0, (size_t)nr * d * sizeof(float));

            const int kend = q_start + i0 + nr;
            for (int j0 = 0; j0 < kend; j0 += ATT_BC) {
                const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
                const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
                att_transpose_tile(kt, kbase, kv_row, j1 - j0, d);
                att_transpose_tile(vt, v + (((size_t)bi * tk + j0) * hkv + g) * d, kv_row,
                                   j1 - j0, d);
                for (int r = 0; r < nr; r++) {
                    const int pos = q_start + i0 + r;
                    const int nj = (j1 < pos + 1 ? j1 : pos + 1) - j0;
                    if (nj <= 0)
                        continue;
                    const size_t qoff = (((size_t)bi * t + i0 + r) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i0 + r;
                    const float lse_r = lse[srow], delta_r = delta[srow];
                    att_row_scores(s, q + qoff, kt, nj, d, scale);
                    att_row_scores(dp, dout + qoff, vt, nj, d, 1.0f);
                    float *ar = acc + (size_t)r * d;
                    for (int jj = 0; jj < nj; jj++) {
                        const float p = expf(s[jj] - lse_r);
                        cpu_axpy(ar, p * (dp[jj] - delta_r), kbase + jj * kv_row, d);
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
            const int kt_idx = (int)(task % nkt);
            const int g = (int)(task / nkt % hkv);
            const int bi = (int)(task / nkt / hkv);
            const int j0 = kt_idx * ATT_BC;
            const int nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
            float *kt = thread_base + per_thread * omp_get_thread_num();
            float *vt = kt + (size_t)d * ATT_BC;
            float *s = vt + (size_t)d * ATT_BC, *dp = s + ATT_BC;
            float *dkacc = dp + ATT_BC;              /* [ATT_BC, d] */
            float *dvacc = dkacc + (size_t)ATT_BC * d; /* [ATT_BC, d] */
            memset(dkacc, 0, (size_t)2 * ATT_BC * d * sizeof(float));
            att_transpose_tile(kt, k + (((size_t)bi * tk + j0) * hkv + g) * d, kv_row, nc, d);
            att_transpose_tile(vt, v + (((size_t)bi * tk + j0) * hkv + g) * d, kv_row, nc, d);

            const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
            for (int hh = 0; hh < group; hh++) {
                const int h = g * group + hh;
                for (int i = ifirst; i < t; i++) {
                    const int pos = q_start + i;
                    const int nj = (j0 + nc < pos + 1 ? j0 + nc : pos + 1) - j0;
                    const size_t qoff = (((size_t)bi * t + i) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i;
                    const float lse_i = lse[srow], delta_i = delta[srow];
                    att_row_scores(s, q + qoff, kt, nj, d, scale);
                    att_row_scores(dp, dout + qoff, vt, nj, d, 1.0f);
                    for (int jj = 0; jj < nj; jj++) {
                        const float p = expf(s[jj] - lse_i);
                        cpu_axpy(dvacc + (size_t)jj * d, p, dout + qoff, d);
                        cpu_axpy(dkacc + (size_t)jj * d, p * (dp[jj] - delta_i), q + qoff, d);
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
