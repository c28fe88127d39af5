/*
 * loss.c — fused softmax cross-entropy (loss and gradient in one pass over the logits) and
 * the per-row log-probability of the label used by preference / RL objectives, with its
 * gradient (sbprt_label_logprob_backward accumulates, sbprt_label_logprob_grad writes).
 *
 * Each row is independent: max, then Σ exp(x - max) accumulated in double (rows are as long
 * as the vocabulary), then the gradient written in a last pass.  The label's logit is read
 * before that pass, which lets dlogits overwrite logits in place: the LM head's chunk of
 * logits becomes its gradient without a second [n, v] buffer.  Per-row losses go to scratch
 * and are added in row order on one thread, so the loss does not depend on the threads.
 *
 * The row passes (max, Σ exp, the gradient's exp) are where the head's time goes after its
 * GEMMs; on CPUs with AVX2/FMA they run 8 columns at a time with simd.h's exp (the sum still
 * in double, over four lanes and in a fixed order), the last v % 8 columns with libm. Which
 * path runs depends on the CPU only, so a machine's results are the same run to run.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "simd.h"

#ifdef CPU_SIMD
/* max of x[0..v) */
CPU_AVX2 static float row_max8(const float *x, int v)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= v; j += 8)
        m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
    float a[8];
    _mm256_storeu_ps(a, m);
    float mx = a[0];
    for (int l = 1; l < 8; l++)
        mx = a[l] > mx ? a[l] : mx;
    for (; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

/* Σ_j exp(x[j] - sub) in double: each 8 exps summed into two 4-lane double accumulators */
CPU_AVX2 static double row_sumexp8(const float *x, int v, float sub)
{
    const __m256 s8 = _mm256_set1_ps(sub);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int j = 0;
    for (; j + 8 <= v; j += 8) {
        const __m256 e = cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s8));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double a[4], b[4];
    _mm256_storeu_pd(a, lo);
    _mm256_storeu_pd(b, hi);
    double s = ((a[0] + b[0]) + (a[1] + b[1])) + ((a[2] + b[2]) + (a[3] + b[3]));
    for (; j < v; j++)
        s += expf(x[j] - sub);
    return s;
}

/* dx[j] = alpha * exp(x[j] - sub) + beta * dx[j] (beta 0: dx is only written, may be x) */
CPU_AVX2 static void row_exp_axpby8(float *dx, const float *x, int v, float sub, float alpha,
                                   float beta)
{
    const __m256 s8 = _mm256_set1_ps(sub), a8 = _mm256_set1_ps(alpha);
    int j = 0;
    if (beta == 0.0f) {
        for (; j + 8 <= v; j += 8)
            _mm256_storeu_ps(dx + j, _mm256_mul_ps(
                cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s8)), a8));
        for (; j < v; j++)
            dx[j] = expf(x[j] - sub) * alpha;
        return;
    }
    const __m256 b8 = _mm256_set1_ps(beta);
    for (; j + 8 <= v; j += 8)
        _mm256_storeu_ps(dx + j, _mm256_fmadd_ps(
            cpu_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s8)), a8,
            _mm256_mul_ps(_mm256_loadu_ps(dx + j), b8)));
    for (; j < v; j++)
        dx[j] = expf(x[j] - sub) * alpha + dx[j] * beta;
}
#endif

/* Whether the AVX2 row passes run (the CPU check, made once outside the parallel loops). */
static int loss_fast(void)
{
#ifdef CPU_SIMD
    return cpu_have_avx2();
#else
    return 0;
#endif
}

static int loss_check_labels(const int32_t *labels, int n, int v)
{
    for (int r = 0; r < n; r++)
        if (labels[r] != SBPRT_IGNORE_INDEX && (labels[r] < 0 || labels[r] >= v))
            return SBPRT_ERR_RANGE;
    return SBPRT_OK;
}

/* log Σ_j exp(x_j) of one row, shifted by its max for range. */
static float loss_logsumexp(const float *x, int v, int fast)
{
    (void)fast;
#ifdef CPU_SIMD
    if (fast) {
        const float m8 = row_max8(x, v);
        return m8 + (float)log(row_sumexp8(x, v, m8));
    }
#endif
    float mx = -INFINITY;
    for (int j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    double s = 0;
    for (int j = 0; j < v; j++)
        s += expf(x[j] - mx);
    return mx + (float)log(s);
}

int sbprt_cross_entropy_forward_backward(sbprt_ctx *ctx, float *loss_sum, float *dlogits,
                                         const float *logits, const int32_t *labels, int n,
                                         int v, float scale)
{
    CPU_CHECK(ctx && loss_sum && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && logits && labels);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
    double *row_loss; /* [n] */
    st = cpu_scratch(ctx, (size_t)n * sizeof(double), (void **)&row_loss);
    if (st)
        return st;

    const int fast = loss_fast(); /* read before the threads start */
    (void)fast;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits ? dlogits + (size_t)r * v : NULL;
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX) {
            row_loss[r] = 0;
            if (dx)
                memset(dx, 0, (size_t)v * sizeof(float));
            continue;
        }
        const float lse = loss_logsumexp(x, v, fast);
        row_loss[r] = (double)lse - x[y];
        if (dx) {
            /* x[j] is read before dx[j] is written */
#ifdef CPU_SIMD
            if (fast)
                row_exp_axpby8(dx, x, v, lse, scale, 0.0f);
            else
#endif
                for (int j = 0; j < v; j++)
                    dx[j] = expf(x[j] - lse) * scale;
            dx[y] -= scale;
        }
    }

    double total = 0;
    for (int r = 0; r < n; r++)
        total += row_loss[r];
    loss_sum[0] += (float)total;
    return SBPRT_OK;
}

int sbprt_label_logprob_forward(sbprt_ctx *ctx, float *logp, float *lse, const float *logits,
                                const int32_t *labels, int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && logp && logits && labels);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
    const int fast = loss_fast(); /* read before the threads start */
    (void)fast;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        const float z = loss_logsumexp(x, v, fast);
        logp[r] = labels[r] == SBPRT_IGNORE_INDEX ? 0.0f : x[labels[r]] - z;
        if (lse)
            lse[r] = z;
    }
    return SBPRT_OK;
}

int sbprt_label_logprob_backward(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                                 const float *logits, const int32_t *labels, const float *lse,
                                 int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && dlogits && dlogp && logits && labels && lse);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
    const int fast = loss_fast(); /* read before the threads start */
    (void)fast;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX)
            continue;
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits + (size_t)r * v;
        const float g = dlogp[r], z = lse[r];
#ifdef CPU_SIMD
        if (fast)
            row_exp_axpby8(dx, x, v, z, -g, 1.0f);
        else
#endif
            for (int j = 0; j < v; j++)
                dx[j] -= g * expf(x[j] - z);
        dx[y] += g;
    }
    return SBPRT_OK;
}

/* The gradient of Σ_r dlogp[r] * logp[r] written (=) as dlogits: the row's logsumexp (given,
 * or computed as in the cross-entropy), then one pass that reads x[j] before writing dx[j],
 * so dlogits may overwrite the logits in place. Ignored rows get zeros. */
int sbprt_label_logprob_grad(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                             const float *logits, const int32_t *labels, const float *lse,
                             int n, int v)
{
    CPU_CHECK(ctx && n >= 0 && v >= 0);
    if (n == 0)
        return SBPRT_OK;
    CPU_CHECK(v > 0 && dlogits && dlogp && logits && labels);
    int st = loss_check_labels(labels, n, v);
    if (st)
        return st;
    const int fast = loss_fast(); /* read before the threads start */
    (void)fast;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if ((size_t)n * v >= CPU_PARALLEL_MIN)
    for (int r = 0; r < n; r++) {
        const float *x = logits + (size_t)r * v;
        float *dx = dlogits + (size_t)r * v;
        const int y = labels[r];
        if (y == SBPRT_IGNORE_INDEX) {
            memset(dx, 0, (size_t)v * sizeof(float));
            continue;
        }
        const float g = dlogp[r], z = lse ? lse[r] : loss_logsumexp(x, v, fast);
#ifdef CPU_SIMD
        if (fast)
            row_exp_axpby8(dx, x, v, z, -g, 0.0f);
        else
#endif
            for (int j = 0; j < v; j++)
                dx[j] = -(g * expf(x[j] - z));
        dx[y] += g;
    }
    return SBPRT_OK;
}
