/*
 * attention.cu — causal grouped-query attention over a chunk of query rows, forward and
 * backward, in fp32, without a [t, tk] buffer anywhere (FlashAttention-2 structure; the CPU
 * twin, cpu/attention.c, has the same tiling idea and the same two-pass backward).
 *
 * Tiles: ATT_BR = 32 query rows by ATT_BC = 32 keys, blocks of 8 warps.  Grids are ordered
 * so the blocks with the most work (late query tiles, early key tiles) start first.  Tiles live in shared
 * memory with an odd row stride ld = d | 1, so a warp reading one column of 32 rows (lane =
 * row) hits 32 different banks.  Supports d <= ATT_MAX_D (accumulators are registers).
 *
 * Forward: one block per (query tile, query head, batch).  Warp w owns rows 4w..4w+3 of the
 * tile.  For each key tile up to the one holding the tile's last position (later tiles are
 * fully masked and never loaded): lane j computes the scores of key j against the warp's four
 * rows; per row, the warp's max and sum (shuffle butterflies) give the online-softmax update
 * m, l and the rescale factor; the probabilities go to a per-warp shared buffer and each lane
 * accumulates output columns lane, lane + 32, ... over the row's visible keys.  Output is
 * acc / l, lse = m + log l.
 *
 * Backward, deterministic without atomics, in two passes like the CPU twin:
 *   delta[b, h, i] = dout · out (one warp per row);
 *   pass 1, one block per (query tile, query head, batch) as the forward: recompute
 *     P = exp(scale q·k - lse), dS = P (dout·v - delta) and accumulate dq over the key tiles
 *     in order;  dq += scale * acc;
 *   pass 2, one block per (key tile, kv head, batch): warp w owns keys 4w..4w+3; loop over
 *     the group's query heads and over the query tiles that can see the key tile (the ones at
 *     or after the diagonal), lane i = query row: recompute P and dS, then accumulate
 *     dv += Σ_i P dout_i and dk += Σ_i dS q_i in row order.  dk += scale * acc, dv += acc.
 * Every output element is summed in an order fixed by the tiling alone.
 *
 * Variants (the _ex entry points), as in the CPU twin: with a sliding window the forward and
 * pass 1 start at the key tile holding their first row's first key, pass 2's grid covers
 * only the key tiles the chunk reads and each block stops at the last query tile whose
 * windows still hold its keys, and inside a tile each row (key) is cut at both ends; so the
 * work is O(t * w).  Key rows before the first one a block can see are zero-filled, not
 * loaded.  Soft-capping turns a scaled score s into cap * tanh(s / cap) where the scores
 * are formed (forward, both passes), and the backward multiplies dS by 1 - tanh^2.
 *
 * Packed documents (the _packed entry points), as in the CPU twin: a row's first key is
 * max(doc_start[pos], pos - w + 1), still non-decreasing with the row, so the window's tile
 * skipping carries over (the forward and pass 1 start at their first row's first key; pass 2
 * stops at the first query row whose first key lies past the tile, found by bisection, and
 * counts each key's rows with a warp sum).  doc_start is on the device, so pass 2's grid
 * spans the window's key tiles and a block before its batch row's first document returns
 * at once.  A small kernel checks the chunk's doc_start first and raises the index flag on
 * a bad value; the kernels clamp it into [0, pos] so they never read outside their tensors.
 *
 * Tensor cores (the sections "the tensor-core forward" and "backward" below): head sizes
 * 64 and 128 with 16-byte aligned tensors run FlashAttention-2 style kernels on mma.sync
 * (mma.cuh), forward and both backward passes: 64 query rows or keys per block, 64-row
 * tiles through cp.async (double-buffered in the forward), bf16 storage on bf16 m16n8k16,
 * fp32 on 3xTF32 m16n8k8 (PyTorch's fp32 SDPA accuracy), every variant above, the same
 * determinism (no atomics, fixed orders).  Other head sizes run the scalar kernels, which
 * stay the tested fallback.
 */
#include "cuda.h"
#include "mma.cuh"

#include <mutex>

#define ATT_BR 32 /* query rows per tile */
#define ATT_BC 32 /* keys per tile (= lanes: lane j scores key j) */
#define ATT_THREADS 256
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_RPW (ATT_BR / ATT_WARPS) /* query rows (forward, pass 1) or keys (pass 2) per warp */
#define ATT_MAXU 8                   /* output columns per lane: lane + 32u, u < ATT_MAXU */
#define ATT_MAX_D (32 * ATT_MAXU)
#define ATT_DEFAULT_SMEM (48 * 1024) /* static + dynamic beyond it: the kernel must opt in */
/* static shared memory of the kernels (the per-warp P / dS buffers), at most */
#define ATT_STATIC_SMEM (2 * sizeof(float) * ATT_WARPS * ATT_RPW * ATT_BC)

static_assert(ATT_RPW * ATT_WARPS == ATT_BR && ATT_BR == ATT_BC && ATT_BC == 32, "tile shape");

/* Copies rows [n0, n) of a tile (src: its row 0; row stride `stride` in global memory, d
 * columns) into shared memory with stride ld, zero-filling rows 0..n0-1 (keys before the
 * window, never read) and n..nrows-1. */
template <class T>
__device__ __forceinline__ void att_load_tile(float *dst, const T *src, size_t stride, int n0,
                                              int n, int nrows, int d, int ld)
{
    for (int e = threadIdx.x; e < nrows * d; e += blockDim.x) {
        const int r = e / d, c = e - r * d;
        dst[r * ld + c] = r >= n0 && r < n ? (float)src[r * stride + c] : 0.0f;
    }
}

/* The first key a query at absolute position pos attends: the start of its document (docs:
 * the batch row's doc_start, NULL for one document per row), moved up to pos - window + 1
 * by a sliding window (the host reduces a window >= q_start + t to 0, so nothing
 * overflows).  A bad doc_start is clamped into [0, pos] so that no kernel reads outside its
 * tensors (att_docs_check_kernel has flagged it).  Non-decreasing in pos for a valid
 * doc_start, so a tile's first row has the tile's smallest first key. */
__host__ __device__ __forceinline__ int att_lo(const int32_t *docs, int pos, int window)
{
    int lo = docs ? docs[pos] : 0;
    lo = lo < 0 ? 0 : lo > pos ? pos : lo;
    return window > 0 && pos - window + 1 > lo ? pos - window + 1 : lo;
}

/* One past the last query row (chunk-relative, at most t) that sees key jlast, from row
 * ifirst (the first row at or after the key tile's first key): with documents by bisection,
 * since att_lo grows with the row; else the last row whose window holds jlast. */
__device__ __forceinline__ int att_row_end(const int32_t *docs, int jlast, int window,
                                           int q_start, int ifirst, int t)
{
    if (docs) {
        int a = ifirst, z = t;
        while (a < z) {
            const int mid = a + (z - a) / 2;
            if (att_lo(docs, q_start + mid, window) <= jlast)
                a = mid + 1;
            else
                z = mid;
        }
        return a;
    }
    if (window <= 0)
        return t;
    const long long end = (long long)jlast + window - q_start;
    return end < t ? (int)end : t;
}

/* The scaled score s = scale * q·k, soft-capped when cap > 0; *dcap = 1 - tanh^2 (the
 * cap's derivative; 1 without a cap). */
__device__ __forceinline__ float att_score(float dot, float scale, float cap, float *dcap)
{
    const float s = dot * scale;
    if (cap > 0) {
        const float th = tanhf(s / cap);
        *dcap = 1.0f - th * th;
        return cap * th;
    }
    *dcap = 1.0f;
    return s;
}

template <class T>
__global__ __launch_bounds__(ATT_THREADS) void att_forward_kernel(
    T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc_start, int t,
    int tk, int hq, int hkv, int d, int q_start, float scale, int window, float cap)
{
    CU_SHARED_DYN(float, sm);
    CU_SHARED(float, pbuf, ATT_WARPS * ATT_RPW * ATT_BC);
    const int ld = d | 1;
    float *qs = sm, *ks = qs + ATT_BR * ld, *vs = ks + ATT_BC * ld;
    /* the last query tiles see the most keys: start them first, the short ones fill in */
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, bi = blockIdx.z;
    const int g = h / (hq / hkv);
    const int i0 = qt * ATT_BR, nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *pw = pbuf + w * ATT_RPW * ATT_BC;
    const size_t q_row = (size_t)hq * d, kv_row = (size_t)hkv * d;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;

    att_load_tile(qs, q + ((size_t)bi * t + i0) * q_row + (size_t)h * d, q_row, 0, nr, ATT_BR, d,
                  ld);

    float m[ATT_RPW], l[ATT_RPW], acc[ATT_RPW][ATT_MAXU];
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        m[r] = -INFINITY;
        l[r] = 0;
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++)
            acc[r][u] = 0;
    }

    /* keys [kfirst, kend) are visible to some row of the tile; other key tiles are skipped */
    const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
    int rlo[ATT_RPW]; /* the first key of each of the warp's rows */
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        const int row = w * ATT_RPW + r;
        rlo[r] = row < nr ? att_lo(docs, q_start + i0 + row, window) : 0;
    }
    for (int j0 = kfirst / ATT_BC * ATT_BC; j0 < kend; j0 += ATT_BC) {
        const int nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
        const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
        __syncthreads(); /* the previous tile is no longer read */
        const size_t kv_off = ((size_t)bi * tk + j0) * kv_row + (size_t)g * d;
        att_load_tile(ks, k + kv_off, kv_row, js, nc, ATT_BC, d, ld);
        att_load_tile(vs, v + kv_off, kv_row, js, nc, ATT_BC, d, ld);
        __syncthreads();

        float s[ATT_RPW];
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++)
            s[r] = 0;
        for (int c = 0; c < d; c++) {
            const float kc = ks[lane * ld + c];
#pragma unroll
            for (int r = 0; r < ATT_RPW; r++)
                s[r] += qs[(w * ATT_RPW + r) * ld + c] * kc;
        }

        /* row r sees keys [ja[r], jb[r]) of the tile (empty: ja = jb = 0) */
        int ja[ATT_RPW], jb[ATT_RPW], jmin = ATT_BC, jmax = 0;
        float alpha[ATT_RPW];
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++) {
            const int row = w * ATT_RPW + r, pos = q_start + i0 + row;
            const int lo = rlo[r] - j0, hi = pos + 1 - j0;
            ja[r] = lo > 0 ? lo : 0;
            jb[r] = hi < nc ? hi : nc;
            if (row >= nr || jb[r] <= ja[r])
                ja[r] = jb[r] = 0;
            float p = 0;
            alpha[r] = 1;
            if (jb[r] > 0) { /* warp-uniform */
                float dcap;
                const float sc = att_score(s[r], scale, cap, &dcap);
                const float sv = lane >= ja[r] && lane < jb[r] ? sc : -INFINITY;
                const float mnew = fmaxf(m[r], cu_warp_max(sv));
                alpha[r] = expf(m[r] - mnew); /* 0 on the row's first tile (m = -inf) */
                p = lane >= ja[r] && lane < jb[r] ? expf(sv - mnew) : 0.0f;
                l[r] = l[r] * alpha[r] + cu_warp_sum(p);
                m[r] = mnew;
                jmin = ja[r] < jmin ? ja[r] : jmin;
                jmax = jb[r] > jmax ? jb[r] : jmax;
            }
            pw[r * ATT_BC + lane] = p;
        }
        __syncwarp();
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++)
#pragma unroll
            for (int u = 0; u < ATT_MAXU; u++)
                acc[r][u] *= alpha[r];
        for (int jj = jmin; jj < jmax; jj++) {
#pragma unroll
            for (int u = 0; u < ATT_MAXU; u++) {
                const int c = lane + 32 * u;
                if (c < d) {
                    const float vv = vs[jj * ld + c];
#pragma unroll
                    for (int r = 0; r < ATT_RPW; r++)
                        if (jj >= ja[r] && jj < jb[r])
                            acc[r][u] += pw[r * ATT_BC + jj] * vv;
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        const int row = w * ATT_RPW + r;
        if (row >= nr)
            continue;
        T *orow = out + ((size_t)bi * t + i0 + row) * q_row + (size_t)h * d;
        const float inv = 1.0f / l[r];
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++) {
            const int c = lane + 32 * u;
            if (c < d)
                orow[c] = acc[r][u] * inv;
        }
        if (lse && lane == 0)
            lse[((size_t)bi * hq + h) * t + i0 + row] = m[r] + logf(l[r]);
    }
}

/* delta[b, h, i] = dout[b, i, h, :] · out[b, i, h, :], one warp per (b, i, h). */
template <class T>
__global__ void att_delta_kernel(float *delta, const T *dout, const T *out, int t, int hq,
                                 int d, size_t nrows)
{
    const size_t row = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= nrows) /* whole warps */
        return;
    const T *a = dout + row * d, *b = out + row * d;
    float s = 0;
    for (int c = lane; c < d; c += 32)
        s += a[c] * b[c];
    s = cu_warp_sum(s);
    if (lane == 0) {
        const size_t h = row % hq, bi_i = row / hq; /* row = (bi * t + i) * hq + h */
        const size_t bi = bi_i / t, i = bi_i % t;
        delta[(bi * hq + h) * t + i] = s;
    }
}

/* Pass 1: dq for one (query tile, query head, batch). */
template <class T>
__global__ __launch_bounds__(ATT_THREADS) void att_dq_kernel(
    T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
    const float *delta, const int32_t *doc_start, int t, int tk, int hq, int hkv, int d,
    int q_start, float scale, int window, float cap)
{
    CU_SHARED_DYN(float, sm);
    CU_SHARED(float, dsbuf, ATT_WARPS * ATT_RPW * ATT_BC);
    const int ld = d | 1;
    float *qs = sm, *dos = qs + ATT_BR * ld, *ks = dos + ATT_BR * ld, *vs = ks + ATT_BC * ld;
    /* the last query tiles see the most keys: start them first, the short ones fill in */
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, bi = blockIdx.z;
    const int g = h / (hq / hkv);
    const int i0 = qt * ATT_BR, nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *dsw = dsbuf + w * ATT_RPW * ATT_BC;
    const size_t q_row = (size_t)hq * d, kv_row = (size_t)hkv * d;
    const size_t q_off = ((size_t)bi * t + i0) * q_row + (size_t)h * d;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;

    att_load_tile(qs, q + q_off, q_row, 0, nr, ATT_BR, d, ld);
    att_load_tile(dos, dout + q_off, q_row, 0, nr, ATT_BR, d, ld);

    float lse_r[ATT_RPW], delta_r[ATT_RPW], acc[ATT_RPW][ATT_MAXU];
    int rlo[ATT_RPW]; /* the first key of each of the warp's rows */
#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        const int row = w * ATT_RPW + r;
        const size_t srow = ((size_t)bi * hq + h) * t + i0 + row;
        lse_r[r] = row < nr ? lse[srow] : 0.0f;
        delta_r[r] = row < nr ? delta[srow] : 0.0f;
        rlo[r] = row < nr ? att_lo(docs, q_start + i0 + row, window) : 0;
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++)
            acc[r][u] = 0;
    }

    const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
    for (int j0 = kfirst / ATT_BC * ATT_BC; j0 < kend; j0 += ATT_BC) {
        const int nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
        const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
        __syncthreads();
        const size_t kv_off = ((size_t)bi * tk + j0) * kv_row + (size_t)g * d;
        att_load_tile(ks, k + kv_off, kv_row, js, nc, ATT_BC, d, ld);
        att_load_tile(vs, v + kv_off, kv_row, js, nc, ATT_BC, d, ld);
        __syncthreads();

        float s[ATT_RPW], dp[ATT_RPW];
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++)
            s[r] = dp[r] = 0;
        for (int c = 0; c < d; c++) {
            const float kc = ks[lane * ld + c], vc = vs[lane * ld + c];
#pragma unroll
            for (int r = 0; r < ATT_RPW; r++) {
                s[r] += qs[(w * ATT_RPW + r) * ld + c] * kc;
                dp[r] += dos[(w * ATT_RPW + r) * ld + c] * vc;
            }
        }

        int ja[ATT_RPW], jb[ATT_RPW], jmin = ATT_BC, jmax = 0;
#pragma unroll
        for (int r = 0; r < ATT_RPW; r++) {
            const int row = w * ATT_RPW + r, pos = q_start + i0 + row;
            const int lo = rlo[r] - j0, hi = pos + 1 - j0;
            ja[r] = lo > 0 ? lo : 0;
            jb[r] = hi < nc ? hi : nc;
            if (row >= nr || jb[r] <= ja[r])
                ja[r] = jb[r] = 0;
            float ds = 0;
            if (lane >= ja[r] && lane < jb[r]) {
                float dcap;
                const float p = expf(att_score(s[r], scale, cap, &dcap) - lse_r[r]);
                ds = p * (dp[r] - delta_r[r]);
                if (cap > 0)
                    ds *= dcap;
            }
            dsw[r * ATT_BC + lane] = ds;
            if (jb[r] > 0) {
                jmin = ja[r] < jmin ? ja[r] : jmin;
                jmax = jb[r] > jmax ? jb[r] : jmax;
            }
        }
        __syncwarp();
        for (int jj = jmin; jj < jmax; jj++) {
#pragma unroll
            for (int u = 0; u < ATT_MAXU; u++) {
                const int c = lane + 32 * u;
                if (c < d) {
                    const float kv = ks[jj * ld + c];
#pragma unroll
                    for (int r = 0; r < ATT_RPW; r++)
                        if (jj >= ja[r] && jj < jb[r])
                            acc[r][u] += dsw[r * ATT_BC + jj] * kv;
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < ATT_RPW; r++) {
        const int row = w * ATT_RPW + r;
        if (row >= nr)
            continue;
        T *dqrow = dq + ((size_t)bi * t + i0 + row) * q_row + (size_t)h * d;
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++) {
            const int c = lane + 32 * u;
            if (c < d)
                dqrow[c] += scale * acc[r][u];
        }
    }
}

/* Pass 2: dk, dv for one (key tile, kv head, batch) over every query row that sees it. */
template <class T>
__global__ __launch_bounds__(ATT_THREADS) void att_dkdv_kernel(
    T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
    const float *lse, const float *delta, const int32_t *doc_start, int t, int tk, int hq,
    int hkv, int d, int q_start, float scale, int window, float cap)
{
    CU_SHARED_DYN(float, sm);
    CU_SHARED(float, pbuf, ATT_WARPS * ATT_RPW * ATT_BR);
    CU_SHARED(float, dsbuf, ATT_WARPS * ATT_RPW * ATT_BR);
    const int ld = d | 1;
    float *ks = sm, *vs = ks + ATT_BC * ld, *qs = vs + ATT_BC * ld, *dos = qs + ATT_BR * ld;
    const int group = hq / hkv;
    /* the grid starts at the window's first key, which bounds every batch row's klo */
    const int kt = att_lo(NULL, q_start, window) / ATT_BC + blockIdx.x, g = blockIdx.y,
              bi = blockIdx.z;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
    const int klo = att_lo(docs, q_start, window), kend = q_start + t; /* keys the chunk reads */
    const int j0 = kt * ATT_BC, nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
    if (j0 + nc <= klo)
        return; /* the whole block: the tile lies before the chunk's first document */
    const int js = klo > j0 ? klo - j0 : 0; /* keys before js: never read */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float *pw = pbuf + w * ATT_RPW * ATT_BR, *dsw = dsbuf + w * ATT_RPW * ATT_BR;
    const size_t q_row = (size_t)hq * d, kv_row = (size_t)hkv * d;
    const size_t kv_off = ((size_t)bi * tk + j0) * kv_row + (size_t)g * d;

    att_load_tile(ks, k + kv_off, kv_row, js, nc, ATT_BC, d, ld);
    att_load_tile(vs, v + kv_off, kv_row, js, nc, ATT_BC, d, ld);

    float acck[ATT_RPW][ATT_MAXU], accv[ATT_RPW][ATT_MAXU];
#pragma unroll
    for (int kk = 0; kk < ATT_RPW; kk++)
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++)
            acck[kk][u] = accv[kk][u] = 0;

    /* Query rows before ifirst sit before the tile's first key, rows from iend on past the
     * window of its last key: they see none of it. */
    const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
    const int iend = att_row_end(docs, j0 + nc - 1, window, q_start, ifirst, t);
    for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        for (int i0 = ifirst / ATT_BR * ATT_BR; i0 < iend; i0 += ATT_BR) {
            const int nr = iend - i0 < ATT_BR ? iend - i0 : ATT_BR;
            __syncthreads(); /* the previous query tile is no longer read */
            const size_t q_off = ((size_t)bi * t + i0) * q_row + (size_t)h * d;
            att_load_tile(qs, q + q_off, q_row, 0, nr, ATT_BR, d, ld);
            att_load_tile(dos, dout + q_off, q_row, 0, nr, ATT_BR, d, ld);
            __syncthreads();

            /* lane = query row i0 + lane; the warp's keys j0 + 4w + kk */
            float s[ATT_RPW], dp[ATT_RPW];
#pragma unroll
            for (int kk = 0; kk < ATT_RPW; kk++)
                s[kk] = dp[kk] = 0;
            for (int c = 0; c < d; c++) {
                const float qc = qs[lane * ld + c], oc = dos[lane * ld + c];
#pragma unroll
                for (int kk = 0; kk < ATT_RPW; kk++) {
                    s[kk] += qc * ks[(w * ATT_RPW + kk) * ld + c];
                    dp[kk] += oc * vs[(w * ATT_RPW + kk) * ld + c];
                }
            }
            float lse_i = 0, delta_i = 0;
            int lo_i = 0x7fffffff; /* the lane's row's first key (none past nr) */
            if (lane < nr) {
                const size_t srow = ((size_t)bi * hq + h) * t + i0 + lane;
                lse_i = lse[srow];
                delta_i = delta[srow];
                if (docs)
                    lo_i = att_lo(docs, q_start + i0 + lane, window);
            }
            /* key jj is seen by the rows [ilo, ihi) of the tile: rows i >= key - q_start,
             * and with a window rows i < key + window - q_start (empty: ilo = ihi = nr) */
            int ilo[ATT_RPW], ihi[ATT_RPW], ilo_min = nr, ihi_max = 0;
#pragma unroll
            for (int kk = 0; kk < ATT_RPW; kk++) {
                const int jj = w * ATT_RPW + kk;
                const int first = j0 + jj - q_start - i0;
                ilo[kk] = first > 0 ? (first < nr ? first : nr) : 0;
                ihi[kk] = nr;
                if (docs) /* first keys grow with the row: the rows up to the key's count */
                    ihi[kk] = cu_warp_sum(lo_i <= j0 + jj ? 1 : 0);
                else if (window > 0) {
                    const long long last = (long long)j0 + jj + window - q_start - i0;
                    ihi[kk] = last < nr ? (last > 0 ? (int)last : 0) : nr;
                }
                if (jj < js || jj >= nc || ihi[kk] <= ilo[kk])
                    ilo[kk] = ihi[kk] = nr;
                float p = 0, ds = 0;
                if (lane >= ilo[kk] && lane < ihi[kk]) {
                    float dcap;
                    p = expf(att_score(s[kk], scale, cap, &dcap) - lse_i);
                    ds = p * (dp[kk] - delta_i);
                    if (cap > 0)
                        ds *= dcap;
                }
                pw[kk * ATT_BR + lane] = p;
                dsw[kk * ATT_BR + lane] = ds;
                if (ilo[kk] < ihi[kk]) {
                    ilo_min = ilo[kk] < ilo_min ? ilo[kk] : ilo_min;
                    ihi_max = ihi[kk] > ihi_max ? ihi[kk] : ihi_max;
                }
            }
            __syncwarp();
            for (int ii = ilo_min; ii < ihi_max; ii++) {
#pragma unroll
                for (int u = 0; u < ATT_MAXU; u++) {
                    const int c = lane + 32 * u;
                    if (c < d) {
                        const float ov = dos[ii * ld + c], qv = qs[ii * ld + c];
#pragma unroll
                        for (int kk = 0; kk < ATT_RPW; kk++)
                            if (ii >= ilo[kk] && ii < ihi[kk]) {
                                accv[kk][u] += pw[kk * ATT_BR + ii] * ov;
                                acck[kk][u] += dsw[kk * ATT_BR + ii] * qv;
                            }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int kk = 0; kk < ATT_RPW; kk++) {
        const int jj = w * ATT_RPW + kk;
        if (jj < js || jj >= nc)
            continue;
        const size_t off = ((size_t)bi * tk + j0 + jj) * kv_row + (size_t)g * d;
#pragma unroll
        for (int u = 0; u < ATT_MAXU; u++) {
            const int c = lane + 32 * u;
            if (c < d) {
                dk[off + c] += scale * acck[kk][u];
                dv[off + c] += accv[kk][u];
            }
        }
    }
}

/* doc_start of the chunk's positions, [q_start, q_start + t) of each batch row, checked as
 * the CPU twin does (within [0, position], non-decreasing): a bad value raises the index
 * flag.  One thread per (batch row, chunk position). */
__global__ void att_docs_check_kernel(const int32_t *doc_start, int tk, int q_start, int t,
                                      size_t n, int *flag)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % t), p = q_start + i;
        const int32_t *docs = doc_start + (e / t) * tk;
        if (docs[p] < 0 || docs[p] > p || (i > 0 && docs[p] < docs[p - 1]))
            cu_flag_range(flag);
    }
}

/* ---- the tensor-core forward ------------------------------------------------------------
 * For head sizes TC_D in {64, 128} with 16-byte aligned tensors (attention_forward picks it;
 * anything else runs the scalar kernel above).  One block of 4 warps per (64-row query tile,
 * query head, batch); warp w owns rows 16w..16w+15 as the rows of its mma fragments.  Key
 * tiles of 64 keys stream through two shared buffers with cp.async: the next tile's copy
 * is in flight while the current one is used.  Per key tile, warp-wide: S = Q·Kᵀ (16 x 64,
 * fp32 accumulators), the mask and online softmax on the accumulator fragments (a row's
 * four lanes combine their max and sum with two shuffles, in a fixed order), P to the
 * warp's shared buffer (rounded to bf16 for bf16 storage: the P·V product's input, as
 * FlashAttention does; the row sum l uses the fp32 P), then O += P·V.  bf16 storage: the
 * products on mma m16n8k16 bf16; fp32: 3xTF32 on m16n8k8 (cu_mma<float>), so fp32
 * attention keeps nearly fp32 products.  Shared rows are padded by 8 elements (mma.cuh says
 * why that is conflict-free).  Masking, windows, soft-capping and documents follow the
 * scalar kernel (att_lo, att_score); the tiles before the first row's first key are
 * skipped, key rows before it are zero-filled, not loaded. */
#define TC_BR 64 /* query rows per block: 4 warps x 16 */
#define TC_BC 64 /* keys per tile */
#define TC_THREADS 128
#define TC_PLD (TC_BC + 8) /* row stride of the P buffers */

template <class T, int TC_D> struct att_tc_smem {
    typedef typename cu_mma<T>::E E;
    enum { LD = TC_D + 8 };
    /* Q [64, LD], K and V [2][64, LD], P [4 warps][16, TC_PLD] */
    static const size_t bytes = (5 * (size_t)TC_BR * LD + (size_t)TC_BR * TC_PLD) * sizeof(E);
};

/* Rows [n0, n) of a 64-row tile (src: its row 0, row stride `stride` elements) into shared
 * memory (row stride ld) with cp.async, zeros elsewhere. */
template <class E, int TC_D>
__device__ __forceinline__ void att_tc_load(E *dst, const E *src, size_t stride, int n0, int n,
                                            int ld)
{
    const int vec = 16 / (int)sizeof(E), per_row = TC_D / vec;
    for (int e = threadIdx.x; e < 64 * per_row; e += blockDim.x) {
        const int r = e / per_row, c = (e - r * per_row) * vec;
        const bool ok = r >= n0 && r < n;
        cu_cp_async16(dst + r * ld + c, ok ? src + r * stride + c : src, ok);
    }
}

template <class T, int TC_D>
__global__ __launch_bounds__(TC_THREADS) void att_tc_forward_kernel(
    T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc_start, int t,
    int tk, int hq, int hkv, int q_start, float scale, int window, float cap)
{
    typedef cu_mma<T> M;
    typedef typename M::E E;
    const int LD = att_tc_smem<T, TC_D>::LD;
    CU_SHARED_DYN(E, sm);
    E *qs = sm, *ks = qs + TC_BR * LD, *vs = ks + 2 * TC_BC * LD;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, bi = blockIdx.z;
    const int g = h / (hq / hkv);
    const int i0 = qt * TC_BR, nr = t - i0 < TC_BR ? t - i0 : TC_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    E *pw = vs + 2 * TC_BC * LD + w * 16 * TC_PLD;
    const size_t q_row = (size_t)hq * TC_D, kv_row = (size_t)hkv * TC_D;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
    const E *qg = reinterpret_cast<const E *>(q), *kg = reinterpret_cast<const E *>(k);
    const E *vg = reinterpret_cast<const E *>(v);

    att_tc_load<E, TC_D>(qs, qg + ((size_t)bi * t + i0) * q_row + (size_t)h * TC_D, q_row, 0, nr,
                         LD);
    const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
    const int jt0 = kfirst / TC_BC * TC_BC, ntiles = (kend - jt0 + TC_BC - 1) / TC_BC;
    {
        const int nc = kend - jt0 < TC_BC ? kend - jt0 : TC_BC, js = kfirst - jt0;
        const size_t off = ((size_t)bi * tk + jt0) * kv_row + (size_t)g * TC_D;
        att_tc_load<E, TC_D>(ks, kg + off, kv_row, js, nc, LD);
        att_tc_load<E, TC_D>(vs, vg + off, kv_row, js, nc, LD);
    }
    cu_cp_async_commit(); /* Q and the first K/V tile: one group */

    /* this lane's two rows (fragment rows gr and gr + 8 of the warp's 16) */
    int rpos[2], rlo[2];
    bool rok[2];
    float m[2], l[2];
    for (int x = 0; x < 2; x++) {
        const int row = 16 * w + gr + 8 * x;
        rok[x] = row < nr;
        rpos[x] = q_start + i0 + row;
        rlo[x] = rok[x] ? att_lo(docs, rpos[x], window) : 0;
        m[x] = -INFINITY;
        l[x] = 0;
    }
    float o[TC_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < TC_D / 8; nd++)
        o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0;

    for (int it = 0; it < ntiles; it++) {
        const int j0 = jt0 + it * TC_BC, buf = it & 1;
        if (it + 1 < ntiles) { /* the next tile into the other buffer, in flight meanwhile */
            const int jn = j0 + TC_BC, nc = kend - jn < TC_BC ? kend - jn : TC_BC;
            const size_t off = ((size_t)bi * tk + jn) * kv_row + (size_t)g * TC_D;
            att_tc_load<E, TC_D>(ks + (buf ^ 1) * TC_BC * LD, kg + off, kv_row, 0, nc, LD);
            att_tc_load<E, TC_D>(vs + (buf ^ 1) * TC_BC * LD, vg + off, kv_row, 0, nc, LD);
            cu_cp_async_commit();
            cu_cp_async_wait<1>(); /* all but the newest group: this tile has arrived */
        } else {
            cu_cp_async_wait<0>();
        }
        __syncthreads(); /* every thread's copies of this tile are visible */
        const E *kb = ks + buf * TC_BC * LD, *vb = vs + buf * TC_BC * LD;

        float s[TC_BC / 8][4];
#pragma unroll
        for (int n = 0; n < TC_BC / 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0;
        for (int k0 = 0; k0 < TC_D; k0 += M::KS) {
            typename M::A fa;
            M::load_a(fa, qs + 16 * w * LD + k0, LD);
#pragma unroll
            for (int n = 0; n < TC_BC / 8; n++) {
                typename M::B fb;
                M::load_b_nk(fb, kb + 8 * n * LD + k0, LD);
                M::mma(s[n], fa, fb);
            }
        }

        /* mask, scale, cap; the rows' maxima over the tile */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < TC_BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1, key = j0 + 8 * n + 2 * tq + (e & 1);
                float sc = -INFINITY;
                if (rok[x] && key >= rlo[x] && key <= rpos[x]) {
                    float dcap;
                    sc = att_score(s[n][e], scale, cap, &dcap);
                }
                s[n][e] = sc;
                mx[x] = fmaxf(mx[x], sc);
            }
        float alpha[2], sum[2] = {0, 0};
        for (int x = 0; x < 2; x++) {
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(CU_FULL_MASK, mx[x], 1));
            mx[x] = fmaxf(mx[x], __shfl_xor_sync(CU_FULL_MASK, mx[x], 2));
            const float mnew = fmaxf(m[x], mx[x]);
            alpha[x] = mnew == -INFINITY ? 1.0f : expf(m[x] - mnew); /* 0 on a first tile */
            mx[x] = mnew;
            m[x] = mnew;
        }
#pragma unroll
        for (int n = 0; n < TC_BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1;
                const float p = s[n][e] == -INFINITY ? 0.0f : expf(s[n][e] - mx[x]);
                sum[x] += p;
                pw[(gr + 8 * x) * TC_PLD + 8 * n + 2 * tq + (e & 1)] = M::from_float(p);
            }
        for (int x = 0; x < 2; x++) {
            sum[x] += __shfl_xor_sync(CU_FULL_MASK, sum[x], 1);
            sum[x] += __shfl_xor_sync(CU_FULL_MASK, sum[x], 2);
            l[x] = l[x] * alpha[x] + sum[x];
        }
#pragma unroll
        for (int nd = 0; nd < TC_D / 8; nd++) {
            o[nd][0] *= alpha[0];
            o[nd][1] *= alpha[0];
            o[nd][2] *= alpha[1];
            o[nd][3] *= alpha[1];
        }
        __syncwarp(); /* the warp's P is in shared memory */

        for (int k0 = 0; k0 < TC_BC; k0 += M::KS) {
            typename M::A fa;
            M::load_a(fa, pw + k0, TC_PLD);
#pragma unroll
            for (int nd = 0; nd < TC_D / 8; nd++) {
                typename M::B fb;
                M::load_b_kn(fb, vb + k0 * LD + 8 * nd, LD);
                M::mma(o[nd], fa, fb);
            }
        }
        __syncthreads(); /* this buffer and P are no longer read (the next prefetch reuses it) */
    }

    for (int x = 0; x < 2; x++) {
        const int row = 16 * w + gr + 8 * x;
        if (!rok[x])
            continue;
        T *orow = out + ((size_t)bi * t + i0 + row) * q_row + (size_t)h * TC_D;
        const float inv = 1.0f / l[x];
#pragma unroll
        for (int nd = 0; nd < TC_D / 8; nd++) {
            orow[8 * nd + 2 * tq] = o[nd][2 * x] * inv;
            orow[8 * nd + 2 * tq + 1] = o[nd][2 * x + 1] * inv;
        }
        if (lse && tq == 0)
            lse[((size_t)bi * hq + h) * t + i0 + row] = m[x] + logf(l[x]);
    }
}

/* ---- the tensor-core backward ----------------------------------------------------------
 * The same two passes as the scalar backward (after att_delta_kernel), on mma: a separate dq
 * pass rather than dq partials per key tile reduced afterwards, because it needs no scratch
 * the size of dq times the key tiles and its sum runs over the key tiles in order inside one
 * block, so it is deterministic without any reduction kernel; it recomputes S and dP, which
 * the dk, dv pass computes again (FlashAttention-2's cost for an atomic-free dq).
 *   dq pass: one block per (64-row query tile, query head, batch), warp w = rows 16w..+15:
 *     S = Q·Kᵀ, dP = dO·Vᵀ, dS = P (dP - delta) (times the cap's derivative), dq += dS·K.
 *   dk, dv pass: one block per (64-key tile, kv head, batch), warp w = keys 16w..+15, over
 *     the group's query heads and the query tiles that see the key tile: Sᵀ = K·Qᵀ,
 *     dPᵀ = V·dOᵀ, then dv += Pᵀ·dO and dk += dSᵀ·Q.
 * P and dS pass through the warp's shared buffer (rounded to bf16 for bf16 storage) to be
 * the A operand of the second product.  Tiles are copied with cp.async and waited for at
 * once (no double buffering here yet). */
template <class T, int TC_D> struct att_tc_bwd_smem {
    typedef typename cu_mma<T>::E E;
    enum { LD = TC_D + 8 };
    /* bf16: P and dS as hi + lo parts (see att_tc_dq_kernel) */
    enum { NBUF = sizeof(E) == 2 ? 4 : 2 };
    /* four [64, LD] tiles, NBUF [4 warps][16, TC_PLD] buffers, lse and delta [64] */
    static const size_t bytes =
        (4 * (size_t)TC_BR * LD + NBUF * (size_t)TC_BR * TC_PLD) * sizeof(E) +
        2 * TC_BR * sizeof(float);
};

template <class T, int TC_D>
__global__ __launch_bounds__(TC_THREADS) void att_tc_dq_kernel(
    T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
    const float *delta, const int32_t *doc_start, int t, int tk, int hq, int hkv, int q_start,
    float scale, int window, float cap)
{
    typedef cu_mma<T> M;
    typedef typename M::E E;
    const int LD = att_tc_bwd_smem<T, TC_D>::LD;
    CU_SHARED_DYN(E, sm);
    E *qs = sm, *dos = qs + TC_BR * LD, *ks = dos + TC_BR * LD, *vs = ks + TC_BC * LD;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, bi = blockIdx.z;
    const int g = h / (hq / hkv);
    const int i0 = qt * TC_BR, nr = t - i0 < TC_BR ? t - i0 : TC_BR;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    E *pw = vs + TC_BC * LD + w * 16 * TC_PLD, *plo = pw + TC_BR * TC_PLD;
    /* bf16: dS as hi + lo, two bf16 products with K.  The rows of dS sum to about zero (to
     * exactly zero without a cap), so dq is a sum with cancellation, and dS rounded to bf16
     * alone left dq about 1e-2 off the fp32 result in the tests; fp32 (3xTF32) needs no
     * second part. */
    const bool split = sizeof(E) == 2;
    const size_t q_row = (size_t)hq * TC_D, kv_row = (size_t)hkv * TC_D;
    const size_t q_off = ((size_t)bi * t + i0) * q_row + (size_t)h * TC_D;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
    const E *kg = reinterpret_cast<const E *>(k), *vg = reinterpret_cast<const E *>(v);

    att_tc_load<E, TC_D>(qs, reinterpret_cast<const E *>(q) + q_off, q_row, 0, nr, LD);
    att_tc_load<E, TC_D>(dos, reinterpret_cast<const E *>(dout) + q_off, q_row, 0, nr, LD);
    cu_cp_async_commit();

    int rpos[2], rlo[2];
    bool rok[2];
    float lse_r[2], delta_r[2];
    for (int x = 0; x < 2; x++) {
        const int row = 16 * w + gr + 8 * x;
        const size_t srow = ((size_t)bi * hq + h) * t + i0 + row;
        rok[x] = row < nr;
        rpos[x] = q_start + i0 + row;
        rlo[x] = rok[x] ? att_lo(docs, rpos[x], window) : 0;
        lse_r[x] = rok[x] ? lse[srow] : 0.0f;
        delta_r[x] = rok[x] ? delta[srow] : 0.0f;
    }
    float acc[TC_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < TC_D / 8; nd++)
        acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0;

    const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
    for (int j0 = kfirst / TC_BC * TC_BC; j0 < kend; j0 += TC_BC) {
        const int nc = kend - j0 < TC_BC ? kend - j0 : TC_BC;
        const int js = kfirst > j0 ? kfirst - j0 : 0;
        __syncthreads(); /* the previous tile is no longer read */
        const size_t off = ((size_t)bi * tk + j0) * kv_row + (size_t)g * TC_D;
        att_tc_load<E, TC_D>(ks, kg + off, kv_row, js, nc, LD);
        att_tc_load<E, TC_D>(vs, vg + off, kv_row, js, nc, LD);
        cu_cp_async_commit();
        cu_cp_async_wait<0>();
        __syncthreads();

        float s[TC_BC / 8][4], dp[TC_BC / 8][4];
#pragma unroll
        for (int n = 0; n < TC_BC / 8; n++)
            for (int e = 0; e < 4; e++)
                s[n][e] = dp[n][e] = 0;
        for (int k0 = 0; k0 < TC_D; k0 += M::KS) {
            typename M::A fq, fo;
            M::load_a(fq, qs + 16 * w * LD + k0, LD);
            M::load_a(fo, dos + 16 * w * LD + k0, LD);
#pragma unroll
            for (int n = 0; n < TC_BC / 8; n++) {
                typename M::B fb;
                M::load_b_nk(fb, ks + 8 * n * LD + k0, LD);
                M::mma(s[n], fq, fb);
                M::load_b_nk(fb, vs + 8 * n * LD + k0, LD);
                M::mma(dp[n], fo, fb);
            }
        }
#pragma unroll
        for (int n = 0; n < TC_BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int x = e >> 1, key = j0 + 8 * n + 2 * tq + (e & 1);
                float ds = 0;
                if (rok[x] && key >= rlo[x] && key <= rpos[x]) {
                    float dcap;
                    const float p = expf(att_score(s[n][e], scale, cap, &dcap) - lse_r[x]);
                    ds = p * (dp[n][e] - delta_r[x]);
                    if (cap > 0)
                        ds *= dcap;
                }
                const E hi = M::from_float(ds);
                pw[(gr + 8 * x) * TC_PLD + 8 * n + 2 * tq + (e & 1)] = hi;
                if (split)
                    plo[(gr + 8 * x) * TC_PLD + 8 * n + 2 * tq + (e & 1)] =
                        M::from_float(ds - (float)cu_bf16{(uint16_t)hi});
            }
        __syncwarp();
        for (int k0 = 0; k0 < TC_BC; k0 += M::KS) {
            typename M::A fa, fl;
            M::load_a(fa, pw + k0, TC_PLD);
            if (split)
                M::load_a(fl, plo + k0, TC_PLD);
#pragma unroll
            for (int nd = 0; nd < TC_D / 8; nd++) {
                typename M::B fb;
                M::load_b_kn(fb, ks + k0 * LD + 8 * nd, LD);
                if (split)
                    M::mma(acc[nd], fl, fb);
                M::mma(acc[nd], fa, fb);
            }
        }
    }

    for (int x = 0; x < 2; x++) {
        const int row = 16 * w + gr + 8 * x;
        if (!rok[x])
            continue;
        T *dqrow = dq + ((size_t)bi * t + i0 + row) * q_row + (size_t)h * TC_D;
#pragma unroll
        for (int nd = 0; nd < TC_D / 8; nd++) {
            dqrow[8 * nd + 2 * tq] += scale * acc[nd][2 * x];
            dqrow[8 * nd + 2 * tq + 1] += scale * acc[nd][2 * x + 1];
        }
    }
}

template <class T, int TC_D>
__global__ __launch_bounds__(TC_THREADS) void att_tc_dkdv_kernel(
    T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
    const float *delta, const int32_t *doc_start, int t, int tk, int hq, int hkv, int q_start,
    float scale, int window, float cap)
{
    typedef cu_mma<T> M;
    typedef typename M::E E;
    const int LD = att_tc_bwd_smem<T, TC_D>::LD;
    CU_SHARED_DYN(E, sm);
    E *ks = sm, *vs = ks + TC_BC * LD, *qs = vs + TC_BC * LD, *dos = qs + TC_BR * LD;
    const int group = hq / hkv;
    const int kt = att_lo(NULL, q_start, window) / TC_BC + blockIdx.x, g = blockIdx.y,
              bi = blockIdx.z;
    const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
    const int klo = att_lo(docs, q_start, window), kend = q_start + t;
    const int j0 = kt * TC_BC, nc = kend - j0 < TC_BC ? kend - j0 : TC_BC;
    if (j0 + nc <= klo)
        return; /* the whole block: the tile lies before the chunk's first document */
    const int js = klo > j0 ? klo - j0 : 0;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    const bool split = sizeof(E) == 2; /* P and dS as hi + lo (see att_tc_dq_kernel) */
    E *pw = dos + TC_BR * LD + w * 16 * TC_PLD, *dsw = pw + TC_BR * TC_PLD;
    E *plo = dsw + TC_BR * TC_PLD, *dslo = plo + TC_BR * TC_PLD; /* (split only) */
    float *lse_s = reinterpret_cast<float *>(dos + TC_BR * LD +
                                             att_tc_bwd_smem<T, TC_D>::NBUF * TC_BR * TC_PLD);
    float *delta_s = lse_s + TC_BR;
    const size_t q_row = (size_t)hq * TC_D, kv_row = (size_t)hkv * TC_D;
    const size_t kv_off = ((size_t)bi * tk + j0) * kv_row + (size_t)g * TC_D;

    att_tc_load<E, TC_D>(ks, reinterpret_cast<const E *>(k) + kv_off, kv_row, js, nc, LD);
    att_tc_load<E, TC_D>(vs, reinterpret_cast<const E *>(v) + kv_off, kv_row, js, nc, LD);
    cu_cp_async_commit();

    int key[2];
    bool kok[2];
    for (int x = 0; x < 2; x++) {
        const int jj = 16 * w + gr + 8 * x;
        key[x] = j0 + jj;
        kok[x] = jj >= js && jj < nc;
    }
    float acck[TC_D / 8][4], accv[TC_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < TC_D / 8; nd++)
        for (int e = 0; e < 4; e++)
            acck[nd][e] = accv[nd][e] = 0;

    const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
    const int iend = att_row_end(docs, j0 + nc - 1, window, q_start, ifirst, t);
    for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        for (int i0 = ifirst / TC_BR * TC_BR; i0 < iend; i0 += TC_BR) {
            const int nr = iend - i0 < TC_BR ? iend - i0 : TC_BR;
            __syncthreads(); /* the previous query tile is no longer read */
            const size_t q_off = ((size_t)bi * t + i0) * q_row + (size_t)h * TC_D;
            att_tc_load<E, TC_D>(qs, reinterpret_cast<const E *>(q) + q_off, q_row, 0, nr, LD);
            att_tc_load<E, TC_D>(dos, reinterpret_cast<const E *>(dout) + q_off, q_row, 0, nr,
                                 LD);
            cu_cp_async_commit();
            for (int i = threadIdx.x; i < TC_BR; i += blockDim.x) {
                const size_t srow = ((size_t)bi * hq + h) * t + i0 + i;
                lse_s[i] = i < nr ? lse[srow] : 0.0f;
                delta_s[i] = i < nr ? delta[srow] : 0.0f;
            }
            cu_cp_async_wait<0>();
            __syncthreads();

            float s[TC_BR / 8][4], dp[TC_BR / 8][4];
#pragma unroll
            for (int n = 0; n < TC_BR / 8; n++)
                for (int e = 0; e < 4; e++)
                    s[n][e] = dp[n][e] = 0;
            for (int k0 = 0; k0 < TC_D; k0 += M::KS) {
                typename M::A fk, fv;
                M::load_a(fk, ks + 16 * w * LD + k0, LD);
                M::load_a(fv, vs + 16 * w * LD + k0, LD);
#pragma unroll
                for (int n = 0; n < TC_BR / 8; n++) {
                    typename M::B fb;
                    M::load_b_nk(fb, qs + 8 * n * LD + k0, LD);
                    M::mma(s[n], fk, fb);
                    M::load_b_nk(fb, dos + 8 * n * LD + k0, LD);
                    M::mma(dp[n], fv, fb);
                }
            }
#pragma unroll
            for (int n = 0; n < TC_BR / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int x = e >> 1, ic = 8 * n + 2 * tq + (e & 1), pos = q_start + i0 + ic;
                    float p = 0, ds = 0;
                    if (kok[x] && ic < nr && key[x] <= pos && key[x] >= att_lo(docs, pos, window)) {
                        float dcap;
                        p = expf(att_score(s[n][e], scale, cap, &dcap) - lse_s[ic]);
                        ds = p * (dp[n][e] - delta_s[ic]);
                        if (cap > 0)
                            ds *= dcap;
                    }
                    const int at = (gr + 8 * x) * TC_PLD + ic;
                    const E ph = M::from_float(p), dh = M::from_float(ds);
                    pw[at] = ph;
                    dsw[at] = dh;
                    if (split) {
                        plo[at] = M::from_float(p - (float)cu_bf16{(uint16_t)ph});
                        dslo[at] = M::from_float(ds - (float)cu_bf16{(uint16_t)dh});
                    }
                }
            __syncwarp();
            for (int k0 = 0; k0 < TC_BR; k0 += M::KS) {
                typename M::A fp, fs, fpl, fsl;
                M::load_a(fp, pw + k0, TC_PLD);
                M::load_a(fs, dsw + k0, TC_PLD);
                if (split) {
                    M::load_a(fpl, plo + k0, TC_PLD);
                    M::load_a(fsl, dslo + k0, TC_PLD);
                }
#pragma unroll
                for (int nd = 0; nd < TC_D / 8; nd++) {
                    typename M::B fb;
                    M::load_b_kn(fb, dos + k0 * LD + 8 * nd, LD);
                    if (split)
                        M::mma(accv[nd], fpl, fb);
                    M::mma(accv[nd], fp, fb);
                    M::load_b_kn(fb, qs + k0 * LD + 8 * nd, LD);
                    if (split)
                        M::mma(acck[nd], fsl, fb);
                    M::mma(acck[nd], fs, fb);
                }
            }
        }
    }

    for (int x = 0; x < 2; x++) {
        if (!kok[x])
            continue;
        const size_t off = ((size_t)bi * tk + key[x]) * kv_row + (size_t)g * TC_D;
#pragma unroll
        for (int nd = 0; nd < TC_D / 8; nd++)
            for (int e = 0; e < 2; e++) {
                const int c = 8 * nd + 2 * tq + e;
                dk[off + c] += scale * acck[nd][2 * x + e];
                dv[off + c] += accv[nd][2 * x + e];
            }
    }
}

/* ---- the tensor-core layer's self-check ------------------------------------------------ */

/* One warp: d = a·b + c through cu_mma<T>'s fragment loads and products, with B kept in
 * shared memory k-major (kn = 1) or n-major (kn = 0), so a test can compare it with a plain
 * matrix product.  a: [16, 32]  b: [32, 8] (row-major, fp32; rounded to E on the way in)
 * c, d: [16, 8]. */
template <class T>
__global__ void att_mma_check_kernel(float *d, const float *a, const float *b, const float *c,
                                     int kn)
{
    typedef cu_mma<T> M;
    typedef typename M::E E;
    const int lda = 32 + 8, ldb = kn ? 8 + 8 : 32 + 8;
    CU_SHARED(E, as, 16 * (32 + 8));
    CU_SHARED(E, bs, 32 * (32 + 8));
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int e = lane; e < 16 * 32; e += 32)
        as[(e / 32) * lda + e % 32] = M::from_float(a[e]);
    for (int e = lane; e < 32 * 8; e += 32) {
        const int k = e / 8, n = e % 8;
        bs[kn ? k * ldb + n : n * ldb + k] = M::from_float(b[e]);
    }
    __syncwarp();
    float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                    c[(g + 8) * 8 + 2 * t + 1]};
    for (int k0 = 0; k0 < 32; k0 += M::KS) {
        typename M::A fa;
        typename M::B fb;
        M::load_a(fa, as + k0, lda);
        if (kn)
            M::load_b_kn(fb, bs + k0 * ldb, ldb);
        else
            M::load_b_nk(fb, bs + k0, ldb);
        M::mma(acc, fa, fb);
    }
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

/* For the GPU kernel test (declared there): bf16 = 1 runs cu_mma<cu_bf16>, else 3xTF32.
 * d, a, b, c: device pointers, shapes as above. */
extern "C" int cu_mma_check(sbprt_ctx *ctx, float *d, const float *a, const float *b,
                            const float *c, int bf16, int kn)
{
    CU_CHECK(ctx && d && a && b && c);
    if (bf16)
        CU_LAUNCH(ctx, att_mma_check_kernel<cu_bf16>, 1, 32, 0, d, a, b, c, kn);
    else
        CU_LAUNCH(ctx, att_mma_check_kernel<float>, 1, 32, 0, d, a, b, c, kn);
    return SBPRT_OK;
}

/* ---- host side ------------------------------------------------------------------------ */

static int att_check(const void *q, const void *k, const void *v, int b, int t, int tk, int hq,
                     int hkv, int d, int q_start, int window, float softcap)
{
    if (b < 0 || t < 0 || tk < 0 || hq < 0 || hkv <= 0 || d <= 0 || q_start < 0)
        return SBPRT_ERR_INVALID;
    if (window < 0 || !isfinite(softcap) || softcap < 0)
        return SBPRT_ERR_INVALID;
    if (hq % hkv != 0 || (int64_t)q_start + t > tk)
        return SBPRT_ERR_INVALID;
    if (b > 0 && t > 0 && hq > 0 && (!q || !k || !v))
        return SBPRT_ERR_INVALID;
    return SBPRT_OK;
}

/* A window that holds every key of every row of the chunk is no window: 0 from then on,
 * which also keeps window + position sums inside int. */
static int att_window(int window, int q_start, int t)
{
    return (int64_t)window >= (int64_t)q_start + t ? 0 : window;
}

/* Limits of this implementation beyond the API's: head size, grid extents, shared memory. */
static int att_fits(sbprt_ctx *ctx, int b, int hq, int d, size_t smem)
{
    if (d > ATT_MAX_D)
        return cu_error(ctx, SBPRT_ERR_INVALID,
                        "attention: head size d = %d exceeds the CUDA backend's limit of %d", d,
                        ATT_MAX_D);
    if (b > 65535 || hq > 65535)
        return cu_error(ctx, SBPRT_ERR_INVALID,
                        "attention: b = %d or hq = %d exceeds the grid limit 65535", b, hq);
    if (smem + ATT_STATIC_SMEM > (size_t)ctx->smem_optin)
        return cu_error(ctx, SBPRT_ERR_INVALID,
                        "attention: d = %d needs %zu bytes of shared memory, the device allows %d",
                        d, smem + ATT_STATIC_SMEM, ctx->smem_optin);
    return SBPRT_OK;
}

/* The limits above for a forward (backward = 0) or backward call of b, hq, d: what the
 * entry points below would refuse with SBPRT_ERR_INVALID beyond att_check's rules.  For
 * callers that must refuse before queuing anything (seqpar.cu: before an exchange). */
extern "C" int cu_attention_fits(sbprt_ctx *ctx, int b, int hq, int d, int backward)
{
    const size_t tiles = backward ? 2 * ATT_BR + 2 * ATT_BC : ATT_BR + 2 * ATT_BC;
    return att_fits(ctx, b, hq, d, tiles * (size_t)(d | 1) * sizeof(float));
}

/* Raises a kernel's dynamic shared memory limit when it needs more than the default: once
 * per (kernel, device), to the most the device allows beside the kernel's static shared
 * memory (static_bytes), so later calls with any head size find it done. */
static int att_optin(sbprt_ctx *ctx, const void *kernel, size_t smem,
                     size_t static_bytes = ATT_STATIC_SMEM)
{
    if (smem + static_bytes <= ATT_DEFAULT_SMEM)
        return SBPRT_OK;
    static std::mutex mu;
    static struct {
        const void *fn;
        int device;
    } done[64];
    static int ndone;
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < ndone; i++)
        if (done[i].fn == kernel && done[i].device == ctx->device)
            return SBPRT_OK;
    CU_TRY(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     ctx->smem_optin - (int)static_bytes));
    if (ndone < (int)(sizeof done / sizeof done[0])) /* (beyond: set again on every call) */
        done[ndone++] = {kernel, ctx->device};
    return SBPRT_OK;
}

/* Queues the doc_start check (nothing without documents). */
static int att_check_docs(sbprt_ctx *ctx, const int32_t *doc_start, int b, int t, int tk,
                          int q_start)
{
    if (!doc_start)
        return SBPRT_OK;
    const size_t n = (size_t)b * t;
    CU_LAUNCH(ctx, att_docs_check_kernel, cu_blocks(n, ATT_THREADS), ATT_THREADS, 0, doc_start,
              tk, q_start, t, n, ctx->dev_flag);
    return SBPRT_OK;
}

/* Whether a forward runs on the tensor-core kernel: head size 64 or 128, every tensor
 * 16-byte aligned (cp.async copies 16 bytes), its shared memory within the device's limit,
 * the grid within the limits.  Otherwise the scalar kernel. */
template <class T>
static bool att_tc_ok(sbprt_ctx *ctx, int b, int hq, int d, const T *q, const T *k, const T *v,
                      const T *out)
{
    if (d != 64 && d != 128)
        return false;
    if ((((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) & 15) != 0)
        return false;
    if (b > 65535 || hq > 65535)
        return false;
    const size_t fwd = d == 64 ? att_tc_smem<T, 64>::bytes : att_tc_smem<T, 128>::bytes;
    const size_t bwd = d == 64 ? att_tc_bwd_smem<T, 64>::bytes : att_tc_bwd_smem<T, 128>::bytes;
    return (fwd > bwd ? fwd : bwd) <= (size_t)ctx->smem_optin;
}

template <class T>
static int attention_forward(sbprt_ctx *ctx, T *out, float *lse, const T *q, const T *k, const T *v,
                             const int32_t *doc_start, int b, int t, int tk, int hq, int hkv,
                             int d, int q_start, float scale, int window, float softcap)
{
    CU_CHECK(ctx);
    CU_STATUS(att_check(q, k, v, b, t, tk, hq, hkv, d, q_start, window, softcap));
    if (b == 0 || t == 0 || hq == 0)
        return SBPRT_OK;
    CU_CHECK(out);
    window = att_window(window, q_start, t);
    if (att_tc_ok(ctx, b, hq, d, q, k, v, out)) {
        CU_STATUS(att_check_docs(ctx, doc_start, b, t, tk, q_start));
        const dim3 grid((t + TC_BR - 1) / TC_BR, hq, b);
        if (d == 64) {
            const size_t smem = att_tc_smem<T, 64>::bytes;
            CU_STATUS(att_optin(ctx, (const void *)&att_tc_forward_kernel<T, 64>, smem, 0));
            CU_LAUNCH(ctx, (att_tc_forward_kernel<T, 64>), grid, TC_THREADS, smem, out, lse, q,
                      k, v, doc_start, t, tk, hq, hkv, q_start, scale, window, softcap);
        } else {
            const size_t smem = att_tc_smem<T, 128>::bytes;
            CU_STATUS(att_optin(ctx, (const void *)&att_tc_forward_kernel<T, 128>, smem, 0));
            CU_LAUNCH(ctx, (att_tc_forward_kernel<T, 128>), grid, TC_THREADS, smem, out, lse,
                      q, k, v, doc_start, t, tk, hq, hkv, q_start, scale, window, softcap);
        }
        return SBPRT_OK;
    }
    const size_t smem = (size_t)(ATT_BR + 2 * ATT_BC) * (d | 1) * sizeof(float);
    CU_STATUS(att_fits(ctx, b, hq, d, smem));
    CU_STATUS(att_optin(ctx, (const void *)&att_forward_kernel<T>, smem));
    CU_STATUS(att_check_docs(ctx, doc_start, b, t, tk, q_start));
    const dim3 grid((t + ATT_BR - 1) / ATT_BR, hq, b);
    CU_LAUNCH(ctx, att_forward_kernel<T>, grid, ATT_THREADS, smem, out, lse, q, k, v, doc_start, t,
              tk, hq, hkv, d, q_start, scale, window, softcap);
    return SBPRT_OK;
}

/* Null or 16-byte aligned (the backward's optional outputs). */
static bool att_tc_aligned(const void *a, const void *b, const void *c, const void *d)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15) == 0;
}

/* The tensor-core passes after delta (attention_backward's arguments). */
template <class T, int TC_D>
static int att_tc_backward(sbprt_ctx *ctx, T *dq, T *dk, T *dv, const T *dout, const T *q,
                           const T *k, const T *v, const float *lse, const float *delta,
                           const int32_t *doc_start, int b, int t, int tk, int hq, int hkv,
                           int q_start, float scale, int window, float softcap)
{
    const size_t smem = att_tc_bwd_smem<T, TC_D>::bytes;
    if (dq) {
        CU_STATUS(att_optin(ctx, (const void *)&att_tc_dq_kernel<T, TC_D>, smem, 0));
        const dim3 grid((t + TC_BR - 1) / TC_BR, hq, b);
        CU_LAUNCH(ctx, (att_tc_dq_kernel<T, TC_D>), grid, TC_THREADS, smem, dq, dout, q, k, v,
                  lse, delta, doc_start, t, tk, hq, hkv, q_start, scale, window, softcap);
    }
    if (dk) {
        CU_STATUS(att_optin(ctx, (const void *)&att_tc_dkdv_kernel<T, TC_D>, smem, 0));
        const int kt0 = att_lo(NULL, q_start, window) / TC_BC;
        const dim3 grid((q_start + t + TC_BC - 1) / TC_BC - kt0, hkv, b);
        CU_LAUNCH(ctx, (att_tc_dkdv_kernel<T, TC_D>), grid, TC_THREADS, smem, dk, dv, dout, q, k,
                  v, lse, delta, doc_start, t, tk, hq, hkv, q_start, scale, window, softcap);
    }
    return SBPRT_OK;
}

template <class T>
static int attention_backward(sbprt_ctx *ctx, T *dq, T *dk, T *dv, const T *dout, const T *q,
                              const T *k, const T *v, const T *out, const float *lse,
                              const int32_t *doc_start, int b, int t, int tk, int hq, int hkv,
                              int d, int q_start, float scale, int window, float softcap)
{
    CU_CHECK(ctx);
    CU_STATUS(att_check(q, k, v, b, t, tk, hq, hkv, d, q_start, window, softcap));
    CU_CHECK((dk == NULL) == (dv == NULL));
    if (b == 0 || t == 0 || hq == 0 || (!dq && !dk))
        return SBPRT_OK;
    CU_CHECK(dout && out && lse);
    window = att_window(window, q_start, t);
    const size_t smem = (size_t)(2 * ATT_BR + 2 * ATT_BC) * (d | 1) * sizeof(float);
    CU_STATUS(att_fits(ctx, b, hq, d, smem));

    CU_STATUS(att_check_docs(ctx, doc_start, b, t, tk, q_start));
    const size_t nrows = (size_t)b * t * hq;
    float *delta; /* [b, hq, t] */
    CU_STATUS(cu_scratch(ctx, nrows * sizeof(float), (void **)&delta));
    const size_t rows_per_block = ATT_THREADS / 32;
    const size_t dblocks = (nrows + rows_per_block - 1) / rows_per_block;
    CU_CHECK(dblocks <= 0x7fffffffu);
    CU_LAUNCH(ctx, att_delta_kernel<T>, (unsigned)dblocks, ATT_THREADS, 0, delta, dout, out, t, hq,
              d, nrows);

    if (att_tc_ok(ctx, b, hq, d, q, k, v, dout) && att_tc_aligned(out, dq, dk, dv)) {
        if (d == 64)
            return att_tc_backward<T, 64>(ctx, dq, dk, dv, dout, q, k, v, lse, delta, doc_start,
                                          b, t, tk, hq, hkv, q_start, scale, window, softcap);
        return att_tc_backward<T, 128>(ctx, dq, dk, dv, dout, q, k, v, lse, delta, doc_start, b,
                                       t, tk, hq, hkv, q_start, scale, window, softcap);
    }
    if (dq) {
        CU_STATUS(att_optin(ctx, (const void *)&att_dq_kernel<T>, smem));
        const dim3 grid((t + ATT_BR - 1) / ATT_BR, hq, b);
        CU_LAUNCH(ctx, att_dq_kernel<T>, grid, ATT_THREADS, smem, dq, dout, q, k, v, lse, delta,
                  doc_start, t, tk, hq, hkv, d, q_start, scale, window, softcap);
    }
    if (dk) {
        CU_STATUS(att_optin(ctx, (const void *)&att_dkdv_kernel<T>, smem));
        /* the key tiles holding the keys the chunk reads, from the first one's (of the window:
         * doc_start is on the device, so blocks before a row's first document return) */
        const int kt0 = att_lo(NULL, q_start, window) / ATT_BC;
        const dim3 grid((q_start + t + ATT_BC - 1) / ATT_BC - kt0, hkv, b);
        CU_LAUNCH(ctx, att_dkdv_kernel<T>, grid, ATT_THREADS, smem, dk, dv, dout, q, k, v, lse,
                  delta, doc_start, t, tk, hq, hkv, d, q_start, scale, window, softcap);
    }
    return SBPRT_OK;
}

extern "C" int sbprt_attention_forward_packed(sbprt_ctx *ctx, float *out, float *lse,
                                              const float *q, const float *k, const float *v,
                                              const int32_t *doc_start, int b, int t, int tk,
                                              int hq, int hkv, int d, int q_start, float scale,
                                              int window, float softcap)
{
    return attention_forward(ctx, out, lse, q, k, v, doc_start, b, t, tk, hq, hkv, d, q_start,
                             scale, window, softcap);
}

extern "C" int sbprt_attention_backward_packed(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                               const float *dout, const float *q, const float *k,
                                               const float *v, const float *out,
                                               const float *lse, const int32_t *doc_start, int b,
                                               int t, int tk, int hq, int hkv, int d,
                                               int q_start, float scale, int window,
                                               float softcap)
{
    return attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, doc_start, b, t, tk, hq,
                              hkv, d, q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_forward_ex(sbprt_ctx *ctx, float *out, float *lse,
                                          const float *q, const float *k, const float *v, int b,
                                          int t, int tk, int hq, int hkv, int d, int q_start,
                                          float scale, int window, float softcap)
{
    return attention_forward(ctx, out, lse, q, k, v, (const int32_t *)NULL, b, t, tk, hq, hkv, d,
                             q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_backward_ex(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                           const float *dout, const float *q, const float *k,
                                           const float *v, const float *out, const float *lse,
                                           int b, int t, int tk, int hq, int hkv, int d,
                                           int q_start, float scale, int window, float softcap)
{
    return attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, (const int32_t *)NULL, b,
                              t, tk, hq, hkv, d, q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                                       const float *k, const float *v, int b, int t, int tk,
                                       int hq, int hkv, int d, int q_start, float scale)
{
    return attention_forward(ctx, out, lse, q, k, v, (const int32_t *)NULL, b, t, tk, hq, hkv, d,
                             q_start, scale, 0, 0.0f);
}

extern "C" int sbprt_attention_backward(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse, int b,
                                        int t, int tk, int hq, int hkv, int d, int q_start,
                                        float scale)
{
    return attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, (const int32_t *)NULL, b,
                              t, tk, hq, hkv, d, q_start, scale, 0, 0.0f);
}

/* bf16: the tiles are converted to fp32 as they are loaded into shared memory; scores, the
 * online softmax, lse and the accumulators are fp32; each output element is rounded once. */
extern "C" int sbprt_attention_forward_packed_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                                   const sbprt_bf16 *q, const sbprt_bf16 *k,
                                                   const sbprt_bf16 *v, const int32_t *doc_start,
                                                   int b, int t, int tk, int hq, int hkv, int d,
                                                   int q_start, float scale, int window,
                                                   float softcap)
{
    return attention_forward(ctx, cu_bf(out), lse, cu_bf(q), cu_bf(k), cu_bf(v), doc_start, b, t,
                             tk, hq, hkv, d, q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_backward_packed_bf16(
    sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk, sbprt_bf16 *dv, const sbprt_bf16 *dout,
    const sbprt_bf16 *q, const sbprt_bf16 *k, const sbprt_bf16 *v, const sbprt_bf16 *out,
    const float *lse, const int32_t *doc_start, int b, int t, int tk, int hq, int hkv, int d,
    int q_start, float scale, int window, float softcap)
{
    return attention_backward(ctx, cu_bf(dq), cu_bf(dk), cu_bf(dv), cu_bf(dout), cu_bf(q),
                              cu_bf(k), cu_bf(v), cu_bf(out), lse, doc_start, b, t, tk, hq, hkv,
                              d, q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_forward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                               const sbprt_bf16 *q, const sbprt_bf16 *k,
                                               const sbprt_bf16 *v, int b, int t, int tk, int hq,
                                               int hkv, int d, int q_start, float scale,
                                               int window, float softcap)
{
    return attention_forward(ctx, cu_bf(out), lse, cu_bf(q), cu_bf(k), cu_bf(v),
                             (const int32_t *)NULL, b, t, tk, hq, hkv, d, q_start, scale, window,
                             softcap);
}

extern "C" int sbprt_attention_backward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                                sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                                const sbprt_bf16 *q, const sbprt_bf16 *k,
                                                const sbprt_bf16 *v, const sbprt_bf16 *out,
                                                const float *lse, int b, int t, int tk, int hq,
                                                int hkv, int d, int q_start, float scale,
                                                int window, float softcap)
{
    return attention_backward(ctx, cu_bf(dq), cu_bf(dk), cu_bf(dv), cu_bf(dout), cu_bf(q),
                              cu_bf(k), cu_bf(v), cu_bf(out), lse, (const int32_t *)NULL, b, t,
                              tk, hq, hkv, d, q_start, scale, window, softcap);
}

extern "C" int sbprt_attention_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                            const sbprt_bf16 *q, const sbprt_bf16 *k,
                                            const sbprt_bf16 *v, int b, int t, int tk, int hq,
                                            int hkv, int d, int q_start, float scale)
{
    return attention_forward(ctx, cu_bf(out), lse, cu_bf(q), cu_bf(k), cu_bf(v),
                             (const int32_t *)NULL, b, t, tk, hq, hkv, d, q_start, scale, 0, 0.0f);
}

extern "C" int sbprt_attention_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                             sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                             const sbprt_bf16 *q, const sbprt_bf16 *k,
                                             const sbprt_bf16 *v, const sbprt_bf16 *out,
                                             const float *lse, int b, int t, int tk, int hq,
                                             int hkv, int d, int q_start, float scale)
{
    return attention_backward(ctx, cu_bf(dq), cu_bf(dk), cu_bf(dv), cu_bf(dout), cu_bf(q),
                              cu_bf(k), cu_bf(v), cu_bf(out), lse, (const int32_t *)NULL, b, t,
                              tk, hq, hkv, d, q_start, scale, 0, 0.0f);
}
