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
 * without atomics this backend gives every output row one owner.  With at least
 * FX_FUSED_MIN_TASKS (batch, kv head) pairs (the AVX2 path) one task per pair walks the key
 * tiles in order and computes each tile's scores and dP once for dq, dk and dv together: the
 * task owns its heads' dq rows and its kv head's dk/dv rows.  Otherwise two passes, each
 * owning its outputs: pass 1 is partitioned like the forward (by query tile) and writes dq;
 * pass 2 is partitioned by (batch, kv head, key tile) and visits every query head of the
 * group and every query row that can see the tile, so the GQA reduction over heads happens
 * inside one task too (the price: the scores computed twice).  Which form runs depends on
 * the shape alone, and every output element is summed in an order fixed by the tiling, so
 * results do not depend on threads.
 *
 * Scheduling: tasks go to threads dynamically, the most expensive first (the last query
 * tiles, which see the most keys; in the backward's second pass the first key tiles), so
 * a causal chunk's uneven tasks still finish together; a task owns its output rows, so which
 * thread runs it changes nothing in the results.
 *
 * Inner loops: a task copies its key tile (and, in the backward, its value tile) transposed
 * into [d, ATT_BC] scratch, so a row's scores for 16 keys at once accumulate over d in
 * vector registers instead of one horizontal reduction per key; with the P·V and gradient
 * updates (axpys over d) every hot loop vectorises without reassociating a sum.  A row's
 * arithmetic never depends on which other rows share its tile or where its chunk starts,
 * which is why a chunk's rows come out bitwise equal to the same rows of an unchunked call.
 *
 * Variants (the _ex entry points): a sliding window w moves the first key a row sees to
 * lo = pos - w + 1.  Every loop over key tiles starts at the tile holding the first key its
 * rows can see (a forward / dq task: its first row's lo; a dk/dv task set: the chunk's first
 * row's lo), every loop over query rows of a key tile stops at the last row whose window
 * still holds the tile's last key, and inside a tile each row is cut at both ends; so the
 * work is O(t * w).  Keys before the first one a task can see are never loaded (their tile
 * slots are zero), so the chunk reads nothing before its window.  Soft-capping replaces each
 * scaled score by cap * tanh(s / cap) right after the score product, in the forward and in
 * both recomputations of the backward alike, which then multiplies dS by 1 - tanh^2.  A
 * masked key still gets p = 0 exactly and adds nothing, and both variants act on single
 * scores, so the properties above (bitwise equal chunk rows, independent of threads) hold
 * for them too.
 *
 * Packed documents (the _packed entry points; _ex is them with doc_start = NULL): a row's
 * first key becomes lo = max(doc_start[pos], pos - w + 1), and everything above that was
 * written for the window's lo holds for it, because lo still never decreases with the row
 * (att_check_docs insists): a query tile's first row has the tile's smallest lo, so key
 * tiles before it are skipped as the window's are; the query rows that see a key tile are
 * still one range, ending where lo passes the tile's last key (found by bisection); inside a
 * tile each row is cut at its own lo.  With n equal documents a row does about 1/n of the
 * causal work.  The dk/dv tasks span the window's key tiles, and a task whose tile lies
 * wholly before its batch row's first document returns at once; so each batch row reads and
 * writes only K/V rows from its chunk's first document on.
 */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "cpu.h"

#define ATT_BR 32 /* query rows per tile */
#define ATT_BC 64 /* keys per tile */

/* The first key a query at absolute position pos attends: the start of its document (docs:
 * the batch row's doc_start, or NULL for one document), moved up to pos - window + 1 by a
 * sliding window.  window has been reduced below q_start + t (att_window), so nothing
 * overflows.  Non-decreasing in pos (doc_start is, att_check_docs), so a tile's first row
 * has the smallest first key of the tile: the loops over key tiles start there. */
static int att_lo(const int32_t *docs, int pos, int window)
{
    const int lo = docs ? docs[pos] : 0;
    return window > 0 && pos - window + 1 > lo ? pos - window + 1 : lo;
}

/* One past the last query row (chunk-relative, at most t) that sees key jlast, the last key
 * of a tile; ifirst is the first row at or after the tile's first key.  With documents: the
 * first row from ifirst whose first key lies past jlast, found by bisection since att_lo
 * grows with the row.  Without: rows at positions up to jlast + window - 1 see it, all rows
 * without a window. */
static int att_row_end(const int32_t *docs, int jlast, int window, int q_start, int ifirst,
                       int t)
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
    const int64_t end = (int64_t)jlast + window - q_start;
    return end < t ? (int)end : t;
}

/* Soft-capping of the scores s[0..n): s = cap * tanh(s / cap), and dcap[jj] = 1 - tanh^2 (the
 * derivative, for the backward) when dcap is not NULL.  The scalar path's form; the fast
 * path's is fx_cap_row. */
static void att_cap_row(float *restrict s, float *restrict dcap, int n, float cap)
{
    for (int jj = 0; jj < n; jj++) {
        const float th = tanhf(s[jj] / cap);
        s[jj] = cap * th;
        if (dcap)
            dcap[jj] = 1.0f - th * th;
    }
}

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

/* The end of a forward task: its nr query rows (from i0, head h, batch bi) normalised,
 * out = acc / l, and lse = m + log l saved for the backward (when lse is not NULL). */
static void att_store_rows(float *out, float *lse, const float *acc, const float *m,
                           const float *l, int bi, int t, int hq, int h, int i0, int nr, int d)
{
    for (int r = 0; r < nr; r++) {
        float *orow = out + (((size_t)bi * t + i0 + r) * hq + h) * d;
        const float inv = 1.0f / l[r];
        for (int c = 0; c < d; c++)
            orow[c] = acc[(size_t)r * d + c] * inv;
        if (lse)
            lse[((size_t)bi * hq + h) * t + i0 + r] = m[r] + logf(l[r]);
    }
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
                     int hq, int hkv, int d, int q_start, int window, float softcap)
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

/* doc_start of the chunk's positions, [q_start, q_start + t) of each batch row: within
 * [0, position] and non-decreasing (the tile skipping relies on it), else SBPRT_ERR_RANGE.
 * Positions outside the chunk are not read. */
static int att_check_docs(const int32_t *doc_start, int b, int t, int tk, int q_start)
{
    if (!doc_start)
        return SBPRT_OK;
    for (int bi = 0; bi < b; bi++) {
        const int32_t *docs = doc_start + (size_t)bi * tk;
        for (int p = q_start; p < q_start + t; p++)
            if (docs[p] < 0 || docs[p] > p || (p > q_start && docs[p] < docs[p - 1]))
                return SBPRT_ERR_RANGE;
    }
    return SBPRT_OK;
}

/* A window that holds every key of every row of the chunk is no window: 0 from then on,
 * which also keeps window + position sums inside int. */
static int att_window(int window, int q_start, int t)
{
    return (int64_t)window >= (int64_t)q_start + t ? 0 : window;
}

/* ------------------------------------------------------------------ AVX2/FMA fast path
 *
 * On x86-64 CPUs with AVX2 and FMA (checked at run time) and d a multiple of 8, the kernels
 * below replace the per-row loops above: a task packs its query (or key) tile, computes the
 * 64 x 64 score tile with a register-blocked micro-kernel (4 rows x 16 columns, FMAs over d
 * in order), runs the softmax on whole rows with a vectorised exp, and does P·V (and the
 * backward's dS·K, Pᵀ·dO, dSᵀ·Q) with a second micro-kernel (4 rows x 16 columns, FMAs over
 * the keys in order).  Every output element is still summed in an order fixed by the
 * absolute key tiles and the partitioning alone: a row's scores depend only on its own q
 * and the key tile, masked keys (after the row's position, or padding) get p = 0 exactly
 * and add nothing, so a chunk's rows equal the full call's rows bitwise and nothing depends
 * on the thread count.  Keys at or after the chunk's end are never read. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include "simd.h"
#define ATT_FAST 1
#define FX __attribute__((target("avx2,fma")))
#define FB 64 /* query rows and keys per tile */
/* The fused backward (one task per batch and kv head) needs this many tasks to keep a few
 * threads busy; below it the two passes (tasks per query or key tile) run instead. */
#define FX_FUSED_MIN_TASKS 4

static int att_fast_ok(int d) { return cpu_have_avx2() && d % 8 == 0 && d <= 256; }

/* C[r, j] = scale * Σ_c A[r, c] Bt[c, j] for r < m (a multiple of 4), j < n (a multiple of
 * 16); A is [m, d], Bt is [d, FB], C is [m, FB]. */
FX static void fx_nt(float *restrict C, const float *restrict A, const float *restrict Bt,
                     int m, int n, int d, float scale)
{
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = 0; r < m; r += 4) {
        const float *a = A + (size_t)r * d;
        for (int j = 0; j < n; j += 16) {
            __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
                   c21 = c00, c30 = c00, c31 = c00;
            for (int c = 0; c < d; c++) {
                const __m256 b0 = _mm256_loadu_ps(Bt + (size_t)c * FB + j);
                const __m256 b1 = _mm256_loadu_ps(Bt + (size_t)c * FB + j + 8);
                __m256 x = _mm256_broadcast_ss(a + c);
                c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
                x = _mm256_broadcast_ss(a + d + c);
                c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
                x = _mm256_broadcast_ss(a + 2 * d + c);
                c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
                x = _mm256_broadcast_ss(a + 3 * d + c);
                c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
            }
            float *o = C + (size_t)r * FB + j;
            _mm256_storeu_ps(o, _mm256_mul_ps(c00, sc));
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(c01, sc));
            _mm256_storeu_ps(o + FB, _mm256_mul_ps(c10, sc));
            _mm256_storeu_ps(o + FB + 8, _mm256_mul_ps(c11, sc));
            _mm256_storeu_ps(o + 2 * FB, _mm256_mul_ps(c20, sc));
            _mm256_storeu_ps(o + 2 * FB + 8, _mm256_mul_ps(c21, sc));
            _mm256_storeu_ps(o + 3 * FB, _mm256_mul_ps(c30, sc));
            _mm256_storeu_ps(o + 3 * FB + 8, _mm256_mul_ps(c31, sc));
        }
    }
}

/* C[r, :d] += Σ_{k < kn} A[r, k] B[k, :d] for r < m (a multiple of 4); A is [m, FB], B's
 * rows are ldb apart, C is [m, d]; the sum runs over k in order. */
FX static void fx_acc(float *restrict C, const float *restrict A, const float *restrict B,
                      size_t ldb, int m, int kn, int d)
{
    const size_t ldc = (size_t)d;
    for (int r = 0; r < m; r += 4) {
        const float *a = A + (size_t)r * FB;
        float *o0 = C + (size_t)r * ldc, *o1 = o0 + ldc, *o2 = o1 + ldc, *o3 = o2 + ldc;
        int c = 0;
        for (; c + 16 <= d; c += 16) {
            __m256 c00 = _mm256_loadu_ps(o0 + c), c01 = _mm256_loadu_ps(o0 + c + 8);
            __m256 c10 = _mm256_loadu_ps(o1 + c), c11 = _mm256_loadu_ps(o1 + c + 8);
            __m256 c20 = _mm256_loadu_ps(o2 + c), c21 = _mm256_loadu_ps(o2 + c + 8);
            __m256 c30 = _mm256_loadu_ps(o3 + c), c31 = _mm256_loadu_ps(o3 + c + 8);
            for (int k = 0; k < kn; k++) {
                const __m256 b0 = _mm256_loadu_ps(B + k * ldb + c);
                const __m256 b1 = _mm256_loadu_ps(B + k * ldb + c + 8);
                __m256 x = _mm256_broadcast_ss(a + k);
                c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
                x = _mm256_broadcast_ss(a + FB + k);
                c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
                x = _mm256_broadcast_ss(a + 2 * FB + k);
                c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
                x = _mm256_broadcast_ss(a + 3 * FB + k);
                c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
            }
            _mm256_storeu_ps(o0 + c, c00), _mm256_storeu_ps(o0 + c + 8, c01);
            _mm256_storeu_ps(o1 + c, c10), _mm256_storeu_ps(o1 + c + 8, c11);
            _mm256_storeu_ps(o2 + c, c20), _mm256_storeu_ps(o2 + c + 8, c21);
            _mm256_storeu_ps(o3 + c, c30), _mm256_storeu_ps(o3 + c + 8, c31);
        }
        for (; c < d; c += 8) {
            __m256 c0 = _mm256_loadu_ps(o0 + c), c1 = _mm256_loadu_ps(o1 + c);
            __m256 c2 = _mm256_loadu_ps(o2 + c), c3 = _mm256_loadu_ps(o3 + c);
            for (int k = 0; k < kn; k++) {
                const __m256 b0 = _mm256_loadu_ps(B + k * ldb + c);
                c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + k), b0, c0);
                c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + FB + k), b0, c1);
                c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 2 * FB + k), b0, c2);
                c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(a + 3 * FB + k), b0, c3);
            }
            _mm256_storeu_ps(o0 + c, c0), _mm256_storeu_ps(o1 + c, c1);
            _mm256_storeu_ps(o2 + c, c2), _mm256_storeu_ps(o3 + c, c3);
        }
    }
}

#define fx_exp cpu_exp8 /* simd.h */

/* Row r of an FB-wide tile: s[jj] = -inf outside the row's keys [lo, hi); then
 * p = exp(s - sub) written over s; returns the sum of p (fixed tree order). */
FX static float fx_exp_row(float *restrict s, int lo, int hi, float sub)
{
    for (int jj = 0; jj < lo && jj < FB; jj++)
        s[jj] = -INFINITY;
    for (int jj = hi < 0 ? 0 : hi; jj < FB; jj++)
        s[jj] = -INFINITY;
    const __m256 m = _mm256_set1_ps(sub);
    __m256 acc = _mm256_setzero_ps();
    for (int jj = 0; jj < FB; jj += 8) {
        __m256 p = fx_exp(_mm256_sub_ps(_mm256_loadu_ps(s + jj), m));
        _mm256_storeu_ps(s + jj, p);
        acc = _mm256_add_ps(acc, p);
    }
    float a[8];
    _mm256_storeu_ps(a, acc);
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Rows n0..n-1 of a tile (d floats each, row_stride apart from src, the tile's row 0) into a
 * packed [FB, d] tile; rows 0..n0-1 (keys before the window, never read) and n..n4-1 are 0. */
static void fx_pack(float *restrict dst, const float *restrict src, size_t row_stride, int n0,
                    int n, int n4, int d)
{
    memset(dst, 0, (size_t)n0 * d * sizeof(float));
    for (int r = n0; r < n; r++)
        memcpy(dst + (size_t)r * d, src + r * row_stride, (size_t)d * sizeof(float));
    memset(dst + (size_t)n * d, 0, (size_t)(n4 - n) * d * sizeof(float));
}

/* Rows n0..n-1 of a tile (src: its row 0) transposed into [d, FB]; columns 0..n0-1 (keys
 * before the window, never read) and n..FB-1 are zero. */
static void fx_transpose(float *restrict dst, const float *restrict src, size_t row_stride,
                         int n0, int n, int d)
{
    for (int c = 0; c < d; c++) {
        memset(dst + (size_t)c * FB, 0, (size_t)n0 * sizeof(float));
        memset(dst + (size_t)c * FB + n, 0, (size_t)(FB - n) * sizeof(float));
    }
    for (int jj = n0; jj < n; jj++)
        for (int c = 0; c < d; c++)
            dst[(size_t)c * FB + jj] = src[jj * row_stride + c];
}

/* Soft-capping of s[0..n) (n a multiple of 8): s = cap * tanh(s / cap) and, when dcap is not
 * NULL, dcap = 1 - tanh^2. */
FX static void fx_cap_row(float *restrict s, float *restrict dcap, int n, float cap)
{
    const __m256 c = _mm256_set1_ps(cap), one = _mm256_set1_ps(1.0f);
    for (int jj = 0; jj < n; jj += 8) {
        const __m256 th = cpu_tanh8(_mm256_div_ps(_mm256_loadu_ps(s + jj), c));
        _mm256_storeu_ps(s + jj, _mm256_mul_ps(c, th));
        if (dcap)
            _mm256_storeu_ps(dcap + jj, _mm256_fnmadd_ps(th, th, one));
    }
}

static int r4(int n) { return (n + 3) & ~3; }
static int r16(int n) { return (n + 15) & ~15; }

FX static int fx_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q, const float *k,
                         const float *v, const int32_t *doc_start, int b, int t, int tk, int hq,
                         int hkv, int d, int q_start, float scale, int window, float cap)
{
    const int group = hq / hkv;
    const int nqt = (t + FB - 1) / FB;
    const int64_t ntasks = (int64_t)b * hq * nqt;
    const size_t kv_row = (size_t)hkv * d, q_row = (size_t)hq * d;
    /* per thread: qp, acc [FB, d]; kt [d, FB]; s [FB, FB]; m, l [FB] */
    const size_t per_thread = att_round16((size_t)3 * FB * d + (size_t)FB * FB + 2 * FB);
    float *scratch;
    int st = cpu_scratch(ctx, per_thread * ctx->nthreads * sizeof(float), (void **)&scratch);
    if (st)
        return st;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
    for (int64_t task = 0; task < ntasks; task++) {
        const int qt = nqt - 1 - (int)(task % nqt); /* the longest rows first */
        const int h = (int)(task / nqt % hq);
        const int bi = (int)(task / nqt / hq);
        const int g = h / group;
        const int i0 = qt * FB;
        const int nr = t - i0 < FB ? t - i0 : FB, nr4 = r4(nr);
        const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
        float *qp = scratch + per_thread * omp_get_thread_num();
        float *acc = qp + (size_t)FB * d, *kt = acc + (size_t)FB * d;
        float *s = kt + (size_t)FB * d, *m = s + (size_t)FB * FB, *l = m + FB;
        fx_pack(qp, q + (((size_t)bi * t + i0) * hq + h) * d, q_row, 0, nr, nr4, d);
        memset(acc, 0, (size_t)nr4 * d * sizeof(float));
        for (int r = 0; r < nr; r++)
            m[r] = -INFINITY, l[r] = 0;
        /* keys [kfirst, kend) are visible to some row of this tile; other tiles are skipped */
        const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
        for (int j0 = kfirst / FB * FB; j0 < kend; j0 += FB) {
            const int jn = kend - j0 < FB ? kend - j0 : FB;
            const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
            const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
            const float *vbase = v + (((size_t)bi * tk + j0) * hkv + g) * d;
            fx_transpose(kt, kbase, kv_row, js, jn, d);
            fx_nt(s, qp, kt, nr4, r16(jn), d, scale);
            for (int r = 0; r < nr; r++) {
                float *sr = s + (size_t)r * FB;
                const int pos = q_start + i0 + r;
                const int first = att_lo(docs, pos, window);
                const int lo = first > j0 ? first - j0 : 0;
                const int hi = pos + 1 - j0 < jn ? pos + 1 - j0 : jn;
                if (hi <= lo) { /* no key of this tile in the row's window: p = 0 */
                    memset(sr, 0, FB * sizeof(float));
                    continue;
                }
                if (cap > 0)
                    fx_cap_row(sr, NULL, r16(jn), cap);
                float mt = -INFINITY;
                for (int jj = lo; jj < hi; jj++)
                    mt = sr[jj] > mt ? sr[jj] : mt;
                const float mnew = m[r] > mt ? m[r] : mt;
                const float alpha = expf(m[r] - mnew); /* 0 on the row's first tile */
                const float sum = fx_exp_row(sr, lo, hi, mnew);
                l[r] = l[r] * alpha + sum;
                float *ar = acc + (size_t)r * d;
                for (int c = 0; c < d; c++)
                    ar[c] *= alpha;
                m[r] = mnew;
            }
            memset(s + (size_t)nr * FB, 0, (size_t)(nr4 - nr) * FB * sizeof(float));
            fx_acc(acc, s + js, vbase + js * kv_row, kv_row, nr4, jn - js, d);
        }
        att_store_rows(out, lse, acc, m, l, bi, t, hq, h, i0, nr, d);
    }
    return SBPRT_OK;
}

/* The backward's two passes with the fast kernels; delta as computed by the caller. */
/* P = exp(S - lse) on the visible entries and dP <- P * (dP - delta) (times the cap's
 * derivative), one 64-row tile of transposed scores (row jj: key j0 + jj; column ii: query
 * row i0 + ii), capped first when cap > 0; dc: [FB] scratch. Its own function because clang
 * outlines OpenMP region bodies without the enclosing function's target("avx2,fma")
 * attribute. */
FX static void fx_probs_dp(float *s, float *dp, float *dc, const float *ls, const float *dl,
                           const int *rlo, int nc, int j0, int q_start, int i0, int ni,
                           float cap)
{
    int ihi = 0;
    for (int jj = 0; jj < nc; jj++) {
        float *sr = s + (size_t)jj * FB, *dpr = dp + (size_t)jj * FB;
        /* query ii sees key j0 + jj when q_start + i0 + ii >= j0 + jj and its first key
         * rlo[ii] <= j0 + jj; rlo grows with ii, so those rows end at ihi, which only grows
         * with the key */
        int ilo = j0 + jj - q_start - i0;
        ilo = ilo < 0 ? 0 : ilo;
        while (ihi < ni && rlo[ihi] <= j0 + jj)
            ihi++;
        if (cap > 0)
            fx_cap_row(sr, dc, FB, cap);
        for (int ii = 0; ii < FB; ii += 8) {
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(sr + ii),
                                     _mm256_loadu_ps(ls + ii));
            const __m256i idx = _mm256_add_epi32(
                _mm256_set1_epi32(ii),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            const __m256 vis = _mm256_castsi256_ps(_mm256_and_si256(
                _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(ilo - 1)),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(ihi), idx)));
            x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, vis);
            const __m256 p = fx_exp(x);
            _mm256_storeu_ps(sr + ii, p);
            __m256 ds = _mm256_mul_ps(
                p, _mm256_sub_ps(_mm256_loadu_ps(dpr + ii),
                                 _mm256_loadu_ps(dl + ii)));
            if (cap > 0)
                ds = _mm256_mul_ps(ds, _mm256_loadu_ps(dc + ii));
            _mm256_storeu_ps(dpr + ii, ds);
        }
    }
}

/* The per-thread scratch of the backward's key-tile tasks. */
typedef struct fx_kt {
    float *kp, *vp;   /* [FB, d] the key and value tile, packed */
    float *qt, *gt;   /* [d, FB] a query tile and its dout, transposed */
    float *dka, *dva; /* [FB, d] the key tile's dK and dV sums */
    float *s, *dp;    /* [FB, FB] P and dS of a (key tile, query tile) pair, one row per key */
    float *ls, *dl;   /* [FB] the query rows' lse and delta */
    float *dc;        /* [FB] a row's soft-cap derivative */
    float *end;       /* what follows: the fused pass's own scratch */
} fx_kt;

static fx_kt fx_kt_at(float *base, int d)
{
    fx_kt w;
    const size_t td = (size_t)FB * d, tt = (size_t)FB * FB;
    w.kp = base, w.vp = w.kp + td, w.qt = w.vp + td, w.gt = w.qt + td;
    w.dka = w.gt + td, w.dva = w.dka + td, w.s = w.dva + td, w.dp = w.s + tt;
    w.ls = w.dp + tt, w.dl = w.ls + FB, w.dc = w.dl + FB, w.end = w.dc + FB;
    return w;
}

/* One (key tile, query tile) pair, from the key tile's side: P (w->s) and dS without the
 * scale (w->dp) of its nc keys x ni query rows, then dV += P dout and dK += dS q over the
 * tile's rows. q, dout: the tile's first row, rows q_row apart; lse, delta: its rows'. */
FX static void fx_kt_pair(const fx_kt *w, const float *q, const float *dout, const float *lse,
                          const float *delta, size_t q_row, int nc, int ni, int j0, int q_start,
                          int i0, int d, float scale, const int32_t *docs, int window, float cap)
{
    const int nc4 = r4(nc);
    int rlo[FB]; /* the first key of each query row */
    for (int ii = 0; ii < ni; ii++)
        rlo[ii] = att_lo(docs, q_start + i0 + ii, window);
    fx_transpose(w->qt, q, q_row, 0, ni, d);
    fx_transpose(w->gt, dout, q_row, 0, ni, d);
    for (int ii = 0; ii < FB; ii++) {
        w->ls[ii] = ii < ni ? lse[ii] : 0;
        w->dl[ii] = ii < ni ? delta[ii] : 0;
    }
    fx_nt(w->s, w->kp, w->qt, nc4, r16(ni), d, scale);
    fx_nt(w->dp, w->vp, w->gt, nc4, r16(ni), d, 1.0f);
    fx_probs_dp(w->s, w->dp, w->dc, w->ls, w->dl, rlo, nc, j0, q_start, i0, ni, cap);
    memset(w->s + (size_t)nc * FB, 0, (size_t)(nc4 - nc) * FB * sizeof(float));
    memset(w->dp + (size_t)nc * FB, 0, (size_t)(nc4 - nc) * FB * sizeof(float));
    fx_acc(w->dva, w->s, dout, q_row, nc4, ni, d);
    fx_acc(w->dka, w->dp, q, q_row, nc4, ni, d);
}

/* The fused backward: one task per (batch, kv head) walks the key tiles in order and, for
 * each, every query head of the group and every query row that sees the tile: the scores and
 * dP once (5 tile products instead of the two passes' 7). dK and dV of the tile accumulate as
 * in pass 2; dQ rows get the tile's scale * dS^T K added at once, in key-tile order. The task
 * owns the dQ rows of its group's heads, so no two threads write the same row; a row's sum
 * runs over the key tiles in order, whatever the thread count or the chunk it belongs to. */
FX static void fx_backward_fused(sbprt_ctx *ctx, float *thread_base, size_t per_thread,
                                 const float *delta, float *dq, float *dk, float *dv,
                                 const float *dout, const float *q, const float *k,
                                 const float *v, const float *lse, const int32_t *doc_start, int b,
                                 int t, int tk, int hq, int hkv, int d, int q_start, float scale,
                                 int window, float cap)
{
    const int group = hq / hkv;
    const size_t kv_row = (size_t)hkv * d, q_row = (size_t)hq * d;
    const int kend = q_start + t;
    const int nkt = (kend + FB - 1) / FB;
    const int ntasks = b * hkv;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
    for (int task = 0; task < ntasks; task++) {
        const int g = task % hkv, bi = task / hkv;
        const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
        const int klo = att_lo(docs, q_start, window); /* the keys the chunk reads: [klo, kend) */
        const fx_kt w = fx_kt_at(thread_base + per_thread * omp_get_thread_num(), d);
        float *tmp = w.end, *dpt = tmp + (size_t)FB * d; /* [FB, d], [FB, FB] */
        for (int kt_idx = klo / FB; kt_idx < nkt; kt_idx++) {
            const int j0 = kt_idx * FB;
            const int nc = kend - j0 < FB ? kend - j0 : FB, nc4 = r4(nc);
            const int js = klo > j0 ? klo - j0 : 0; /* keys before js: never read */
            const size_t koff = (((size_t)bi * tk + j0) * hkv + g) * d;
            fx_pack(w.kp, k + koff, kv_row, js, nc, nc4, d);
            fx_pack(w.vp, v + koff, kv_row, js, nc, nc4, d);
            memset(w.dka, 0, (size_t)2 * FB * d * sizeof(float));
            /* the query rows that see some key of the tile */
            const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
            const int iend = att_row_end(docs, j0 + nc - 1, window, q_start, ifirst, t);
            for (int hh = 0; hh < group; hh++) {
                const int h = g * group + hh;
                for (int i0 = ifirst; i0 < iend; i0 += FB) {
                    const int ni = iend - i0 < FB ? iend - i0 : FB, ni4 = r4(ni);
                    const size_t qoff = (((size_t)bi * t + i0) * hq + h) * d;
                    fx_kt_pair(&w, q + qoff, dout + qoff, lse + ((size_t)bi * hq + h) * t + i0,
                               delta + ((size_t)bi * hq + h) * t + i0, q_row, nc, ni, j0,
                               q_start, i0, d, scale, docs, window, cap);
                    /* dq rows [i0, i0 + ni) += (scale dS)^T K: dS^T as an [ni4, FB] tile */
                    for (int ii = 0; ii < ni4; ii++)
                        for (int jj = 0; jj < nc; jj++)
                            dpt[(size_t)ii * FB + jj] = ii < ni ? scale * w.dp[(size_t)jj * FB + ii]
                                                                : 0.0f;
                    /* the tile's sum from zero, then added: a row's arithmetic is the same
                     * whichever tile of rows it falls in (a chunk's rows equal the full call's) */
                    memset(tmp, 0, (size_t)ni4 * d * sizeof(float));
                    fx_acc(tmp, dpt, w.kp, (size_t)d, ni4, nc, d);
                    for (int r = 0; r < ni; r++)
                        cpu_axpy(dq + qoff + r * q_row, 1.0f, tmp + (size_t)r * d, d);
                }
            }
            for (int jj = js; jj < nc; jj++) {
                cpu_axpy(dk + koff + jj * kv_row, scale, w.dka + (size_t)jj * d, d);
                cpu_axpy(dv + koff + jj * kv_row, 1.0f, w.dva + (size_t)jj * d, d);
            }
        }
    }
}

FX static void fx_backward(sbprt_ctx *ctx, float *thread_base, size_t per_thread,
                           const float *delta, float *dq, float *dk, float *dv,
                           const float *dout, const float *q, const float *k, const float *v,
                           const float *lse, const int32_t *doc_start, int b, int t, int tk,
                           int hq, int hkv, int d, int q_start, float scale, int window, float cap)
{
    /* by shape only (never by thread count), so results do not depend on the threads */
    if (dq && dk && (int64_t)b * hkv >= FX_FUSED_MIN_TASKS) {
        fx_backward_fused(ctx, thread_base, per_thread, delta, dq, dk, dv, dout, q, k, v, lse,
                          doc_start, b, t, tk, hq, hkv, d, q_start, scale, window, cap);
        return;
    }
    const int group = hq / hkv;
    const size_t kv_row = (size_t)hkv * d, q_row = (size_t)hq * d;
    if (dq) {
        const int nqt = (t + FB - 1) / FB;
        const int64_t ntasks = (int64_t)b * hq * nqt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int qt = nqt - 1 - (int)(task % nqt); /* the longest rows first */
            const int h = (int)(task / nqt % hq);
            const int bi = (int)(task / nqt / hq);
            const int g = h / group;
            const int i0 = qt * FB;
            const int nr = t - i0 < FB ? t - i0 : FB, nr4 = r4(nr);
            const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
            float *qp = thread_base + per_thread * omp_get_thread_num();
            float *gp = qp + (size_t)FB * d, *kt = gp + (size_t)FB * d, *vt = kt + (size_t)FB * d;
            float *acc = vt + (size_t)FB * d, *s = acc + (size_t)FB * d, *dp = s + (size_t)FB * FB;
            float *dc = dp + (size_t)FB * FB; /* [FB] */
            const size_t qoff = (((size_t)bi * t + i0) * hq + h) * d;
            const size_t srow = ((size_t)bi * hq + h) * t + i0;
            fx_pack(qp, q + qoff, q_row, 0, nr, nr4, d);
            fx_pack(gp, dout + qoff, q_row, 0, nr, nr4, d);
            memset(acc, 0, (size_t)nr4 * d * sizeof(float));
            const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
            for (int j0 = kfirst / FB * FB; j0 < kend; j0 += FB) {
                const int jn = kend - j0 < FB ? kend - j0 : FB;
                const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
                const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
                fx_transpose(kt, kbase, kv_row, js, jn, d);
                fx_transpose(vt, v + (((size_t)bi * tk + j0) * hkv + g) * d, kv_row, js, jn, d);
                fx_nt(s, qp, kt, nr4, r16(jn), d, scale);
                fx_nt(dp, gp, vt, nr4, r16(jn), d, 1.0f);
                for (int r = 0; r < nr; r++) {
                    float *sr = s + (size_t)r * FB;
                    const float *dpr = dp + (size_t)r * FB;
                    const int pos = q_start + i0 + r;
                    const int first = att_lo(docs, pos, window);
                    const int lo = first > j0 ? first - j0 : 0;
                    if (cap > 0)
                        fx_cap_row(sr, dc, r16(jn), cap);
                    /* a row without keys in the tile gets p = 0 (lse is finite) */
                    fx_exp_row(sr, lo, pos + 1 - j0 < jn ? pos + 1 - j0 : jn, lse[srow + r]);
                    const float dl = delta[srow + r];
                    for (int jj = 0; jj < FB; jj++)
                        sr[jj] = sr[jj] * (dpr[jj] - dl);
                    if (cap > 0)
                        for (int jj = 0; jj < r16(jn); jj++)
                            sr[jj] *= dc[jj];
                }
                memset(s + (size_t)nr * FB, 0, (size_t)(nr4 - nr) * FB * sizeof(float));
                fx_acc(acc, s + js, kbase + js * kv_row, kv_row, nr4, jn - js, d);
            }
            for (int r = 0; r < nr; r++)
                cpu_axpy(dq + qoff + r * q_row, scale, acc + (size_t)r * d, d);
        }
    }
    if (dk) {
        /* the key tiles holding the keys the chunk reads, [klo, kend): the window's first key
         * bounds every batch row's; a tile before a row's documents is skipped below */
        const int kend = q_start + t;
        const int kt0 = att_lo(NULL, q_start, window) / FB, nkt = (kend + FB - 1) / FB - kt0;
        const int64_t ntasks = (int64_t)b * hkv * nkt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int kt_idx = kt0 + (int)(task % nkt);
            const int g = (int)(task / nkt % hkv);
            const int bi = (int)(task / nkt / hkv);
            const int j0 = kt_idx * FB;
            const int nc = kend - j0 < FB ? kend - j0 : FB, nc4 = r4(nc);
            const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
            const int klo = att_lo(docs, q_start, window);
            if (j0 + nc <= klo)
                continue; /* wholly before the chunk's first document */
            const int js = klo > j0 ? klo - j0 : 0; /* keys before js: never read */
            const fx_kt w = fx_kt_at(thread_base + per_thread * omp_get_thread_num(), d);
            const size_t koff = (((size_t)bi * tk + j0) * hkv + g) * d;
            fx_pack(w.kp, k + koff, kv_row, js, nc, nc4, d);
            fx_pack(w.vp, v + koff, kv_row, js, nc, nc4, d);
            memset(w.dka, 0, (size_t)2 * FB * d * sizeof(float));
            const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
            const int iend = att_row_end(docs, j0 + nc - 1, window, q_start, ifirst, t);
            for (int hh = 0; hh < group; hh++) {
                const int h = g * group + hh;
                for (int i0 = ifirst; i0 < iend; i0 += FB) {
                    const int ni = iend - i0 < FB ? iend - i0 : FB;
                    const size_t qoff = (((size_t)bi * t + i0) * hq + h) * d;
                    fx_kt_pair(&w, q + qoff, dout + qoff, lse + ((size_t)bi * hq + h) * t + i0,
                               delta + ((size_t)bi * hq + h) * t + i0, q_row, nc, ni, j0,
                               q_start, i0, d, scale, docs, window, cap);
                }
            }
            for (int jj = js; jj < nc; jj++) {
                cpu_axpy(dk + koff + jj * kv_row, scale, w.dka + (size_t)jj * d, d);
                cpu_axpy(dv + koff + jj * kv_row, 1.0f, w.dva + (size_t)jj * d, d);
            }
        }
    }
}
#endif /* fast path */

int sbprt_attention_forward_packed(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                                   const float *k, const float *v, const int32_t *doc_start,
                                   int b, int t, int tk, int hq, int hkv, int d, int q_start,
                                   float scale, int window, float softcap)
{
    CPU_CHECK(ctx);
    int st = att_check(q, k, v, b, t, tk, hq, hkv, d, q_start, window, softcap);
    if (st)
        return st;
    if (b == 0 || t == 0 || hq == 0)
        return SBPRT_OK;
    CPU_CHECK(out);
    st = att_check_docs(doc_start, b, t, tk, q_start);
    if (st)
        return st;
    window = att_window(window, q_start, t);
#ifdef ATT_FAST
    if (att_fast_ok(d))
        return fx_forward(ctx, out, lse, q, k, v, doc_start, b, t, tk, hq, hkv, d, q_start, scale,
                          window, softcap);
#endif

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

#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
    for (int64_t task = 0; task < ntasks; task++) {
        const int qt = nqt - 1 - (int)(task % nqt); /* the longest rows first */
        const int h = (int)(task / nqt % hq);
        const int bi = (int)(task / nqt / hq);
        const int g = h / group;
        const int i0 = qt * ATT_BR;
        const int nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;
        const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;

        float *acc = scratch + per_thread * omp_get_thread_num();
        float *kt = acc + (size_t)ATT_BR * d;
        float *m = kt + (size_t)d * ATT_BC, *l = m + ATT_BR, *s = l + ATT_BR;
        memset(acc, 0, (size_t)nr * d * sizeof(float));
        for (int r = 0; r < nr; r++) {
            m[r] = -INFINITY;
            l[r] = 0;
        }

        /* Keys [kfirst, kend) are visible to some row of this tile; other tiles are skipped. */
        const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
        for (int j0 = kfirst / ATT_BC * ATT_BC; j0 < kend; j0 += ATT_BC) {
            const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
            const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
            const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
            const float *vbase = v + (((size_t)bi * tk + j0) * hkv + g) * d;
            att_transpose_tile(kt + js, kbase + js * kv_row, kv_row, j1 - j0 - js, d);
            for (int r = 0; r < nr; r++) {
                const int pos = q_start + i0 + r;
                /* the keys [ja, jb) of the tile the row sees */
                const int first = att_lo(docs, pos, window);
                const int ja = first > j0 ? first - j0 : 0;
                const int jb = (j1 < pos + 1 ? j1 : pos + 1) - j0;
                if (jb <= ja)
                    continue; /* the tile lies wholly outside this row's window */
                att_row_scores(s + ja, q + (((size_t)bi * t + i0 + r) * hq + h) * d, kt + ja,
                               jb - ja, d, scale);
                if (softcap > 0)
                    att_cap_row(s + ja, NULL, jb - ja, softcap);
                float mt = -INFINITY;
                for (int jj = ja; jj < jb; jj++)
                    mt = s[jj] > mt ? s[jj] : mt;
                const float mnew = m[r] > mt ? m[r] : mt;
                const float alpha = expf(m[r] - mnew); /* 0 on the row's first tile (m = -inf) */
                float *ar = acc + (size_t)r * d;
                l[r] *= alpha;
                for (int c = 0; c < d; c++)
                    ar[c] *= alpha;
                for (int jj = ja; jj < jb; jj++) {
                    const float p = expf(s[jj] - mnew);
                    l[r] += p;
                    cpu_axpy(ar, p, vbase + jj * kv_row, d);
                }
                m[r] = mnew;
            }
        }

        att_store_rows(out, lse, acc, m, l, bi, t, hq, h, i0, nr, d);
    }
    return SBPRT_OK;
}

int sbprt_attention_forward_ex(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                               const float *k, const float *v, int b, int t, int tk, int hq,
                               int hkv, int d, int q_start, float scale, int window,
                               float softcap)
{
    return sbprt_attention_forward_packed(ctx, out, lse, q, k, v, NULL, b, t, tk, hq, hkv, d,
                                          q_start, scale, window, softcap);
}

int sbprt_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                            const float *k, const float *v, int b, int t, int tk, int hq,
                            int hkv, int d, int q_start, float scale)
{
    return sbprt_attention_forward_ex(ctx, out, lse, q, k, v, b, t, tk, hq, hkv, d, q_start,
                                      scale, 0, 0.0f);
}

int sbprt_attention_backward_packed(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse,
                                    const int32_t *doc_start, int b, int t, int tk, int hq,
                                    int hkv, int d, int q_start, float scale, int window,
                                    float softcap)
{
    CPU_CHECK(ctx);
    int st = att_check(q, k, v, b, t, tk, hq, hkv, d, q_start, window, softcap);
    if (st)
        return st;
    CPU_CHECK((dk == NULL) == (dv == NULL));
    if (b == 0 || t == 0 || hq == 0 || (!dq && !dk))
        return SBPRT_OK;
    CPU_CHECK(dout && out && lse);
    st = att_check_docs(doc_start, b, t, tk, q_start);
    if (st)
        return st;
    window = att_window(window, q_start, t);

    const int group = hq / hkv;
    const size_t kv_row = (size_t)hkv * d;
    const size_t nrows = (size_t)b * hq * t; /* delta has one entry per (b, h, i), as lse */
    /* per thread: kt, vt [d, ATT_BC]; s, dp, dc [ATT_BC]; then acc [ATT_BR, d] (pass 1) or
     * dkacc, dvacc [ATT_BC, d] (pass 2) */
    const size_t acc_len = (size_t)(2 * ATT_BC > ATT_BR ? 2 * ATT_BC : ATT_BR) * d;
    size_t per_thread = att_round16((size_t)2 * d * ATT_BC + 3 * ATT_BC + acc_len);
#ifdef ATT_FAST
    const int fast = att_fast_ok(d);
    if (fast) /* qp, gp, kt, vt, acc or kp, vp, qt, gt, dka, dva, tmp; s, dp, dpt; ls, dl, dc */
        per_thread = att_round16((size_t)7 * FB * d + (size_t)3 * FB * FB + 3 * FB);
#endif
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

#ifdef ATT_FAST
    if (fast) {
        fx_backward(ctx, thread_base, per_thread, delta, dq, dk, dv, dout, q, k, v, lse,
                    doc_start, b, t, tk, hq, hkv, d, q_start, scale, window, softcap);
        return SBPRT_OK;
    }
#endif

    /* Pass 1: dq, one task per (batch, query head, query tile), as in the forward. */
    if (dq) {
        const int nqt = (t + ATT_BR - 1) / ATT_BR;
        const int64_t ntasks = (int64_t)b * hq * nqt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int qt = nqt - 1 - (int)(task % nqt); /* the longest rows first */
            const int h = (int)(task / nqt % hq);
            const int bi = (int)(task / nqt / hq);
            const int g = h / group;
            const int i0 = qt * ATT_BR;
            const int nr = t - i0 < ATT_BR ? t - i0 : ATT_BR;
            const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
            float *kt = thread_base + per_thread * omp_get_thread_num();
            float *vt = kt + (size_t)d * ATT_BC;
            float *s = vt + (size_t)d * ATT_BC, *dp = s + ATT_BC, *dc = dp + ATT_BC;
            float *acc = dc + ATT_BC; /* [ATT_BR, d] */
            memset(acc, 0, (size_t)nr * d * sizeof(float));

            const int kfirst = att_lo(docs, q_start + i0, window), kend = q_start + i0 + nr;
            for (int j0 = kfirst / ATT_BC * ATT_BC; j0 < kend; j0 += ATT_BC) {
                const int j1 = j0 + ATT_BC < kend ? j0 + ATT_BC : kend;
                const int js = kfirst > j0 ? kfirst - j0 : 0; /* keys before js: never read */
                const float *kbase = k + (((size_t)bi * tk + j0) * hkv + g) * d;
                const float *vbase = v + (((size_t)bi * tk + j0) * hkv + g) * d;
                att_transpose_tile(kt + js, kbase + js * kv_row, kv_row, j1 - j0 - js, d);
                att_transpose_tile(vt + js, vbase + js * kv_row, kv_row, j1 - j0 - js, d);
                for (int r = 0; r < nr; r++) {
                    const int pos = q_start + i0 + r;
                    const int first = att_lo(docs, pos, window);
                    const int ja = first > j0 ? first - j0 : 0;
                    const int jb = (j1 < pos + 1 ? j1 : pos + 1) - j0;
                    if (jb <= ja)
                        continue;
                    const size_t qoff = (((size_t)bi * t + i0 + r) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i0 + r;
                    const float lse_r = lse[srow], delta_r = delta[srow];
                    att_row_scores(s + ja, q + qoff, kt + ja, jb - ja, d, scale);
                    att_row_scores(dp + ja, dout + qoff, vt + ja, jb - ja, d, 1.0f);
                    if (softcap > 0)
                        att_cap_row(s + ja, dc + ja, jb - ja, softcap);
                    float *ar = acc + (size_t)r * d;
                    for (int jj = ja; jj < jb; jj++) {
                        const float p = expf(s[jj] - lse_r);
                        float ds = p * (dp[jj] - delta_r);
                        if (softcap > 0)
                            ds *= dc[jj];
                        cpu_axpy(ar, ds, kbase + jj * kv_row, d);
                    }
                }
            }
            for (int r = 0; r < nr; r++)
                cpu_axpy(dq + (((size_t)bi * t + i0 + r) * hq + h) * d, scale,
                         acc + (size_t)r * d, d);
        }
    }

    /* Pass 2: dk and dv, one task per (batch, kv head, key tile) over the keys the chunk
     * reads, [klo, kend), summing over the group's query heads and every query row whose
     * window holds some key of the tile.  The grid starts at the window's first key, which
     * bounds every batch row's klo; tiles before a row's klo are skipped. */
    if (dk) {
        const int kend = q_start + t;
        const int kt0 = att_lo(NULL, q_start, window) / ATT_BC;
        const int nkt = (kend + ATT_BC - 1) / ATT_BC - kt0;
        const int64_t ntasks = (int64_t)b * hkv * nkt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(ctx->nthreads)
        for (int64_t task = 0; task < ntasks; task++) {
            const int kt_idx = kt0 + (int)(task % nkt);
            const int g = (int)(task / nkt % hkv);
            const int bi = (int)(task / nkt / hkv);
            const int j0 = kt_idx * ATT_BC;
            const int nc = kend - j0 < ATT_BC ? kend - j0 : ATT_BC;
            const int32_t *docs = doc_start ? doc_start + (size_t)bi * tk : NULL;
            const int klo = att_lo(docs, q_start, window);
            if (j0 + nc <= klo)
                continue; /* wholly before the chunk's first document */
            const int js = klo > j0 ? klo - j0 : 0; /* keys before js: never read */
            float *kt = thread_base + per_thread * omp_get_thread_num();
            float *vt = kt + (size_t)d * ATT_BC;
            float *s = vt + (size_t)d * ATT_BC, *dp = s + ATT_BC, *dc = dp + ATT_BC;
            float *dkacc = dc + ATT_BC;                /* [ATT_BC, d] */
            float *dvacc = dkacc + (size_t)ATT_BC * d; /* [ATT_BC, d] */
            memset(dkacc, 0, (size_t)2 * ATT_BC * d * sizeof(float));
            const size_t koff = (((size_t)bi * tk + j0 + js) * hkv + g) * d;
            att_transpose_tile(kt + js, k + koff, kv_row, nc - js, d);
            att_transpose_tile(vt + js, v + koff, kv_row, nc - js, d);

            const int ifirst = j0 - q_start > 0 ? j0 - q_start : 0;
            const int iend = att_row_end(docs, j0 + nc - 1, window, q_start, ifirst, t);
            for (int hh = 0; hh < group; hh++) {
                const int h = g * group + hh;
                for (int i = ifirst; i < iend; i++) {
                    const int pos = q_start + i;
                    const int first = att_lo(docs, pos, window);
                    const int ja = first > j0 ? first - j0 : 0;
                    const int jb = (j0 + nc < pos + 1 ? j0 + nc : pos + 1) - j0;
                    const size_t qoff = (((size_t)bi * t + i) * hq + h) * d;
                    const size_t srow = ((size_t)bi * hq + h) * t + i;
                    const float lse_i = lse[srow], delta_i = delta[srow];
                    att_row_scores(s + ja, q + qoff, kt + ja, jb - ja, d, scale);
                    att_row_scores(dp + ja, dout + qoff, vt + ja, jb - ja, d, 1.0f);
                    if (softcap > 0)
                        att_cap_row(s + ja, dc + ja, jb - ja, softcap);
                    for (int jj = ja; jj < jb; jj++) {
                        const float p = expf(s[jj] - lse_i);
                        float ds = p * (dp[jj] - delta_i);
                        if (softcap > 0)
                            ds *= dc[jj];
                        cpu_axpy(dvacc + (size_t)jj * d, p, dout + qoff, d);
                        cpu_axpy(dkacc + (size_t)jj * d, ds, q + qoff, d);
                    }
                }
            }
            for (int jj = js; jj < nc; jj++) {
                const size_t off = (((size_t)bi * tk + j0 + jj) * hkv + g) * d;
                cpu_axpy(dk + off, scale, dkacc + (size_t)jj * d, d);
                cpu_axpy(dv + off, 1.0f, dvacc + (size_t)jj * d, d);
            }
        }
    }
    return SBPRT_OK;
}

int sbprt_attention_backward_ex(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse, int b,
                                int t, int tk, int hq, int hkv, int d, int q_start, float scale,
                                int window, float softcap)
{
    return sbprt_attention_backward_packed(ctx, dq, dk, dv, dout, q, k, v, out, lse, NULL, b, t,
                                           tk, hq, hkv, d, q_start, scale, window, softcap);
}

int sbprt_attention_backward(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, int b, int t, int tk, int hq,
                             int hkv, int d, int q_start, float scale)
{
    return sbprt_attention_backward_ex(ctx, dq, dk, dv, dout, q, k, v, out, lse, b, t, tk, hq,
                                       hkv, d, q_start, scale, 0, 0.0f);
}
