/*
 * rt_test.h — helpers shared by the runtime's cmocka tests (header-only, static).
 *
 * The tests follow one pattern: inputs are random fp32 (a fixed-seed generator, never all
 * zeros), the reference is a plain loop in double written in the test, and agreement is
 * measured as the normalised error ‖got − ref‖ / ‖ref‖.  A backward kernel is checked twice:
 * against a double analytic reference, and against central finite differences of the
 * double reference forward, so the expected gradient never comes from the code under test.
 * Backward kernels accumulate, so gradient buffers start from random values and the test
 * compares the increment.
 */
#ifndef RT_TEST_H
#define RT_TEST_H

#include <math.h>
#include <setjmp.h> /* cmocka needs these before cmocka.h */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sbprt.h"

/* fp32 kernel vs double reference. */
#define RT_TOL 1e-5

/* ---- random data -------------------------------------------------------------------- */

typedef struct {
    uint64_t s;
} rt_rng;

static inline uint64_t rt_next(rt_rng *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [lo, hi) */
static inline float rt_uniform(rt_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((rt_next(r) >> 40) * (1.0 / 16777216.0));
}

static inline int rt_randint(rt_rng *r, int n) { return (int)(rt_next(r) % (uint64_t)n); }

static inline void rt_fill(rt_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rt_uniform(r, lo, hi);
}

/* malloc that fails the test instead of returning NULL; n may be 0. */
static inline void *rt_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}
#define RT_NEW(type, n) ((type *)rt_alloc((size_t)(n) * sizeof(type)))

static inline float *rt_random(rt_rng *r, size_t n, float lo, float hi)
{
    float *x = RT_NEW(float, n);
    rt_fill(r, x, n, lo, hi);
    return x;
}

static inline float *rt_copy(const float *x, size_t n)
{
    float *y = RT_NEW(float, n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline double *rt_to_double(const float *x, size_t n)
{
    double *y = RT_NEW(double, n);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

/* ---- error measures ----------------------------------------------------------------- */

/* ‖got − ref‖ / ‖ref‖ (ref must not be all zeros: the tests never make it so). */
static inline double rt_rel_err(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double dlt = (double)got[i] - ref[i];
        num += dlt * dlt;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den);
}

/* The same, for the increment got_after − got_before of an accumulating output. */
static inline double rt_rel_err_delta(const float *after, const float *before, const double *ref,
                                      size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double dlt = ((double)after[i] - before[i]) - ref[i];
        num += dlt * dlt;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den);
}

static inline double rt_rel_err_dd(const double *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num) / sqrt(den);
}

/* Fails with the measured value, which a bare assert_true would hide.  NaN fails.  With
 * RT_VERBOSE set in the environment every measured error is printed (to see the margins). */
#define rt_assert_err(err, tol, what)                                                          \
    do {                                                                                       \
        double e_ = (err);                                                                     \
        if (getenv("RT_VERBOSE"))                                                              \
            print_message("  %-28s %.3g\n", (what), e_);                                      \
        if (!(e_ <= (tol))) {                                                                  \
            print_error("%s: relative error %.3g > %.3g\n", (what), e_, (double)(tol));       \
            fail();                                                                            \
        }                                                                                      \
    } while (0)

#define rt_assert_ok(call) assert_int_equal((call), SBPRT_OK)

/* ---- finite differences ------------------------------------------------------------- */

/* A scalar function of the double inputs of a reference forward (x is the array being
 * differentiated; the rest lives in st). */
typedef double (*rt_scalar_fn)(void *st);

/* Central difference ∂f/∂x[i] with step h, perturbing x in place and restoring it. */
static inline double rt_fd(rt_scalar_fn f, void *st, double *x, size_t i, double h)
{
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(st);
    x[i] = x0 - h;
    double fm = f(st);
    x[i] = x0;
    return (fp - fm) / (2 * h);
}

/* Step for central differences in double: truncation error ~h², rounding ~1e-16/h; 1e-5
 * keeps both far below the fp32 tolerance. */
#define RT_FD_STEP 1e-5

/* Called before the difference at index i, so f can restrict itself to the outputs that x[i]
 * influences (the other terms cancel in the difference; skipping them keeps the tests fast
 * under sanitizers).  NULL: f always sums everything. */
typedef void (*rt_focus_fn)(void *st, size_t i);

/* Compares a kernel's gradient (the increment after − before, or `after` itself when before
 * is NULL) to finite differences of f with respect to x, at `count` indices spread evenly
 * over [0, n) (all of them when count >= n). */
static inline double rt_fd_check(rt_scalar_fn f, rt_focus_fn focus, void *st, double *x,
                                 size_t n, const float *after, const float *before, size_t count)
{
    size_t stride = count >= n ? 1 : n / count;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i += stride) {
        if (focus)
            focus(st, i);
        double g = rt_fd(f, st, x, i, RT_FD_STEP);
        double got = before ? (double)after[i] - before[i] : after[i];
        num += (got - g) * (got - g);
        den += g * g;
    }
    return sqrt(num) / sqrt(den);
}

static inline sbprt_ctx *rt_ctx(int nthreads)
{
    sbprt_ctx *ctx = NULL;
    rt_assert_ok(sbprt_ctx_create(&ctx, nthreads));
    assert_non_null(ctx);
    return ctx;
}

#endif /* RT_TEST_H */
