/*
 * test_cuda_kernels.c — every function of sbprt.h on the CUDA backend against its CPU twin.
 *
 * Both backends are linked into this program: the CUDA one under the API's names (sbprt_*),
 * the CPU one as cpuref_sbprt_* (its sources compiled again with the names renamed; see
 * runtime/CMakeLists.txt).  Every case draws random inputs (uniform, never all zeros, a fixed
 * seed), gives both backends the same inputs and the same initial output buffers (random too:
 * backward kernels accumulate), and compares each output as a normalised error
 *     ‖cuda − cpu‖ / ‖cpu‖          for outputs a call writes,
 *     ‖cuda − cpu‖ / ‖cpu − init‖   for outputs it accumulates into (relative to the increment),
 * against 1e-5 (fp32), 1e-3 (TF32 GEMM) or 1e-2 (the bf16 entry points: random bf16 inputs,
 * bf16 outputs compared as the fp32 values they stand for).  Each CUDA call is also run twice from the same
 * state and must give bitwise equal outputs (the backend is deterministic), then timed.
 * Besides the kernels: the memory calls, the device-side index checks (the call succeeds,
 * sbprt_sync reports SBPRT_ERR_RANGE once), the out-of-memory diagnostic, argument errors.
 * The sequence-parallel functions (sbprt_sp_*) run on groups of 1, 2 and 4 ranks, one thread
 * and one context each, with a loopback communicator (see "sequence parallelism" below).
 *
 * Prints a table per kernel (cases, max error, tolerance, determinism, time of the largest
 * case) and a summary; exits 0 if everything passed, 1 otherwise, and 77 ("skipped" to
 * ctest) after printing "SKIPPED: no CUDA device" when there is no GPU.  --quick picks small
 * sizes (the CPU emulator build runs with it); --only GROUP runs one group of main()'s list.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SBPRT_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cuda_runtime_api.h>
#endif

#include "sbprt.h"
#define CPUREF_DECLARE
#include "cpuref_names.h"

#define TOL_FP32 1e-5
#define TOL_TF32 1e-3
#define TOL_BF16 1e-2
#define EXIT_SKIP 77

static sbprt_ctx *G; /* the CUDA backend */
static sbprt_ctx *C; /* the CPU twin */
static int quick;    /* --quick: small sizes */
static const char *only; /* --only GROUP: that group of tests alone (e.g. "seqpar") */
static int reps = 5; /* timed repetitions per case (0 with --quick) */
static int nfail;    /* failed checks */

/* ---- random data (splitmix64, as tests/runtime) -------------------------------------- */

static uint64_t rng_state = 0x5eed5eed12345678ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

/* ---- host allocations, freed together at the end of each test function ----------------- */

static void *hlist[1024];
static int nh;

static void *hnew(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p || nh == (int)(sizeof hlist / sizeof hlist[0])) {
        fprintf(stderr, "test: out of host memory\n");
        exit(1);
    }
    hlist[nh++] = p;
    return p;
}

static void hfree_all(void)
{
    while (nh > 0)
        free(hlist[--nh]);
}

static float *hrand(size_t n, float lo, float hi)
{
    float *x = hnew(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = rng_uniform(lo, hi);
    return x;
}

/* bf16 as the runtime rounds it (nearest even), and back. */
static sbprt_bf16 f_to_bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    sbprt_bf16 h;
    h.bits = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                             : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

static void bf_to_floats(float *dst, const sbprt_bf16 *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i].bits << 16;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* n random bf16 values, uniform in [lo, hi) before rounding. */
static sbprt_bf16 *hrand_bf(size_t n, float lo, float hi)
{
    sbprt_bf16 *x = hnew(n * sizeof(sbprt_bf16));
    for (size_t i = 0; i < n; i++)
        x[i] = f_to_bf(rng_uniform(lo, hi));
    return x;
}

/* For the buffers of one case, freed when the case ends. */
static float *xmalloc_floats(size_t n)
{
    float *p = malloc(n ? n * sizeof(float) : 1);
    if (!p) {
        fprintf(stderr, "test: out of host memory\n");
        exit(1);
    }
    return p;
}

/* ---- checks ----------------------------------------------------------------------------- */

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    nfail++;
}

static void check_status(const char *what, int got, int want)
{
    if (got != want)
        fail("%s returned %d (%s), expected %d; last error: %s", what, got,
             sbprt_status_string(got), want, sbprt_ctx_last_error(G));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* ---- device buffers --------------------------------------------------------------------- */

static void *dnew(size_t bytes)
{
    void *p = NULL;
    int st = sbprt_arena_alloc(G, &p, bytes);
    if (st != SBPRT_OK) {
        fprintf(stderr, "test: device allocation of %zu bytes failed: %s\n", bytes,
                sbprt_ctx_last_error(G));
        exit(1);
    }
    return p;
}

static void upload(void *d, const void *h, size_t bytes)
{
    int st = sbprt_memcpy(G, d, h, bytes, SBPRT_COPY_HOST_TO_DEVICE);
    if (st != SBPRT_OK) {
        fprintf(stderr, "test: upload failed: %s\n", sbprt_ctx_last_error(G));
        exit(1);
    }
}

static void download(void *h, const void *d, size_t bytes)
{
    int st = sbprt_memcpy(G, h, d, bytes, SBPRT_COPY_DEVICE_TO_HOST);
    if (st != SBPRT_OK) {
        fprintf(stderr, "test: download failed: %s\n", sbprt_ctx_last_error(G));
        exit(1);
    }
}

/* ---- per-kernel statistics -------------------------------------------------------------- */

typedef struct {
    char name[40];
    int cases;
    double max_err;
    double tol;
    double ms;    /* time of the case with the most work (largest output) */
    size_t ms_n;  /* its output size */
    int nondet;   /* cases whose two runs differed */
    int fails;
} kstat;

static kstat stats[128];
static int nstats;

static kstat *kstat_get(const char *name, double tol)
{
    for (int i = 0; i < nstats; i++)
        if (strcmp(stats[i].name, name) == 0)
            return &stats[i];
    if (nstats == (int)(sizeof stats / sizeof stats[0])) {
        fprintf(stderr, "test: too many kernels\n");
        exit(1);
    }
    kstat *s = &stats[nstats++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->tol = tol;
    s->ms = -1;
    return s;
}

/* ---- a case ----------------------------------------------------------------------------- */

typedef struct {
    const char *what;
    float *h0;   /* initial contents */
    float *ref;  /* the CPU twin's result (starts as h0) */
    float *d;    /* device buffer */
    float *got;  /* the CUDA result, first run */
    float *got2; /* second run */
    size_t n;
    int acc; /* accumulated into: error relative to the increment */
    int bf;  /* bf16 elements (the arrays above then hold sbprt_bf16) */
} obuf;

typedef struct {
    kstat *st;
    char label[160];
    obuf o[8];
    int no;
    void *din[16]; /* device inputs, freed at the end */
    int ndin;
    int status; /* first non-OK status of the CUDA calls */
} kcase;

static void kc_begin(kcase *k, const char *kernel, double tol, const char *fmt, ...)
{
    memset(k, 0, sizeof *k);
    k->st = kstat_get(kernel, tol);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->label, sizeof k->label, fmt, ap);
    va_end(ap);
}

/* A device copy of host input h (freed with the case). */
static void *kc_in(kcase *k, const void *h, size_t bytes)
{
    void *d = dnew(bytes);
    upload(d, h, bytes);
    k->din[k->ndin++] = d;
    return d;
}
#define KC_IN_F(k, h, n) ((float *)kc_in((k), (h), (size_t)(n) * sizeof(float)))
#define KC_IN_I(k, h, n) ((int32_t *)kc_in((k), (h), (size_t)(n) * sizeof(int32_t)))
#define KC_IN_B(k, h, n) ((sbprt_bf16 *)kc_in((k), (h), (size_t)(n) * sizeof(sbprt_bf16)))

/* An output (or in-place) buffer starting as `init` (n elements of float, or of bf16 when
 * bf; copied). The host copies are float-sized either way (room to spare for bf16). */
static obuf *kc_out_elems(kcase *k, const char *what, const void *init, size_t n, int acc,
                          int bf)
{
    const size_t esize = bf ? sizeof(sbprt_bf16) : sizeof(float);
    obuf *o = &k->o[k->no++];
    o->what = what;
    o->n = n;
    o->acc = acc;
    o->bf = bf;
    o->h0 = xmalloc_floats(n);
    o->ref = xmalloc_floats(n);
    memcpy(o->h0, init, n * esize);
    memcpy(o->ref, init, n * esize);
    o->got = xmalloc_floats(n);
    o->got2 = xmalloc_floats(n);
    o->d = dnew(n * esize);
    return o;
}

static obuf *kc_out(kcase *k, const char *what, const float *init, size_t n, int acc)
{
    return kc_out_elems(k, what, init, n, acc, 0);
}

static obuf *kc_out_rand(kcase *k, const char *what, size_t n, int acc)
{
    return kc_out(k, what, hrand(n, -1, 1), n, acc);
}

static size_t ob_bytes(const obuf *o) { return o->n * (o->bf ? sizeof(sbprt_bf16) : sizeof(float)); }

static obuf *kc_out_bf(kcase *k, const char *what, const sbprt_bf16 *init, size_t n, int acc)
{
    return kc_out_elems(k, what, init, n, acc, 1);
}

static obuf *kc_out_bf_rand(kcase *k, const char *what, size_t n, int acc)
{
    return kc_out_bf(k, what, hrand_bf(n, -1, 1), n, acc);
}
#define BREF(o) ((sbprt_bf16 *)(o)->ref)
#define BDEV(o) ((sbprt_bf16 *)(o)->d)

static void kc_reset(kcase *k)
{
    for (int i = 0; i < k->no; i++)
        upload(k->o[i].d, k->o[i].h0, ob_bytes(&k->o[i]));
}

static void kc_status(kcase *k, int st)
{
    if (st != SBPRT_OK && k->status == SBPRT_OK)
        k->status = st;
}

static void kc_sync(kcase *k) { kc_status(k, sbprt_sync(G)); }

static void kc_fetch(kcase *k, int second)
{
    for (int i = 0; i < k->no; i++)
        download(second ? k->o[i].got2 : k->o[i].got, k->o[i].d, ob_bytes(&k->o[i]));
}

static double nerr(const float *got, const float *ref, const float *base, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double dl = (double)got[i] - ref[i];
        double r = base ? (double)ref[i] - base[i] : ref[i];
        num += dl * dl;
        den += r * r;
    }
    if (den == 0)
        return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

static void kc_finish(kcase *k, double ms)
{
    kstat *s = k->st;
    s->cases++;
    int ok = 1;
    if (k->status != SBPRT_OK) {
        fail("%s [%s]: status %s (%s)", s->name, k->label, sbprt_status_string(k->status),
             sbprt_ctx_last_error(G));
        ok = 0;
    }
    size_t total = 0;
    for (int i = 0; i < k->no; i++) {
        obuf *o = &k->o[i];
        total += o->n;
        double e;
        if (o->bf) { /* compared as the fp32 values the bf16 elements stand for */
            float *g = xmalloc_floats(o->n), *r = xmalloc_floats(o->n), *b = xmalloc_floats(o->n);
            bf_to_floats(g, (const sbprt_bf16 *)o->got, o->n);
            bf_to_floats(r, (const sbprt_bf16 *)o->ref, o->n);
            bf_to_floats(b, (const sbprt_bf16 *)o->h0, o->n);
            e = nerr(g, r, o->acc ? b : NULL, o->n);
            free(g);
            free(r);
            free(b);
        } else {
            e = nerr(o->got, o->ref, o->acc ? o->h0 : NULL, o->n);
        }
        if (isnan(e) || (!isnan(s->max_err) && e > s->max_err))
            s->max_err = e; /* NaN sticks */
        if (!(e <= s->tol)) {
            fail("%s [%s] %s: error %.3g > %.3g", s->name, k->label, o->what, e, s->tol);
            ok = 0;
        }
        if (memcmp(o->got, o->got2, ob_bytes(o)) != 0) {
            fail("%s [%s] %s: two runs differ (not deterministic)", s->name, k->label, o->what);
            s->nondet++;
            ok = 0;
        }
        sbprt_arena_free(G, o->d);
        free(o->h0);
        free(o->ref);
        free(o->got);
        free(o->got2);
    }
    for (int i = 0; i < k->ndin; i++)
        sbprt_arena_free(G, k->din[i]);
    if (reps > 0 && total >= s->ms_n) {
        s->ms = ms;
        s->ms_n = total;
    }
    if (!ok)
        s->fails++;
}

/* Runs `call` (a CUDA backend call on the case's device buffers) twice from the initial
 * state, fetching both results, then `reps` more times for the timing, and compares. */
#define KC_RUN(k, call)                                                                        \
    do {                                                                                       \
        kc_reset(&(k));                                                                        \
        kc_status(&(k), (call));                                                               \
        kc_sync(&(k));                                                                         \
        kc_fetch(&(k), 0);                                                                     \
        kc_reset(&(k));                                                                        \
        kc_status(&(k), (call));                                                               \
        kc_sync(&(k));                                                                         \
        kc_fetch(&(k), 1);                                                                     \
        double t0_ = now_ms();                                                                 \
        for (int r_ = 0; r_ < reps; r_++)                                                      \
            (void)(call);                                                                      \
        kc_sync(&(k));                                                                         \
        kc_finish(&(k), reps > 0 ? (now_ms() - t0_) / reps : 0);                               \
    } while (0)

/* Runs the CPU twin; a failure there is a test bug. */
#define REF(call)                                                                              \
    do {                                                                                       \
        int st_ = (call);                                                                      \
        if (st_ != SBPRT_OK) {                                                                 \
            fprintf(stderr, "test: CPU twin failed: %s -> %s\n", #call,                        \
                    sbprt_status_string(st_));                                                 \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* ---- GEMM --------------------------------------------------------------------------------- */

static void t_gemm_one(int m, int n, int k, int ta, int tb, float alpha, float beta, int tf32)
{
    kcase K;
    kc_begin(&K, tf32 ? "gemm (tf32)" : "gemm", tf32 ? TOL_TF32 : TOL_FP32,
             "m=%d n=%d k=%d ta=%d tb=%d beta=%g", m, n, k, ta, tb, beta);
    const float *a = hrand((size_t)m * k + 1, -1, 1), *b = hrand((size_t)k * n + 1, -1, 1);
    float *da = KC_IN_F(&K, a, (size_t)m * k + 1), *db = KC_IN_F(&K, b, (size_t)k * n + 1);
    obuf *c = kc_out_rand(&K, "c", (size_t)m * n, 0);
    REF(cpuref_sbprt_gemm(C, c->ref, a, b, ta, tb, m, n, k, alpha, beta));
    check_status("sbprt_ctx_set_tf32", sbprt_ctx_set_tf32(G, tf32), SBPRT_OK);
    KC_RUN(K, sbprt_gemm(G, c->d, da, db, ta, tb, m, n, k, alpha, beta));
    check_status("sbprt_ctx_set_tf32", sbprt_ctx_set_tf32(G, 0), SBPRT_OK);
}

static void t_gemm_batched(int m, int n, int k, int ta, int tb, int batch, int bcast_b)
{
    kcase K;
    kc_begin(&K, "gemm_strided_batched", TOL_FP32, "m=%d n=%d k=%d ta=%d tb=%d batch=%d%s", m,
             n, k, ta, tb, batch, bcast_b ? " b broadcast" : "");
    /* padded leading dimensions and gaps between the batch items */
    const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    const int lda = a_cols + 3, ldb = b_cols + 5, ldc = n + 2;
    const int64_t sa = (int64_t)a_rows * lda + 7, sb = bcast_b ? 0 : (int64_t)b_rows * ldb + 1;
    const int64_t sc = (int64_t)m * ldc + 4;
    const size_t na = (size_t)sa * batch, nb = bcast_b ? (size_t)b_rows * ldb : (size_t)sb * batch;
    const size_t nc = (size_t)sc * batch;
    const float *a = hrand(na, -1, 1), *b = hrand(nb, -1, 1);
    float *da = KC_IN_F(&K, a, na), *db = KC_IN_F(&K, b, nb);
    obuf *c = kc_out_rand(&K, "c", nc, 0);
    REF(cpuref_sbprt_gemm_strided_batched(C, c->ref, a, b, ta, tb, m, n, k, 0.5f, 1.0f, lda, sa,
                                          ldb, sb, ldc, sc, batch));
    KC_RUN(K, sbprt_gemm_strided_batched(G, c->d, da, db, ta, tb, m, n, k, 0.5f, 1.0f, lda, sa,
                                         ldb, sb, ldc, sc, batch));
}

static void t_gemm(void)
{
    const int m = quick ? 33 : 384, n = quick ? 17 : 512, k = quick ? 29 : 640;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            t_gemm_one(m, n, k, ta, tb, 0.75f, 0.5f, 0);
    t_gemm_one(m, n, k, 0, 1, 1.0f, 0.0f, 0);
    t_gemm_one(quick ? 5 : 64, quick ? 6 : 48, 0, 0, 0, 1.0f, 0.5f, 0); /* k = 0: c = beta c */
    t_gemm_one(quick ? 5 : 64, quick ? 6 : 48, 0, 0, 0, 1.0f, 0.0f, 0); /* ... and c = 0 */
    if (!quick)
        t_gemm_one(1024, 1024, 1024, 0, 1, 1.0f, 0.0f, 0);
    t_gemm_one(quick ? 40 : 512, quick ? 24 : 512, quick ? 64 : 1024, 0, 1, 1.0f, 0.0f, 1);
    t_gemm_batched(quick ? 9 : 128, quick ? 7 : 64, quick ? 11 : 96, 0, 0, quick ? 3 : 8, 0);
    t_gemm_batched(quick ? 9 : 128, quick ? 7 : 64, quick ? 11 : 96, 1, 1, quick ? 3 : 8, 0);
    t_gemm_batched(quick ? 9 : 64, quick ? 7 : 128, quick ? 11 : 64, 0, 1, quick ? 3 : 12, 1);
    hfree_all();
}

static void t_bias(void)
{
    const int shapes[][2] = {{quick ? 37 : 4096, quick ? 70 : 768}, {3, 5},
                             {quick ? 200 : 5000, quick ? 33 : 300}};
    for (int s = 0; s < 3; s++) {
        const int n = shapes[s][0], c = shapes[s][1];
        const float *bias = hrand(c, -1, 1), *dy = hrand((size_t)n * c, -1, 1);
        kcase K;
        kc_begin(&K, "bias_add", TOL_FP32, "n=%d c=%d", n, c);
        float *dbias_in = KC_IN_F(&K, bias, c);
        obuf *y = kc_out_rand(&K, "y", (size_t)n * c, 1);
        REF(cpuref_sbprt_bias_add(C, y->ref, bias, n, c));
        KC_RUN(K, sbprt_bias_add(G, y->d, dbias_in, n, c));

        kc_begin(&K, "bias_backward", TOL_FP32, "n=%d c=%d", n, c);
        float *ddy = KC_IN_F(&K, dy, (size_t)n * c);
        obuf *db = kc_out_rand(&K, "dbias", c, 1);
        REF(cpuref_sbprt_bias_backward(C, db->ref, dy, n, c));
        KC_RUN(K, sbprt_bias_backward(G, db->d, ddy, n, c));
    }
    hfree_all();
}

/* ---- elementwise -------------------------------------------------------------------------- */

typedef int (*ew_fwd_fn)(sbprt_ctx *, float *, const float *, size_t);
typedef int (*ew_bwd_fn)(sbprt_ctx *, float *, const float *, const float *, size_t);

/* saved_out: the backward takes the forward's output (tanh), not its input: it gets the CPU
 * twin's forward of x, so its operand is in the range the kernel will really see. */
static void t_activation(const char *fname, const char *bname, ew_fwd_fn gf, ew_fwd_fn cf,
                         ew_bwd_fn gb, ew_bwd_fn cb, size_t n, int saved_out)
{
    const float *x = hrand(n, -4, 4), *dout = hrand(n, -1, 1);
    kcase K;
    kc_begin(&K, fname, TOL_FP32, "n=%zu", n);
    float *dx_in = KC_IN_F(&K, x, n);
    obuf *out = kc_out_rand(&K, "out", n, 0);
    REF(cf(C, out->ref, x, n));
    KC_RUN(K, gf(G, out->d, dx_in, n));

    kc_begin(&K, fname, TOL_FP32, "n=%zu in place", n);
    obuf *io = kc_out(&K, "out", x, n, 0);
    REF(cf(C, io->ref, io->ref, n));
    KC_RUN(K, gf(G, io->d, io->d, n));

    const float *saved = x;
    if (saved_out) {
        float *y = hrand(n, -1, 1);
        REF(cf(C, y, x, n));
        saved = y;
    }
    kc_begin(&K, bname, TOL_FP32, "n=%zu%s", n, saved_out ? " (y saved)" : "");
    float *dxx = KC_IN_F(&K, saved, n), *ddo = KC_IN_F(&K, dout, n);
    obuf *dx = kc_out_rand(&K, "dx", n, 1);
    REF(cb(C, dx->ref, dout, saved, n));
    KC_RUN(K, gb(G, dx->d, ddo, dxx, n));
}

static void t_elementwise(void)
{
    const size_t n = quick ? 9001 : ((size_t)1 << 22) + 3; /* > 8192: several sum_squares blocks */
    const float *a = hrand(n, -1, 1), *b = hrand(n, -1, 1);
    kcase K;

    kc_begin(&K, "add", TOL_FP32, "n=%zu", n);
    float *da = KC_IN_F(&K, a, n), *db = KC_IN_F(&K, b, n);
    obuf *out = kc_out_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_add(C, out->ref, a, b, n));
    KC_RUN(K, sbprt_add(G, out->d, da, db, n));

    kc_begin(&K, "add", TOL_FP32, "n=%zu out = a", n);
    db = KC_IN_F(&K, b, n);
    out = kc_out(&K, "out", a, n, 0);
    REF(cpuref_sbprt_add(C, out->ref, out->ref, b, n));
    KC_RUN(K, sbprt_add(G, out->d, out->d, db, n));

    kc_begin(&K, "accumulate", TOL_FP32, "n=%zu", n);
    da = KC_IN_F(&K, a, n);
    out = kc_out_rand(&K, "y", n, 1);
    REF(cpuref_sbprt_accumulate(C, out->ref, a, n));
    KC_RUN(K, sbprt_accumulate(G, out->d, da, n));

    /* by a scalar: out = / += x * c or x / c, also in place (c's reciprocal is not exact) */
    typedef int (*sfn)(sbprt_ctx *, float *, const float *, size_t, float);
    const struct {
        const char *name;
        sfn g, c;
        int acc;
        float k;
    } scal[] = {
        {"scale", sbprt_scale, cpuref_sbprt_scale, 0, -0.37f},
        {"scale_accumulate", sbprt_scale_accumulate, cpuref_sbprt_scale_accumulate, 1, -0.37f},
        {"div_scalar", sbprt_div_scalar, cpuref_sbprt_div_scalar, 0, 0.7f},
        {"div_scalar_accumulate", sbprt_div_scalar_accumulate,
         cpuref_sbprt_div_scalar_accumulate, 1, 0.7f},
    };
    for (int i = 0; i < 4; i++) {
        kc_begin(&K, scal[i].name, TOL_FP32, "n=%zu c=%g", n, (double)scal[i].k);
        da = KC_IN_F(&K, a, n);
        out = kc_out_rand(&K, "out", n, scal[i].acc);
        REF(scal[i].c(C, out->ref, a, n, scal[i].k));
        KC_RUN(K, scal[i].g(G, out->d, da, n, scal[i].k));
        if (scal[i].acc)
            continue;
        kc_begin(&K, scal[i].name, TOL_FP32, "n=%zu c=%g in place", n, (double)scal[i].k);
        out = kc_out(&K, "out", a, n, 0);
        REF(scal[i].c(C, out->ref, out->ref, n, scal[i].k));
        KC_RUN(K, scal[i].g(G, out->d, out->d, n, scal[i].k));
    }

    const size_t sq_n[] = {n, 1, 8192, 8193};
    for (int i = 0; i < 4; i++) {
        kc_begin(&K, "sum_squares", TOL_FP32, "n=%zu", sq_n[i]);
        da = KC_IN_F(&K, a, sq_n[i]);
        float init = 0.25f;
        out = kc_out(&K, "out", &init, 1, 1);
        REF(cpuref_sbprt_sum_squares(C, out->ref, a, sq_n[i]));
        KC_RUN(K, sbprt_sum_squares(G, out->d, da, sq_n[i]));
    }
    /* sbprt_grad_sq_norm writes a host double: compared directly, 1e-12 relative
     * (the same blocks as the CPU twin, summed in a tree instead of in order) */
    for (int i = 0; i < 4; i++) {
        kc_begin(&K, "grad_sq_norm", TOL_FP32, "n=%zu", sq_n[i]);
        da = KC_IN_F(&K, a, sq_n[i]);
        double got = 0.5, ref = 0.5;
        int st = cpuref_sbprt_grad_sq_norm(C, &ref, a, sq_n[i]);
        if (!st)
            st = sbprt_grad_sq_norm(G, &got, da, sq_n[i]);
        if (st || !(fabs(got - ref) <= 1e-12 * fabs(ref)))
            fail("grad_sq_norm n=%zu: status %s, %.17g against the CPU twin's %.17g", sq_n[i],
                 sbprt_status_string(st), got, ref);
        kc_finish(&K, 0); /* no device outputs: frees the input, counts the case */
    }

    t_activation("gelu_tanh_forward", "gelu_tanh_backward", sbprt_gelu_tanh_forward,
                 cpuref_sbprt_gelu_tanh_forward, sbprt_gelu_tanh_backward,
                 cpuref_sbprt_gelu_tanh_backward, n, 0);
    t_activation("gelu_erf_forward", "gelu_erf_backward", sbprt_gelu_erf_forward,
                 cpuref_sbprt_gelu_erf_forward, sbprt_gelu_erf_backward,
                 cpuref_sbprt_gelu_erf_backward, n, 0);
    t_activation("silu_forward", "silu_backward", sbprt_silu_forward, cpuref_sbprt_silu_forward,
                 sbprt_silu_backward, cpuref_sbprt_silu_backward, n, 0);
    t_activation("relu_forward", "relu_backward", sbprt_relu_forward, cpuref_sbprt_relu_forward,
                 sbprt_relu_backward, cpuref_sbprt_relu_backward, n, 0);
    t_activation("relu_forward", "relu_backward", sbprt_relu_forward, cpuref_sbprt_relu_forward,
                 sbprt_relu_backward, cpuref_sbprt_relu_backward, n, 1);
    t_activation("tanh_forward", "tanh_backward", sbprt_tanh_forward, cpuref_sbprt_tanh_forward,
                 sbprt_tanh_backward, cpuref_sbprt_tanh_backward, n, 1);
    t_activation("sigmoid_forward", "sigmoid_backward", sbprt_sigmoid_forward,
                 cpuref_sbprt_sigmoid_forward, sbprt_sigmoid_backward,
                 cpuref_sbprt_sigmoid_backward, n, 1);
    /* the stable form far out: e^-|x| neither overflows nor loses the tiny values of x < -88 */
    const float *wide = hrand(n, -120, 120);
    kc_begin(&K, "sigmoid_forward", TOL_FP32, "n=%zu |x| <= 120", n);
    da = KC_IN_F(&K, wide, n);
    out = kc_out_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_sigmoid_forward(C, out->ref, wide, n));
    KC_RUN(K, sbprt_sigmoid_forward(G, out->d, da, n));

    const float *gate = hrand(n, -4, 4), *up = hrand(n, -2, 2), *dout = hrand(n, -1, 1);
    kc_begin(&K, "swiglu_forward", TOL_FP32, "n=%zu", n);
    float *dg = KC_IN_F(&K, gate, n), *du = KC_IN_F(&K, up, n);
    out = kc_out_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_swiglu_forward(C, out->ref, gate, up, n));
    KC_RUN(K, sbprt_swiglu_forward(G, out->d, dg, du, n));

    kc_begin(&K, "swiglu_forward", TOL_FP32, "n=%zu out = up", n);
    dg = KC_IN_F(&K, gate, n);
    out = kc_out(&K, "out", up, n, 0);
    REF(cpuref_sbprt_swiglu_forward(C, out->ref, gate, out->ref, n));
    KC_RUN(K, sbprt_swiglu_forward(G, out->d, dg, out->d, n));

    for (int which = 0; which < 3; which++) { /* both, dgate only, dup only */
        kc_begin(&K, "swiglu_backward", TOL_FP32, "n=%zu outputs=%s", n,
                 which == 0 ? "both" : which == 1 ? "dgate" : "dup");
        dg = KC_IN_F(&K, gate, n);
        du = KC_IN_F(&K, up, n);
        float *ddo = KC_IN_F(&K, dout, n);
        obuf *dgate = which != 2 ? kc_out_rand(&K, "dgate", n, 1) : NULL;
        obuf *dup = which != 1 ? kc_out_rand(&K, "dup", n, 1) : NULL;
        REF(cpuref_sbprt_swiglu_backward(C, dgate ? dgate->ref : NULL, dup ? dup->ref : NULL,
                                         dout, gate, up, n));
        KC_RUN(K, sbprt_swiglu_backward(G, dgate ? dgate->d : NULL, dup ? dup->d : NULL, ddo, dg,
                                        du, n));
    }
    hfree_all();
}

/* ---- embedding ---------------------------------------------------------------------------- */

static void t_embedding(void)
{
    const int n = quick ? 61 : 4096, v = quick ? 30 : 50257, c = quick ? 70 : 768;
    int32_t *ids = hnew((size_t)n * sizeof(int32_t));
    for (int r = 0; r < n; r++) /* a third of the rows share 16 ids: many repeats */
        ids[r] = r % 3 == 0 ? rng_int(16) : rng_int(v);
    const float *table = hrand((size_t)v * c, -1, 1), *dout = hrand((size_t)n * c, -1, 1);
    kcase K;

    kc_begin(&K, "embedding_forward", TOL_FP32, "n=%d v=%d c=%d", n, v, c);
    float *dt = KC_IN_F(&K, table, (size_t)v * c);
    int32_t *di = KC_IN_I(&K, ids, n);
    obuf *out = kc_out_rand(&K, "out", (size_t)n * c, 0);
    REF(cpuref_sbprt_embedding_forward(C, out->ref, table, ids, n, v, c));
    KC_RUN(K, sbprt_embedding_forward(G, out->d, dt, di, n, v, c));

    const int bn[] = {n, 1, 2};
    for (int i = 0; i < 3; i++) {
        kc_begin(&K, "embedding_backward", TOL_FP32, "n=%d v=%d c=%d", bn[i], v, c);
        float *ddo = KC_IN_F(&K, dout, (size_t)bn[i] * c);
        di = KC_IN_I(&K, ids, bn[i]);
        obuf *dtab = kc_out_rand(&K, "dtable", (size_t)v * c, 1);
        REF(cpuref_sbprt_embedding_backward(C, dtab->ref, dout, ids, bn[i], v, c));
        KC_RUN(K, sbprt_embedding_backward(G, dtab->d, ddo, di, bn[i], v, c));
    }
    hfree_all();
}

/* ---- normalisation ------------------------------------------------------------------------ */

static void t_norm_shape(int n, int c)
{
    const float eps = 1e-5f;
    const float *x = hrand((size_t)n * c, -2, 3), *gamma = hrand(c, 0.5f, 1.5f);
    const float *beta = hrand(c, -1, 1), *dout = hrand((size_t)n * c, -1, 1);
    float *mean = hnew((size_t)n * sizeof(float)), *rstd = hnew((size_t)n * sizeof(float));
    float *tmp = hnew((size_t)n * c * sizeof(float));
    REF(cpuref_sbprt_layernorm_forward(C, tmp, mean, rstd, x, gamma, beta, n, c, eps));
    kcase K;

    for (int variant = 0; variant < 3; variant++) { /* plain; no beta, no stats; in place */
        kc_begin(&K, "layernorm_forward", TOL_FP32, "n=%d c=%d %s", n, c,
                 variant == 0 ? "" : variant == 1 ? "no beta/stats" : "in place");
        float *dg = KC_IN_F(&K, gamma, c), *db = KC_IN_F(&K, beta, c);
        if (variant < 2) {
            float *dx = KC_IN_F(&K, x, (size_t)n * c);
            obuf *out = kc_out_rand(&K, "out", (size_t)n * c, 0);
            obuf *mo = variant == 0 ? kc_out_rand(&K, "mean", n, 0) : NULL;
            obuf *ro = variant == 0 ? kc_out_rand(&K, "rstd", n, 0) : NULL;
            REF(cpuref_sbprt_layernorm_forward(C, out->ref, mo ? mo->ref : NULL,
                                               ro ? ro->ref : NULL, x, gamma,
                                               variant == 0 ? beta : NULL, n, c, eps));
            KC_RUN(K, sbprt_layernorm_forward(G, out->d, mo ? mo->d : NULL, ro ? ro->d : NULL, dx,
                                              dg, variant == 0 ? db : NULL, n, c, eps));
        } else {
            obuf *io = kc_out(&K, "out", x, (size_t)n * c, 0);
            REF(cpuref_sbprt_layernorm_forward(C, io->ref, NULL, NULL, io->ref, gamma, beta, n, c,
                                               eps));
            KC_RUN(K, sbprt_layernorm_forward(G, io->d, NULL, NULL, io->d, dg, db, n, c, eps));
        }
    }
    for (int variant = 0; variant < 3; variant++) { /* all grads; dx only; params only */
        kc_begin(&K, "layernorm_backward", TOL_FP32, "n=%d c=%d %s", n, c,
                 variant == 0 ? "all" : variant == 1 ? "dx" : "dgamma,dbeta");
        float *dx_in = KC_IN_F(&K, x, (size_t)n * c), *dg = KC_IN_F(&K, gamma, c);
        float *dm = KC_IN_F(&K, mean, n), *dr = KC_IN_F(&K, rstd, n);
        float *ddo = KC_IN_F(&K, dout, (size_t)n * c);
        obuf *dx = variant != 2 ? kc_out_rand(&K, "dx", (size_t)n * c, 1) : NULL;
        obuf *dgam = variant != 1 ? kc_out_rand(&K, "dgamma", c, 1) : NULL;
        obuf *dbet = variant != 1 ? kc_out_rand(&K, "dbeta", c, 1) : NULL;
        REF(cpuref_sbprt_layernorm_backward(C, dx ? dx->ref : NULL, dgam ? dgam->ref : NULL,
                                            dbet ? dbet->ref : NULL, dout, x, gamma, mean, rstd,
                                            n, c));
        KC_RUN(K, sbprt_layernorm_backward(G, dx ? dx->d : NULL, dgam ? dgam->d : NULL,
                                           dbet ? dbet->d : NULL, ddo, dx_in, dg, dm, dr, n, c));
    }

    REF(cpuref_sbprt_rmsnorm_forward(C, tmp, rstd, x, gamma, n, c, eps));
    for (int variant = 0; variant < 2; variant++) {
        kc_begin(&K, "rmsnorm_forward", TOL_FP32, "n=%d c=%d %s", n, c,
                 variant == 0 ? "" : "in place, no rstd");
        float *dg = KC_IN_F(&K, gamma, c);
        if (variant == 0) {
            float *dx = KC_IN_F(&K, x, (size_t)n * c);
            obuf *out = kc_out_rand(&K, "out", (size_t)n * c, 0);
            obuf *ro = kc_out_rand(&K, "rstd", n, 0);
            REF(cpuref_sbprt_rmsnorm_forward(C, out->ref, ro->ref, x, gamma, n, c, eps));
            KC_RUN(K, sbprt_rmsnorm_forward(G, out->d, ro->d, dx, dg, n, c, eps));
        } else {
            obuf *io = kc_out(&K, "out", x, (size_t)n * c, 0);
            REF(cpuref_sbprt_rmsnorm_forward(C, io->ref, NULL, io->ref, gamma, n, c, eps));
            KC_RUN(K, sbprt_rmsnorm_forward(G, io->d, NULL, io->d, dg, n, c, eps));
        }
    }
    for (int variant = 0; variant < 3; variant++) {
        kc_begin(&K, "rmsnorm_backward", TOL_FP32, "n=%d c=%d %s", n, c,
                 variant == 0 ? "all" : variant == 1 ? "dx" : "dgamma");
        float *dx_in = KC_IN_F(&K, x, (size_t)n * c), *dg = KC_IN_F(&K, gamma, c);
        float *dr = KC_IN_F(&K, rstd, n), *ddo = KC_IN_F(&K, dout, (size_t)n * c);
        obuf *dx = variant != 2 ? kc_out_rand(&K, "dx", (size_t)n * c, 1) : NULL;
        obuf *dgam = variant != 1 ? kc_out_rand(&K, "dgamma", c, 1) : NULL;
        REF(cpuref_sbprt_rmsnorm_backward(C, dx ? dx->ref : NULL, dgam ? dgam->ref : NULL, dout,
                                          x, gamma, rstd, n, c));
        KC_RUN(K, sbprt_rmsnorm_backward(G, dx ? dx->d : NULL, dgam ? dgam->d : NULL, ddo, dx_in,
                                         dg, dr, n, c));
    }
}

static void t_norm(void)
{
    if (quick) {
        t_norm_shape(6, 300);
        t_norm_shape(70, 33);
    } else {
        t_norm_shape(4096, 1024);
        hfree_all();
        t_norm_shape(1000, 77);
        t_norm_shape(3, 4099);
    }
    hfree_all();
}

/* ---- RoPE --------------------------------------------------------------------------------- */

static void t_rope_shape(int rows, int heads, int hd, int rot, int max_pos)
{
    const size_t n = (size_t)rows * heads * hd;
    int32_t *pos = hnew((size_t)rows * sizeof(int32_t));
    for (int r = 0; r < rows; r++)
        pos[r] = rng_int(max_pos);
    const float *cs = hrand((size_t)max_pos * rot + 1, -1, 1);
    const float *sn = hrand((size_t)max_pos * rot + 1, -1, 1);
    const float *x = hrand(n, -1, 1), *dout = hrand(n, -1, 1);
    kcase K;
    for (int inplace = 0; inplace < 2; inplace++) {
        kc_begin(&K, "rope_forward", TOL_FP32, "rows=%d heads=%d hd=%d rot=%d%s", rows, heads, hd,
                 rot, inplace ? " in place" : "");
        int32_t *dp = KC_IN_I(&K, pos, rows);
        float *dc = KC_IN_F(&K, cs, (size_t)max_pos * rot + 1);
        float *ds = KC_IN_F(&K, sn, (size_t)max_pos * rot + 1);
        if (!inplace) {
            float *dx = KC_IN_F(&K, x, n);
            obuf *out = kc_out_rand(&K, "out", n, 0);
            REF(cpuref_sbprt_rope_forward(C, out->ref, x, pos, cs, sn, rows, heads, hd, rot,
                                          max_pos));
            KC_RUN(K, sbprt_rope_forward(G, out->d, dx, dp, dc, ds, rows, heads, hd, rot, max_pos));
        } else {
            obuf *io = kc_out(&K, "out", x, n, 0);
            REF(cpuref_sbprt_rope_forward(C, io->ref, io->ref, pos, cs, sn, rows, heads, hd, rot,
                                          max_pos));
            KC_RUN(K, sbprt_rope_forward(G, io->d, io->d, dp, dc, ds, rows, heads, hd, rot,
                                         max_pos));
        }
    }
    kc_begin(&K, "rope_backward", TOL_FP32, "rows=%d heads=%d hd=%d rot=%d", rows, heads, hd, rot);
    int32_t *dp = KC_IN_I(&K, pos, rows);
    float *dc = KC_IN_F(&K, cs, (size_t)max_pos * rot + 1);
    float *ds = KC_IN_F(&K, sn, (size_t)max_pos * rot + 1);
    float *ddo = KC_IN_F(&K, dout, n);
    obuf *dx = kc_out_rand(&K, "dx", n, 1);
    REF(cpuref_sbprt_rope_backward(C, dx->ref, dout, pos, cs, sn, rows, heads, hd, rot, max_pos));
    KC_RUN(K, sbprt_rope_backward(G, dx->d, ddo, dp, dc, ds, rows, heads, hd, rot, max_pos));
}

static void t_rope(void)
{
    if (quick) {
        t_rope_shape(9, 3, 16, 16, 40);
        t_rope_shape(5, 2, 12, 8, 7);
    } else {
        t_rope_shape(4096, 16, 128, 128, 8192);
        t_rope_shape(1000, 8, 80, 32, 2048);
    }
    hfree_all();
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct {
    int b, t, tk, hq, hkv, d, q_start;
    int window;    /* sliding window (the _ex entry points); 0: plain causal */
    float softcap; /* logit soft-cap; 0: none */
} att_shape;

/* The keys a chunk must never read: positions before its first row's window or at or after
 * q_start + t. */
static int att_unread(att_shape s, int j)
{
    const int klo = s.window > 0 && s.q_start - s.window + 1 > 0 ? s.q_start - s.window + 1 : 0;
    return j < klo || j >= s.q_start + s.t;
}

/* The shape for a case's label, the variant only when there is one. */
static void att_label(char *buf, size_t n, att_shape s)
{
    int len = snprintf(buf, n, "b=%d t=%d tk=%d hq=%d hkv=%d d=%d q_start=%d", s.b, s.t, s.tk, s.hq,
                       s.hkv, s.d, s.q_start);
    if (s.window > 0 && len > 0 && (size_t)len < n)
        len += snprintf(buf + len, n - len, " window=%d", s.window);
    if (s.softcap > 0 && len > 0 && (size_t)len < n)
        snprintf(buf + len, n - len, " softcap=%g", (double)s.softcap);
}

static void t_attention_shape(att_shape s)
{
    const size_t nq = (size_t)s.b * s.t * s.hq * s.d, nkv = (size_t)s.b * s.tk * s.hkv * s.d;
    const size_t nl = (size_t)s.b * s.hq * s.t;
    const float scale = 1.0f / sqrtf((float)s.d);
    float *q = hrand(nq, -1, 1), *k = hrand(nkv, -1, 1), *v = hrand(nkv, -1, 1);
    /* keys the chunk must never read hold NaN */
    for (int bi = 0; bi < s.b; bi++)
        for (int j = 0; j < s.tk; j++)
            for (size_t e = 0; e < (size_t)s.hkv * s.d && att_unread(s, j); e++) {
                k[((size_t)bi * s.tk + j) * s.hkv * s.d + e] = NAN;
                v[((size_t)bi * s.tk + j) * s.hkv * s.d + e] = NAN;
            }
    const float *dout = hrand(nq, -1, 1);
    float *out = hnew(nq * sizeof(float)), *lse = hnew(nl * sizeof(float));
    REF(cpuref_sbprt_attention_forward_ex(C, out, lse, q, k, v, s.b, s.t, s.tk, s.hq, s.hkv, s.d,
                                          s.q_start, scale, s.window, s.softcap));
    char label[160];
    att_label(label, sizeof label, s);
    kcase K;

    kc_begin(&K, "attention_forward", TOL_FP32, "%s", label);
    float *dq = KC_IN_F(&K, q, nq), *dk = KC_IN_F(&K, k, nkv), *dv = KC_IN_F(&K, v, nkv);
    obuf *o = kc_out_rand(&K, "out", nq, 0), *l = kc_out_rand(&K, "lse", nl, 0);
    REF(cpuref_sbprt_attention_forward_ex(C, o->ref, l->ref, q, k, v, s.b, s.t, s.tk, s.hq, s.hkv,
                                          s.d, s.q_start, scale, s.window, s.softcap));
    KC_RUN(K, sbprt_attention_forward_ex(G, o->d, l->d, dq, dk, dv, s.b, s.t, s.tk, s.hq, s.hkv,
                                         s.d, s.q_start, scale, s.window, s.softcap));

    /* window 1: each row attends to itself alone, so dq = dk = 0 up to rounding, which a
     * relative error cannot judge (tests/runtime checks it against zero); the forward is
     * compared, the backward from window 2 on */
    for (int variant = 0; variant < 3 && s.window != 1; variant++) { /* all; dq; dk, dv */
        if (quick && variant > 0 && s.d > 64)
            continue;
        kc_begin(&K, "attention_backward", TOL_FP32, "%s %s", label,
                 variant == 0 ? "all" : variant == 1 ? "dq" : "dk,dv");
        dq = KC_IN_F(&K, q, nq);
        dk = KC_IN_F(&K, k, nkv);
        dv = KC_IN_F(&K, v, nkv);
        float *ddo = KC_IN_F(&K, dout, nq), *dout_ = KC_IN_F(&K, out, nq);
        float *dl = KC_IN_F(&K, lse, nl);
        obuf *gq = variant != 2 ? kc_out_rand(&K, "dq", nq, 1) : NULL;
        obuf *gk = variant != 1 ? kc_out_rand(&K, "dk", nkv, 1) : NULL;
        obuf *gv = variant != 1 ? kc_out_rand(&K, "dv", nkv, 1) : NULL;
        REF(cpuref_sbprt_attention_backward_ex(C, gq ? gq->ref : NULL, gk ? gk->ref : NULL,
                                               gv ? gv->ref : NULL, dout, q, k, v, out, lse, s.b,
                                               s.t, s.tk, s.hq, s.hkv, s.d, s.q_start, scale,
                                               s.window, s.softcap));
        KC_RUN(K, sbprt_attention_backward_ex(G, gq ? gq->d : NULL, gk ? gk->d : NULL,
                                              gv ? gv->d : NULL, ddo, dq, dk, dv, dout_, dl, s.b,
                                              s.t, s.tk, s.hq, s.hkv, s.d, s.q_start, scale,
                                              s.window, s.softcap));
    }
}

/* The tensor-core layer (runtime/cuda/mma.cuh, through attention.cu's one-warp check kernel):
 * d = a·b + c for a [16, 32], b [32, 8], with b kept k-major and n-major in shared memory,
 * against a float64 loop over the same inputs.  bf16: inputs that are bf16 values, so the
 * products are exact and only the fp32 accumulation rounds; 3xTF32: any fp32 inputs, within
 * the 2^-22-relative terms it drops.  A fragment in the wrong register gives errors of the
 * order of the values themselves. */
int cu_mma_check(sbprt_ctx *ctx, float *d, const float *a, const float *b, const float *c,
                 int bf16, int kn);

static void t_mma(void)
{
    kstat *st = kstat_get("mma fragments vs float64 product", 1e-5);
    for (int bf = 0; bf < 2; bf++)
        for (int kn = 0; kn < 2; kn++) {
            float *a = hrand(16 * 32, -1, 1), *b = hrand(32 * 8, -1, 1), *c = hrand(16 * 8, -1, 1);
            float got[16 * 8];
            for (int i = 0; i < 16 * 32 + 32 * 8 && bf; i++) { /* the bf16 values */
                float *x = i < 16 * 32 ? &a[i] : &b[i - 16 * 32];
                const sbprt_bf16 h = f_to_bf(*x);
                bf_to_floats(x, &h, 1);
            }
            float *da = dnew(sizeof(float) * 16 * 32), *db = dnew(sizeof(float) * 32 * 8);
            float *dc = dnew(sizeof(float) * 16 * 8), *dd = dnew(sizeof(float) * 16 * 8);
            upload(da, a, sizeof(float) * 16 * 32);
            upload(db, b, sizeof(float) * 32 * 8);
            upload(dc, c, sizeof(float) * 16 * 8);
            int rc = cu_mma_check(G, dd, da, db, dc, bf, kn), rs = sbprt_sync(G);
            download(got, dd, sizeof got);
            double worst = 0;
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 8; j++) {
                    double ref = c[i * 8 + j], mag = fabs(c[i * 8 + j]);
                    for (int k = 0; k < 32; k++) {
                        ref += (double)a[i * 32 + k] * b[k * 8 + j];
                        mag += fabs((double)a[i * 32 + k] * b[k * 8 + j]);
                    }
                    const double e = fabs(got[i * 8 + j] - ref) / mag;
                    worst = e > worst || isnan(e) ? e : worst;
                }
            st->cases++;
            if (isnan(worst) || worst > st->max_err)
                st->max_err = worst;
            if (rc != SBPRT_OK || rs != SBPRT_OK || !(worst <= st->tol)) {
                fail("mma %s, b %s: status %d / sync %d, max error %.3g (relative to the sum "
                     "of |products|) > %.0e",
                     bf ? "bf16 m16n8k16" : "3xTF32 m16n8k8", kn ? "k-major" : "n-major", rc,
                     rs, worst, st->tol);
                st->fails++;
            }
            sbprt_arena_free(G, da);
            sbprt_arena_free(G, db);
            sbprt_arena_free(G, dc);
            sbprt_arena_free(G, dd);
        }
    hfree_all();
}

static void t_attention(void)
{
    t_mma();
    static const att_shape full[] = {
        {2, 512, 512, 8, 2, 64, 0, 0, 0},       /* GQA, causal self-attention */
        {1, 256, 1024, 4, 4, 128, 768, 0, 0},   /* MHA, last StreamBP chunk */
        {1, 100, 300, 6, 1, 80, 150, 0, 0},     /* MQA, a middle chunk, keys past 250 never read */
        {1, 37, 37, 2, 1, 256, 0, 0, 0},        /* the largest head size */
        {2, 70, 70, 4, 2, 33, 0, 0, 0},         /* odd head size */
        {1, 1024, 1024, 16, 8, 128, 0, 0, 0},   /* a realistic layer (timing) */
        /* the variants: sliding windows (1, none a multiple of the 32-key tile, one at least
         * t), soft-capping, both, in a chunk whose window starts inside the K/V prefix */
        {2, 512, 512, 8, 2, 64, 0, 1, 0},
        {2, 512, 512, 8, 2, 64, 0, 2, 0},
        {2, 512, 512, 8, 2, 64, 0, 100, 0},
        {1, 256, 1024, 4, 4, 128, 768, 300, 0},
        {2, 70, 70, 4, 2, 33, 0, 70, 0},
        {2, 512, 512, 8, 2, 64, 0, 0, 2.0f},
        {1, 100, 300, 6, 1, 80, 150, 77, 30.0f},
        {1, 1024, 1024, 16, 8, 128, 0, 256, 50.0f}, /* Gemma-2 like local layer (timing) */
    };
    static const att_shape small[] = {
        {1, 40, 40, 2, 1, 16, 0, 0, 0},
        {1, 20, 70, 4, 2, 24, 50, 0, 0},
        {2, 33, 45, 2, 2, 33, 7, 0, 0},
        {1, 5, 9, 1, 1, 256, 2, 0, 0},
        {1, 40, 40, 2, 1, 16, 0, 1, 0},
        {1, 40, 40, 2, 1, 16, 0, 2, 0},
        {2, 70, 70, 4, 2, 24, 0, 20, 0},
        {1, 20, 70, 4, 2, 24, 50, 37, 0},
        {1, 70, 70, 2, 1, 16, 0, 100, 0},
        {1, 40, 40, 2, 1, 16, 0, 0, 1.0f},
        {2, 33, 45, 2, 2, 33, 7, 13, 2.0f},
        /* head sizes of the tensor-core forward: t off the 64-row tile, chunks after a K/V
         * prefix, GQA, b > 1, windows (one inside a tile, one across tiles), soft-capping */
        {1, 100, 100, 2, 1, 64, 0, 0, 0},
        {2, 70, 150, 4, 2, 128, 80, 0, 0},
        {1, 130, 130, 2, 2, 64, 0, 50, 0},
        {1, 90, 200, 2, 1, 64, 110, 37, 5.0f},
        {1, 65, 65, 2, 1, 128, 0, 100, 2.0f},
    };
    const att_shape *shapes = quick ? small : full;
    const int ns = quick ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    for (int i = 0; i < ns; i++) {
        t_attention_shape(shapes[i]);
        hfree_all();
    }
}

/* ---- attention over packed documents ------------------------------------------------------ */

/* doc_start [b, tk] for rows cut into documents of the lengths in lens (0-terminated, used
 * cyclically, row bi starting at entry bi so rows differ; the last document is cut at tk). */
static int32_t *att_doc_starts(int b, int tk, const int *lens)
{
    int32_t *ds = hnew((size_t)b * tk * sizeof(int32_t));
    int nl = 0;
    while (lens[nl])
        nl++;
    for (int bi = 0; bi < b; bi++) {
        int p = 0, li = bi % nl;
        while (p < tk) {
            const int start = p;
            for (int e = 0; e < lens[li] && p < tk; e++, p++)
                ds[(size_t)bi * tk + p] = start;
            li = (li + 1) % nl;
        }
    }
    return ds;
}

/* The first key row bi's chunk may read (its first row's document start or window). */
static int att_packed_klo(att_shape s, const int32_t *ds, int bi)
{
    int lo = ds[(size_t)bi * s.tk + s.q_start];
    if (s.window > 0 && s.q_start - s.window + 1 > lo)
        lo = s.q_start - s.window + 1;
    return lo;
}

/* One packed case, fp32 (bf = 0) or bf16 (bf = 1), forward and backward, against the CPU
 * twin; the K/V rows the chunk must not read hold NaN.  The fp32 backward runs with all
 * gradients, and with dq or dk, dv alone when `partial`. */
static void t_attention_packed_shape(att_shape s, const int *lens, int bf, int partial)
{
    const size_t nq = (size_t)s.b * s.t * s.hq * s.d, nkv = (size_t)s.b * s.tk * s.hkv * s.d;
    const size_t nl = (size_t)s.b * s.hq * s.t, row = (size_t)s.hkv * s.d;
    const float scale = 1.0f / sqrtf((float)s.d);
    const int32_t *ds = att_doc_starts(s.b, s.tk, lens);
    float *q = hrand(nq, -1, 1), *k = hrand(nkv, -1, 1), *v = hrand(nkv, -1, 1);
    const float *dout = hrand(nq, -1, 1);
    for (int bi = 0; bi < s.b; bi++) {
        const int klo = att_packed_klo(s, ds, bi);
        for (int j = 0; j < s.tk; j++)
            for (size_t e = 0; e < row && (j < klo || j >= s.q_start + s.t); e++)
                k[((size_t)bi * s.tk + j) * row + e] = v[((size_t)bi * s.tk + j) * row + e] = NAN;
    }
    char label[160];
    att_label(label, sizeof label, s);
    kcase K;
    if (!bf) {
        float *out = hnew(nq * sizeof(float)), *lse = hnew(nl * sizeof(float));
        REF(cpuref_sbprt_attention_forward_packed(C, out, lse, q, k, v, ds, s.b, s.t, s.tk, s.hq,
                                                  s.hkv, s.d, s.q_start, scale, s.window,
                                                  s.softcap));
        kc_begin(&K, "attention_forward_packed", TOL_FP32, "%s", label);
        float *dq = KC_IN_F(&K, q, nq), *dk = KC_IN_F(&K, k, nkv), *dv = KC_IN_F(&K, v, nkv);
        int32_t *dds = KC_IN_I(&K, ds, (size_t)s.b * s.tk);
        obuf *o = kc_out_rand(&K, "out", nq, 0), *l = kc_out_rand(&K, "lse", nl, 0);
        memcpy(o->ref, out, nq * sizeof(float));
        memcpy(l->ref, lse, nl * sizeof(float));
        KC_RUN(K, sbprt_attention_forward_packed(G, o->d, l->d, dq, dk, dv, dds, s.b, s.t, s.tk,
                                                 s.hq, s.hkv, s.d, s.q_start, scale, s.window,
                                                 s.softcap));
        for (int variant = 0; variant < (partial ? 3 : 1); variant++) { /* all; dq; dk, dv */
            kc_begin(&K, "attention_backward_packed", TOL_FP32, "%s %s", label,
                     variant == 0 ? "all" : variant == 1 ? "dq" : "dk,dv");
            dq = KC_IN_F(&K, q, nq);
            dk = KC_IN_F(&K, k, nkv);
            dv = KC_IN_F(&K, v, nkv);
            dds = KC_IN_I(&K, ds, (size_t)s.b * s.tk);
            float *ddo = KC_IN_F(&K, dout, nq), *dout_ = KC_IN_F(&K, out, nq);
            float *dl = KC_IN_F(&K, lse, nl);
            obuf *gq = variant != 2 ? kc_out_rand(&K, "dq", nq, 1) : NULL;
            obuf *gk = variant != 1 ? kc_out_rand(&K, "dk", nkv, 1) : NULL;
            obuf *gv = variant != 1 ? kc_out_rand(&K, "dv", nkv, 1) : NULL;
            REF(cpuref_sbprt_attention_backward_packed(
                C, gq ? gq->ref : NULL, gk ? gk->ref : NULL, gv ? gv->ref : NULL, dout, q, k, v,
                out, lse, ds, s.b, s.t, s.tk, s.hq, s.hkv, s.d, s.q_start, scale, s.window,
                s.softcap));
            KC_RUN(K, sbprt_attention_backward_packed(
                          G, gq ? gq->d : NULL, gk ? gk->d : NULL, gv ? gv->d : NULL, ddo, dq, dk,
                          dv, dout_, dl, dds, s.b, s.t, s.tk, s.hq, s.hkv, s.d, s.q_start, scale,
                          s.window, s.softcap));
        }
        return;
    }
    sbprt_bf16 *qb = hnew(nq * sizeof(sbprt_bf16)), *kb = hnew(nkv * sizeof(sbprt_bf16));
    sbprt_bf16 *vb = hnew(nkv * sizeof(sbprt_bf16)), *gb = hnew(nq * sizeof(sbprt_bf16));
    for (size_t i = 0; i < nq; i++)
        qb[i] = f_to_bf(q[i]), gb[i] = f_to_bf(dout[i]);
    for (size_t i = 0; i < nkv; i++)
        kb[i] = f_to_bf(k[i]), vb[i] = f_to_bf(v[i]);
    sbprt_bf16 *out = hnew(nq * sizeof(sbprt_bf16));
    float *lse = hnew(nl * sizeof(float));
    REF(cpuref_sbprt_attention_forward_packed_bf16(C, out, lse, qb, kb, vb, ds, s.b, s.t, s.tk,
                                                   s.hq, s.hkv, s.d, s.q_start, scale, s.window,
                                                   s.softcap));
    kc_begin(&K, "attention_forward_packed_bf16", TOL_BF16, "%s", label);
    sbprt_bf16 *dq = KC_IN_B(&K, qb, nq), *dk = KC_IN_B(&K, kb, nkv), *dv = KC_IN_B(&K, vb, nkv);
    int32_t *dds = KC_IN_I(&K, ds, (size_t)s.b * s.tk);
    obuf *o = kc_out_bf_rand(&K, "out", nq, 0), *l = kc_out_rand(&K, "lse", nl, 0);
    memcpy(o->ref, out, nq * sizeof(sbprt_bf16));
    memcpy(l->ref, lse, nl * sizeof(float));
    KC_RUN(K, sbprt_attention_forward_packed_bf16(G, BDEV(o), l->d, dq, dk, dv, dds, s.b, s.t,
                                                  s.tk, s.hq, s.hkv, s.d, s.q_start, scale,
                                                  s.window, s.softcap));
    kc_begin(&K, "attention_backward_packed_bf16", TOL_BF16, "%s", label);
    dq = KC_IN_B(&K, qb, nq);
    dk = KC_IN_B(&K, kb, nkv);
    dv = KC_IN_B(&K, vb, nkv);
    dds = KC_IN_I(&K, ds, (size_t)s.b * s.tk);
    sbprt_bf16 *ddo = KC_IN_B(&K, gb, nq), *dout_ = KC_IN_B(&K, out, nq);
    float *dl = KC_IN_F(&K, lse, nl);
    obuf *gq = kc_out_bf_rand(&K, "dq", nq, 1), *gk = kc_out_bf_rand(&K, "dk", nkv, 1);
    obuf *gv = kc_out_bf_rand(&K, "dv", nkv, 1);
    REF(cpuref_sbprt_attention_backward_packed_bf16(C, BREF(gq), BREF(gk), BREF(gv), gb, qb, kb,
                                                    vb, out, lse, ds, s.b, s.t, s.tk, s.hq, s.hkv,
                                                    s.d, s.q_start, scale, s.window, s.softcap));
    KC_RUN(K, sbprt_attention_backward_packed_bf16(G, BDEV(gq), BDEV(gk), BDEV(gv), ddo, dq, dk,
                                                   dv, dout_, dl, dds, s.b, s.t, s.tk, s.hq,
                                                   s.hkv, s.d, s.q_start, scale, s.window,
                                                   s.softcap));
}

/* sbprt_doc_starts / sbprt_doc_positions: integers, equal to the CPU twin's exactly. */
static void t_doc_starts(int b, int t, int maxlen)
{
    kstat *st = kstat_get("doc_starts, doc_positions (exact)", 0);
    const size_t bytes = (size_t)b * t * sizeof(int32_t);
    int32_t *ids = hnew(bytes), *want = hnew(bytes), *got = hnew(bytes);
    for (int bi = 0; bi < b; bi++) {
        int id = rng_int(5) - 2, left = 1 + rng_int(maxlen);
        for (int p = 0; p < t; p++, left--) {
            if (left == 0)
                id += 1 + rng_int(3), left = 1 + rng_int(rng_int(4) == 0 ? 2 : maxlen);
            ids[(size_t)bi * t + p] = id;
        }
    }
    int32_t *d_ids = dnew(bytes), *d_out = dnew(bytes);
    upload(d_ids, ids, bytes);
    for (int rel = 0; rel < 2; rel++) {
        st->cases++;
        REF(rel ? cpuref_sbprt_doc_positions(C, want, ids, b, t)
                : cpuref_sbprt_doc_starts(C, want, ids, b, t));
        int rc = rel ? sbprt_doc_positions(G, d_out, d_ids, b, t)
                     : sbprt_doc_starts(G, d_out, d_ids, b, t);
        int rs = sbprt_sync(G);
        download(got, d_out, bytes);
        if (rc != SBPRT_OK || rs != SBPRT_OK || memcmp(got, want, bytes) != 0) {
            fail("%s b=%d t=%d: status %d / sync %d, or results differ from the CPU twin",
                 rel ? "doc_positions" : "doc_starts", b, t, rc, rs);
            st->fails++;
        }
    }
    sbprt_arena_free(G, d_ids);
    sbprt_arena_free(G, d_out);
}

static void t_attention_packed(void)
{
    /* document lengths: 1-token documents, lengths on and off the tiles (32 keys on CUDA,
     * 64 on the CPU), a long one */
    static const int lens_a[] = {1, 37, 1, 1, 64, 90, 0}, lens_b[] = {32, 32, 5, 200, 0};
    static const att_shape full[] = {
        {2, 512, 512, 8, 2, 64, 0, 0, 0},
        {1, 256, 1024, 4, 4, 128, 768, 0, 0}, /* last StreamBP chunk, first document before it */
        {1, 100, 300, 6, 1, 80, 150, 0, 0},
        {2, 70, 70, 4, 2, 33, 0, 0, 0},
        {2, 512, 512, 8, 2, 64, 0, 100, 0},
        {1, 100, 300, 6, 1, 80, 150, 77, 30.0f},
        {2, 512, 512, 8, 2, 64, 0, 0, 2.0f},
        {4, 1024, 1024, 16, 8, 128, 0, 0, 0}, /* timing */
    };
    static const att_shape small[] = {
        {2, 40, 40, 2, 1, 16, 0, 0, 0},
        {1, 20, 70, 4, 2, 24, 50, 0, 0},
        {2, 33, 80, 2, 2, 33, 39, 0, 0},
        {2, 70, 70, 4, 2, 24, 0, 20, 0},
        {1, 40, 40, 2, 1, 16, 0, 0, 1.0f},
        {2, 33, 80, 2, 2, 33, 40, 13, 2.0f},
        {2, 100, 100, 2, 1, 64, 0, 0, 0},        /* the tensor-core forward's head sizes */
        {1, 70, 150, 4, 2, 128, 80, 30, 2.0f},
    };
    const att_shape *shapes = quick ? small : full;
    const int ns = quick ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    for (int i = 0; i < ns; i++)
        for (int l = 0; l < 2; l++) {
            t_attention_packed_shape(shapes[i], l ? lens_b : lens_a, 0, !quick || i % 2 == l);
            if (i % 2 == l) /* bf16 on half the cases */
                t_attention_packed_shape(shapes[i], l ? lens_b : lens_a, 1, 0);
            hfree_all();
        }
    t_doc_starts(3, quick ? 50 : 4096, quick ? 9 : 700);
    t_doc_starts(1, 1, 1);
    hfree_all();
}

/* ---- losses ------------------------------------------------------------------------------- */

static void t_loss(void)
{
    const int n = quick ? 7 : 1024, v = quick ? 1000 : 50257;
    int32_t *labels = hnew((size_t)n * sizeof(int32_t));
    int scored = 0;
    for (int r = 0; r < n; r++) {
        labels[r] = r % 5 == 3 ? SBPRT_IGNORE_INDEX : rng_int(v);
        scored += labels[r] != SBPRT_IGNORE_INDEX;
    }
    const float *logits = hrand((size_t)n * v, -6, 6);
    const float scale = 1.0f / (float)scored;
    kcase K;

    for (int variant = 0; variant < 3; variant++) { /* separate dlogits; in place; loss only */
        kc_begin(&K, "cross_entropy_forward_backward", TOL_FP32, "n=%d v=%d %s", n, v,
                 variant == 0 ? "" : variant == 1 ? "in place" : "loss only");
        int32_t *dlab = KC_IN_I(&K, labels, n);
        float init = 1.5f;
        obuf *loss = kc_out(&K, "loss_sum", &init, 1, 1);
        if (variant == 1) {
            obuf *io = kc_out(&K, "dlogits", logits, (size_t)n * v, 0);
            REF(cpuref_sbprt_cross_entropy_forward_backward(C, loss->ref, io->ref, io->ref, labels,
                                                            n, v, scale));
            KC_RUN(K, sbprt_cross_entropy_forward_backward(G, loss->d, io->d, io->d, dlab, n, v,
                                                           scale));
        } else {
            float *dlog = KC_IN_F(&K, logits, (size_t)n * v);
            obuf *dl = variant == 0 ? kc_out_rand(&K, "dlogits", (size_t)n * v, 0) : NULL;
            REF(cpuref_sbprt_cross_entropy_forward_backward(C, loss->ref, dl ? dl->ref : NULL,
                                                            logits, labels, n, v, scale));
            KC_RUN(K, sbprt_cross_entropy_forward_backward(G, loss->d, dl ? dl->d : NULL, dlog,
                                                           dlab, n, v, scale));
        }
    }

    float *lse = hnew((size_t)n * sizeof(float)), *logp = hnew((size_t)n * sizeof(float));
    REF(cpuref_sbprt_label_logprob_forward(C, logp, lse, logits, labels, n, v));
    for (int variant = 0; variant < 2; variant++) {
        kc_begin(&K, "label_logprob_forward", TOL_FP32, "n=%d v=%d%s", n, v,
                 variant ? " no lse" : "");
        int32_t *dlab = KC_IN_I(&K, labels, n);
        float *dlog = KC_IN_F(&K, logits, (size_t)n * v);
        obuf *lp = kc_out_rand(&K, "logp", n, 0);
        obuf *ls = variant == 0 ? kc_out_rand(&K, "lse", n, 0) : NULL;
        REF(cpuref_sbprt_label_logprob_forward(C, lp->ref, ls ? ls->ref : NULL, logits, labels, n,
                                               v));
        KC_RUN(K, sbprt_label_logprob_forward(G, lp->d, ls ? ls->d : NULL, dlog, dlab, n, v));
    }
    const float *dlogp = hrand(n, -1, 1);
    kc_begin(&K, "label_logprob_backward", TOL_FP32, "n=%d v=%d", n, v);
    int32_t *dlab = KC_IN_I(&K, labels, n);
    float *dlog = KC_IN_F(&K, logits, (size_t)n * v), *dls = KC_IN_F(&K, lse, n);
    float *ddl = KC_IN_F(&K, dlogp, n);
    obuf *g = kc_out(&K, "dlogits", hrand((size_t)n * v, -1e-3f, 1e-3f), (size_t)n * v, 1);
    REF(cpuref_sbprt_label_logprob_backward(C, g->ref, dlogp, logits, labels, lse, n, v));
    KC_RUN(K, sbprt_label_logprob_backward(G, g->d, ddl, dlog, dlab, dls, n, v));

    /* the objectives' kernels (runtime/cuda/objectives.cu) */
    for (int variant = 0; variant < 3; variant++) { /* with lse; computed; in place */
        kc_begin(&K, "label_logprob_grad", TOL_FP32, "n=%d v=%d %s", n, v,
                 variant == 0 ? "" : variant == 1 ? "no lse" : "in place");
        int32_t *dl2 = KC_IN_I(&K, labels, n);
        float *dd = KC_IN_F(&K, dlogp, n), *dz = KC_IN_F(&K, lse, n);
        if (variant == 2) {
            obuf *io = kc_out(&K, "dlogits", logits, (size_t)n * v, 0);
            REF(cpuref_sbprt_label_logprob_grad(C, io->ref, dlogp, io->ref, labels, NULL, n, v));
            KC_RUN(K, sbprt_label_logprob_grad(G, io->d, dd, io->d, dl2, NULL, n, v));
        } else {
            float *dx = KC_IN_F(&K, logits, (size_t)n * v);
            obuf *o = kc_out_rand(&K, "dlogits", (size_t)n * v, 0);
            REF(cpuref_sbprt_label_logprob_grad(C, o->ref, dlogp, logits, labels,
                                                variant ? NULL : lse, n, v));
            KC_RUN(K, sbprt_label_logprob_grad(G, o->d, dd, dx, dl2, variant ? NULL : dz, n, v));
        }
    }
    const int seq = quick ? 3 : 100, r0 = quick ? 2 : 150, nseq = (r0 + n - 1) / seq + 1;
    float *old = hnew((size_t)(r0 + n) * sizeof(float)), *ref = hnew((size_t)(r0 + n) * sizeof(float));
    for (int i = 0; i < r0 + n; i++) {
        old[i] = (i >= r0 ? logp[i - r0] : 0) + 0.6f * (float)(rng_int(1000) - 500) / 500;
        ref[i] = (i >= r0 ? logp[i - r0] : 0) + 0.3f * (float)(rng_int(1000) - 500) / 500;
    }
    const float *adv = hrand(nseq, -1.5f, 1.5f), *roww = hrand(nseq, 0.01f, 0.2f);
    for (int variant = 0; variant < 2; variant++) { /* off-policy with KL; on-policy, beta 0 */
        kc_begin(&K, "grpo_token_loss", TOL_FP32, "n=%d r0=%d seq=%d %s", n, r0, seq,
                 variant ? "on-policy beta 0" : "");
        int32_t *dl2 = KC_IN_I(&K, labels, n);
        float *dlp = KC_IN_F(&K, logp, n), *dold = KC_IN_F(&K, old, r0 + n);
        float *dref = KC_IN_F(&K, ref, r0 + n), *dadv = KC_IN_F(&K, adv, nseq);
        float *dw = KC_IN_F(&K, roww, nseq);
        float init = 0.5f;
        obuf *ls = kc_out(&K, "loss_sum", &init, 1, 1), *o = kc_out_rand(&K, "dlogp", n, 0);
        const float beta = variant ? 0.0f : 0.04f;
        REF(cpuref_sbprt_grpo_token_loss(C, ls->ref, o->ref, logp, labels, variant ? NULL : old,
                                         variant ? NULL : ref, adv, roww, n, r0, seq, beta, 0.2f));
        KC_RUN(K, sbprt_grpo_token_loss(G, ls->d, o->d, dlp, dl2, variant ? NULL : dold,
                                        variant ? NULL : dref, dadv, dw, n, r0, seq, beta, 0.2f));
    }
    hfree_all();
}

/* ---- Mixture-of-Experts ------------------------------------------------------------------
 * sbprt_moe_forward / _backward on small layers.  The forward's sel (int32) must equal the
 * CPU twin's exactly; the backward then takes the twin's probs, sel, wts and stats as its
 * inputs on both backends.  A "starved" layer gives the last expert a router bias of -50
 * through a constant first feature, so it receives no rows; a "ties" layer gives experts 0
 * and 1 the same router row (equal probabilities: the lower index must come first). */

typedef struct {
    const char *what;
    int n, d, e, k, f;
    int norm_topk;
    int stats;   /* pass stats (else NULL) */
    float aux;   /* the backward's aux_scale */
    int starve;  /* the last expert receives no rows */
    int tie;     /* experts 0 and 1 share their router row, biased to be chosen */
    int grads;   /* run the backward with each subset of gradient outputs, not just all */
} moe_shape;

static void t_moe_shape(const moe_shape *s)
{
    const int n = s->n, d = s->d, e = s->e, k = s->k, f = s->f;
    const size_t nd = (size_t)n * d, ne = (size_t)n * e, nk = (size_t)n * k;
    const size_t nw1 = (size_t)e * 2 * f * d, nw2 = (size_t)e * d * f;
    const size_t nscr = sbprt_moe_scratch_floats(n, d, e, k, f);
    float *x = hrand(nd, -1, 1), *wr = hrand((size_t)e * d, -0.5f, 0.5f);
    const float *w1 = hrand(nw1, -0.3f, 0.3f), *w2 = hrand(nw2, -0.3f, 0.3f);
    const float *dy = hrand(nd, -1, 1);
    if (s->starve || s->tie)
        for (int r = 0; r < n; r++)
            x[(size_t)r * d] = 1.0f; /* a constant feature: wr[:, 0] acts as a bias */
    if (s->starve)
        wr[(size_t)(e - 1) * d] = -50.0f;
    if (s->tie) {
        wr[0] = 2.0f;
        memcpy(wr + d, wr, (size_t)d * sizeof(float));
    }
    float *scr = hnew(nscr * sizeof(float));
    char label[160];
    snprintf(label, sizeof label, "%s: n=%d d=%d e=%d k=%d f=%d norm=%d%s", s->what, n, d, e, k,
             f, s->norm_topk, s->stats ? " stats" : "");
    kcase K;

    /* the forward: y, probs, wts written, stats accumulated; sel compared exactly after */
    kc_begin(&K, "moe_forward", TOL_FP32, "%s", label);
    kstat *sel_st = kstat_get("moe_forward sel (exact)", 0);
    float *dxin = KC_IN_F(&K, x, nd), *dwr = KC_IN_F(&K, wr, (size_t)e * d);
    float *dw1 = KC_IN_F(&K, w1, nw1), *dw2 = KC_IN_F(&K, w2, nw2);
    float *dscr = KC_IN_F(&K, hrand(nscr, -1, 1), nscr);
    obuf *y = kc_out_rand(&K, "y", nd, 0), *probs = kc_out_rand(&K, "probs", ne, 0);
    obuf *wts = kc_out_rand(&K, "wts", nk, 0);
    obuf *stats = s->stats ? kc_out(&K, "stats", hrand(2 * (size_t)e, 0, 3), 2 * (size_t)e, 1)
                           : NULL;
    int32_t *sel = hnew(nk * sizeof(int32_t)), *gsel = hnew(nk * sizeof(int32_t));
    int32_t *dsel = dnew(nk * sizeof(int32_t));
    REF(cpuref_sbprt_moe_forward(C, y->ref, probs->ref, sel, wts->ref, stats ? stats->ref : NULL,
                                 x, wr, w1, w2, scr, n, d, e, k, f, s->norm_topk));
    /* the twin's probs, wts and stats, kept for the backward (kc_finish frees the obufs) */
    float *hprobs = hnew(ne * sizeof(float)), *hwts = hnew(nk * sizeof(float));
    float *hstats = hnew(2 * (size_t)e * sizeof(float));
    memcpy(hprobs, probs->ref, ne * sizeof(float));
    memcpy(hwts, wts->ref, nk * sizeof(float));
    if (stats)
        memcpy(hstats, stats->ref, 2 * (size_t)e * sizeof(float));
    KC_RUN(K, sbprt_moe_forward(G, y->d, probs->d, dsel, wts->d, stats ? stats->d : NULL, dxin,
                                dwr, dw1, dw2, dscr, n, d, e, k, f, s->norm_topk));
    download(gsel, dsel, nk * sizeof(int32_t));
    sbprt_arena_free(G, dsel);
    sel_st->cases++;
    if (memcmp(gsel, sel, nk * sizeof(int32_t)) != 0) {
        fail("moe_forward [%s]: sel differs from the CPU twin's", label);
        sel_st->fails++;
    }
    /* the routing the layer was built for (on the twin: a failure here is a test bug) */
    int both = 0, routed = 1;
    for (int r = 0; r < n; r++) {
        int j0 = -1, j1 = -1;
        for (int j = 0; j < k; j++) {
            const int32_t i = sel[(size_t)r * k + j];
            j0 = i == 0 ? j : j0;
            j1 = i == 1 ? j : j1;
            routed &= !(s->starve && i == e - 1);
        }
        both += j0 >= 0 && j1 >= 0;
        routed &= !(s->tie && j1 >= 0 && (j0 < 0 || j0 > j1)); /* equal: expert 0 first */
        routed &= !(s->tie && hprobs[(size_t)r * e] != hprobs[(size_t)r * e + 1]);
    }
    if (!routed || (s->tie && both == 0)) {
        fail("moe [%s]: the routing is not the one the case is built for", label);
        sel_st->fails++;
    }

    /* the routing alone (y NULL, the experts' weights NULL): a recomputation's call */
    kc_begin(&K, "moe_forward", TOL_FP32, "%s routing only", label);
    float *rx = KC_IN_F(&K, x, nd), *rwr = KC_IN_F(&K, wr, (size_t)e * d);
    float *rscr = KC_IN_F(&K, hrand(nscr, -1, 1), nscr);
    obuf *rprobs = kc_out_rand(&K, "probs", ne, 0), *rwts = kc_out_rand(&K, "wts", nk, 0);
    obuf *rstats = s->stats ? kc_out(&K, "stats", hrand(2 * (size_t)e, 0, 3), 2 * (size_t)e, 1)
                            : NULL;
    int32_t *rsel = hnew(nk * sizeof(int32_t)), *rdsel = dnew(nk * sizeof(int32_t));
    REF(cpuref_sbprt_moe_forward(C, NULL, rprobs->ref, rsel, rwts->ref,
                                 rstats ? rstats->ref : NULL, x, wr, NULL, NULL, scr, n, d, e, k,
                                 f, s->norm_topk));
    KC_RUN(K, sbprt_moe_forward(G, NULL, rprobs->d, rdsel, rwts->d, rstats ? rstats->d : NULL,
                                rx, rwr, NULL, NULL, rscr, n, d, e, k, f, s->norm_topk));
    download(gsel, rdsel, nk * sizeof(int32_t));
    sbprt_arena_free(G, rdsel);
    sel_st->cases++;
    if (memcmp(gsel, rsel, nk * sizeof(int32_t)) != 0 || memcmp(rsel, sel, nk * sizeof(int32_t))) {
        fail("moe_forward [%s, routing only]: sel differs from the full forward's", label);
        sel_st->fails++;
    }

    /* the backward, accumulated into random gradients; which: all, dw1 dw2, dx dwr, dx */
    for (int which = 0; which < (s->grads ? 4 : 1); which++) {
        static const char *names[] = {"all", "dw1,dw2", "dx,dwr", "dx"};
        kc_begin(&K, "moe_backward", TOL_FP32, "%s aux=%g grads=%s", label, (double)s->aux,
                 names[which]);
        float *ddy = KC_IN_F(&K, dy, nd), *dxi = KC_IN_F(&K, x, nd);
        float *dwri = KC_IN_F(&K, wr, (size_t)e * d);
        float *dw1i = KC_IN_F(&K, w1, nw1), *dw2i = KC_IN_F(&K, w2, nw2);
        float *dpr = KC_IN_F(&K, hprobs, ne), *dwt = KC_IN_F(&K, hwts, nk);
        int32_t *dsl = KC_IN_I(&K, sel, nk);
        float *dst = s->stats ? KC_IN_F(&K, hstats, 2 * (size_t)e) : NULL;
        float *dscr2 = KC_IN_F(&K, hrand(nscr, -1, 1), nscr);
        obuf *gx = which != 1 ? kc_out_rand(&K, "dx", nd, 1) : NULL;
        obuf *gwr = which == 0 || which == 2 ? kc_out_rand(&K, "dwr", (size_t)e * d, 1) : NULL;
        obuf *gw1 = which <= 1 ? kc_out_rand(&K, "dw1", nw1, 1) : NULL;
        obuf *gw2 = which <= 1 ? kc_out_rand(&K, "dw2", nw2, 1) : NULL;
        REF(cpuref_sbprt_moe_backward(C, gx ? gx->ref : NULL, gwr ? gwr->ref : NULL,
                                      gw1 ? gw1->ref : NULL, gw2 ? gw2->ref : NULL, dy, x, wr, w1,
                                      w2, hprobs, sel, hwts, s->stats ? hstats : NULL, scr, n, d,
                                      e, k, f, s->norm_topk, s->aux));
        KC_RUN(K, sbprt_moe_backward(G, gx ? gx->d : NULL, gwr ? gwr->d : NULL,
                                     gw1 ? gw1->d : NULL, gw2 ? gw2->d : NULL, ddy, dxi, dwri,
                                     dw1i, dw2i, dpr, dsl, dwt, dst, dscr2, n, d, e, k, f,
                                     s->norm_topk, s->aux));
    }
}

/* Argument errors: the same status from both backends, found up front. */
static void t_moe_errors(void)
{
    kstat *s = kstat_get("moe argument errors", 0);
    s->cases++;
    const int before = nfail;
    float *d = dnew(4096 * sizeof(float));
    int32_t *di = (int32_t *)d;
    static float h[4096];
    static const struct {
        const char *what;
        int n, d, e, k, f, null_x, want;
    } cases[] = {
        {"k = 0", 2, 4, 3, 0, 2, 0, SBPRT_ERR_INVALID},
        {"k > e", 2, 4, 3, 4, 2, 0, SBPRT_ERR_INVALID},
        {"d = 0", 2, 0, 3, 1, 2, 0, SBPRT_ERR_INVALID},
        {"e = 0", 2, 4, 0, 1, 2, 0, SBPRT_ERR_INVALID},
        {"f = 0", 2, 4, 3, 1, 0, 0, SBPRT_ERR_INVALID},
        {"n < 0", -1, 4, 3, 1, 2, 0, SBPRT_ERR_INVALID},
        {"x NULL", 2, 4, 3, 1, 2, 1, SBPRT_ERR_INVALID},
        {"n = 0, x NULL", 0, 4, 3, 1, 2, 1, SBPRT_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int n = cases[i].n, dd = cases[i].d, e = cases[i].e, k = cases[i].k;
        const int f = cases[i].f, z = cases[i].null_x;
        float *g = z ? NULL : d; /* x NULL, or every tensor in one buffer (never read) */
        float *c = z ? NULL : h;
        char what[96];
        snprintf(what, sizeof what, "moe_forward %s", cases[i].what);
        check_status(what,
                     sbprt_moe_forward(G, d, d, di, d, NULL, g, d, d, d, d, n, dd, e, k, f, 1),
                     cases[i].want);
        int cst = cpuref_sbprt_moe_forward(C, h, h, (int32_t *)h, h, NULL, c, h, h, h, h, n, dd, e,
                                           k, f, 1);
        if (cst != cases[i].want)
            fail("%s on the CPU twin returned %d, expected %d", what, cst, cases[i].want);
        snprintf(what, sizeof what, "moe_backward %s", cases[i].what);
        check_status(what,
                     sbprt_moe_backward(G, d, d, d, d, d, g, d, d, d, d, di, d, NULL, d, n, dd, e,
                                        k, f, 0, 0.0f),
                     cases[i].want);
        cst = cpuref_sbprt_moe_backward(C, h, h, h, h, h, c, h, h, h, h, (int32_t *)h, h, NULL, h,
                                        n, dd, e, k, f, 0, 0.0f);
        if (cst != cases[i].want)
            fail("%s on the CPU twin returned %d, expected %d", what, cst, cases[i].want);
    }
    check_status("moe_forward n = 0, all NULL",
                 sbprt_moe_forward(G, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                   0, 4, 3, 1, 2, 0),
                 SBPRT_OK);
    check_status("moe_backward n = 0, all NULL",
                 sbprt_moe_backward(G, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                    NULL, NULL, NULL, NULL, 0, 4, 3, 1, 2, 0, 0.0f),
                 SBPRT_OK);
    check_status("moe_forward NULL context",
                 sbprt_moe_forward(NULL, d, d, di, d, NULL, d, d, d, d, d, 2, 4, 3, 1, 2, 0),
                 SBPRT_ERR_INVALID);
    check_status("moe_backward NULL scratch",
                 sbprt_moe_backward(G, d, d, d, d, d, d, d, d, d, d, di, d, NULL, NULL, 2, 4, 3, 1,
                                    2, 0, 0.0f),
                 SBPRT_ERR_INVALID);
    /* no gradient wanted: nothing to do (a valid sel, so the sync stays clean) */
    check_status("sbprt_memset_zero", sbprt_memset_zero(G, d, 4096 * sizeof(float)), SBPRT_OK);
    check_status("moe_backward no outputs",
                 sbprt_moe_backward(G, NULL, NULL, NULL, NULL, d, d, d, d, d, d, di, d, NULL, d,
                                    2, 4, 3, 1, 2, 0, 0.0f),
                 SBPRT_OK);
    check_status("sync after moe errors", sbprt_sync(G), SBPRT_OK);
    sbprt_arena_free(G, d);
    if (nfail != before)
        s->fails++;
}

/* LoRA on the experts (sbprt_moe_lora_forward / _backward) against the twin.  PEFT's layout:
 * a1 [e r, d], b1 [2f, r e], a2 [e r, f], b2 [d, r e], expert i's B in the columns j e + i.
 * B is random, not PEFT's zeros, so every term of the adapters' gradients is exercised.
 * adapt: bit 0 the gate/up adapter, bit 1 the down one; a projection without one still gets
 * (non-NULL) gradient buffers for its factors, which both backends must leave untouched.  A
 * starved expert's tiles of the B gradients are never written (the CUDA scratch starts random,
 * the twin's uninitialised): its columns of db1 / db2 must come out unchanged. */

typedef struct {
    const char *what;
    int n, d, e, k, f, r;
    float scale;
    int adapt;  /* 1: gate/up only, 2: down only, 3: both */
    int starve; /* the last expert receives no rows */
    int norm_topk;
} moe_lora_shape;

enum { ML_DX, ML_DWR, ML_DW1, ML_DW2, ML_DA1, ML_DB1, ML_DA2, ML_DB2, ML_NGRAD };

static void t_moe_lora_shape(const moe_lora_shape *s)
{
    const int n = s->n, d = s->d, e = s->e, k = s->k, f = s->f, r = s->r;
    const size_t nd = (size_t)n * d, ne = (size_t)n * e, nk = (size_t)n * k;
    const size_t nw1 = (size_t)e * 2 * f * d, nw2 = (size_t)e * d * f, nwr = (size_t)e * d;
    const size_t na1 = (size_t)e * r * d, nb1 = (size_t)2 * f * r * e;
    const size_t na2 = (size_t)e * r * f, nb2 = (size_t)d * r * e;
    const size_t nscr = sbprt_moe_lora_scratch_floats(n, d, e, k, f, r);
    const float aux = 0.01f;
    float *x = hrand(nd, -1, 1), *wr = hrand(nwr, -0.5f, 0.5f);
    const float *w1 = hrand(nw1, -0.3f, 0.3f), *w2 = hrand(nw2, -0.3f, 0.3f);
    const float *dy = hrand(nd, -1, 1);
    const float *a1 = s->adapt & 1 ? hrand(na1, -0.3f, 0.3f) : NULL;
    const float *b1 = s->adapt & 1 ? hrand(nb1, -0.3f, 0.3f) : NULL;
    const float *a2 = s->adapt & 2 ? hrand(na2, -0.3f, 0.3f) : NULL;
    const float *b2 = s->adapt & 2 ? hrand(nb2, -0.3f, 0.3f) : NULL;
    if (s->starve) {
        for (int q = 0; q < n; q++)
            x[(size_t)q * d] = 1.0f; /* a constant feature: wr[:, 0] acts as a bias */
        wr[(size_t)(e - 1) * d] = -50.0f;
    }
    float *scr = hnew(nscr * sizeof(float));
    char label[160];
    snprintf(label, sizeof label, "%s: n=%d d=%d e=%d k=%d f=%d r=%d scale=%g", s->what, n, d, e,
             k, f, r, (double)s->scale);
    static const char *adapt_names[] = {"", "gate/up only", "down only", "both"};
    char fname[40], bname[40];
    snprintf(fname, sizeof fname, "moe_lora_forward (%s)", adapt_names[s->adapt]);
    snprintf(bname, sizeof bname, "moe_lora_backward (%s)", adapt_names[s->adapt]);
    kcase K;

    kc_begin(&K, fname, TOL_FP32, "%s", label);
    kstat *sel_st = kstat_get("moe_lora_forward sel (exact)", 0);
    float *dxin = KC_IN_F(&K, x, nd), *dwrin = KC_IN_F(&K, wr, nwr);
    float *dw1in = KC_IN_F(&K, w1, nw1), *dw2in = KC_IN_F(&K, w2, nw2);
    float *da1in = a1 ? KC_IN_F(&K, a1, na1) : NULL, *db1in = b1 ? KC_IN_F(&K, b1, nb1) : NULL;
    float *da2in = a2 ? KC_IN_F(&K, a2, na2) : NULL, *db2in = b2 ? KC_IN_F(&K, b2, nb2) : NULL;
    float *dscr = KC_IN_F(&K, hrand(nscr, -1, 1), nscr);
    obuf *y = kc_out_rand(&K, "y", nd, 0), *probs = kc_out_rand(&K, "probs", ne, 0);
    obuf *wts = kc_out_rand(&K, "wts", nk, 0);
    obuf *stats = kc_out(&K, "stats", hrand(2 * (size_t)e, 0, 3), 2 * (size_t)e, 1);
    int32_t *sel = hnew(nk * sizeof(int32_t)), *gsel = hnew(nk * sizeof(int32_t));
    int32_t *dsel = dnew(nk * sizeof(int32_t));
    REF(cpuref_sbprt_moe_lora_forward(C, y->ref, probs->ref, sel, wts->ref, stats->ref, x, wr, w1,
                                      w2, a1, b1, a2, b2, scr, n, d, e, k, f, s->norm_topk, r,
                                      s->scale));
    float *hprobs = hnew(ne * sizeof(float)), *hwts = hnew(nk * sizeof(float));
    float *hstats = hnew(2 * (size_t)e * sizeof(float)), *yplain = hnew(nd * sizeof(float));
    memcpy(hprobs, probs->ref, ne * sizeof(float));
    memcpy(hwts, wts->ref, nk * sizeof(float));
    memcpy(hstats, stats->ref, 2 * (size_t)e * sizeof(float));
    /* the adapters must move y well beyond the tolerance, or the case tests nothing */
    float *tmp = hnew(ne * sizeof(float) + 2 * nk * sizeof(float));
    REF(cpuref_sbprt_moe_forward(C, yplain, tmp, (int32_t *)(tmp + ne), tmp + ne + nk, NULL, x,
                                 wr, w1, w2, scr, n, d, e, k, f, s->norm_topk));
    if (!(nerr(yplain, y->ref, NULL, nd) > 1e-2))
        fail("moe_lora [%s]: the adapters barely change y (%.3g): a test bug", label,
             nerr(yplain, y->ref, NULL, nd));
    KC_RUN(K, sbprt_moe_lora_forward(G, y->d, probs->d, dsel, wts->d, stats->d, dxin, dwrin,
                                     dw1in, dw2in, da1in, db1in, da2in, db2in, dscr, n, d, e, k,
                                     f, s->norm_topk, r, s->scale));
    download(gsel, dsel, nk * sizeof(int32_t));
    sbprt_arena_free(G, dsel);
    sel_st->cases++;
    if (memcmp(gsel, sel, nk * sizeof(int32_t)) != 0) {
        fail("moe_lora_forward [%s]: sel differs from the CPU twin's", label);
        sel_st->fails++;
    }
    if (s->starve)
        for (size_t q = 0; q < nk; q++)
            if (sel[q] == e - 1) {
                fail("moe_lora [%s]: the starved expert received a row: a test bug", label);
                break;
            }

    /* the backward with subsets of the gradients (a bit per ML_*; NULL where clear), each
     * accumulated into random buffers */
    static const struct {
        const char *name;
        unsigned mask;
    } subsets[] = {
        {"all", 0xff},
        {"adapters only (frozen base, no dx)", 0xf0},
        {"dx and adapters", 1u << ML_DX | 0xf0},
        {"dx only", 1u << ML_DX},
        {"dw1, dw2 only", 1u << ML_DW1 | 1u << ML_DW2},
        {"db1, da2", 1u << ML_DB1 | 1u << ML_DA2},
        {"da1, db2, dwr", 1u << ML_DA1 | 1u << ML_DB2 | 1u << ML_DWR},
        {"da2 only", 1u << ML_DA2},
        {"db2 only", 1u << ML_DB2},
    };
    static const char *gnames[ML_NGRAD] = {"dx", "dwr", "dw1", "dw2", "da1", "db1", "da2", "db2"};
    const size_t gsize[ML_NGRAD] = {nd, nwr, nw1, nw2, na1, nb1, na2, nb2};
    for (size_t v = 0; v < sizeof subsets / sizeof subsets[0]; v++) {
        kc_begin(&K, bname, TOL_FP32, "%s grads=%s", label, subsets[v].name);
        float *ddy = KC_IN_F(&K, dy, nd), *dxi = KC_IN_F(&K, x, nd);
        float *dwri = KC_IN_F(&K, wr, nwr);
        float *dw1i = KC_IN_F(&K, w1, nw1), *dw2i = KC_IN_F(&K, w2, nw2);
        float *da1i = a1 ? KC_IN_F(&K, a1, na1) : NULL, *db1i = b1 ? KC_IN_F(&K, b1, nb1) : NULL;
        float *da2i = a2 ? KC_IN_F(&K, a2, na2) : NULL, *db2i = b2 ? KC_IN_F(&K, b2, nb2) : NULL;
        float *dpr = KC_IN_F(&K, hprobs, ne), *dwt = KC_IN_F(&K, hwts, nk);
        int32_t *dsl = KC_IN_I(&K, sel, nk);
        float *dst = KC_IN_F(&K, hstats, 2 * (size_t)e);
        float *dscr2 = KC_IN_F(&K, hrand(nscr, -1, 1), nscr);
        obuf *g[ML_NGRAD];
        float *gr[ML_NGRAD], *gd[ML_NGRAD];
        for (int q = 0; q < ML_NGRAD; q++) {
            g[q] = subsets[v].mask >> q & 1 ? kc_out_rand(&K, gnames[q], gsize[q], 1) : NULL;
            gr[q] = g[q] ? g[q]->ref : NULL;
            gd[q] = g[q] ? g[q]->d : NULL;
        }
        REF(cpuref_sbprt_moe_lora_backward(C, gr[ML_DX], gr[ML_DWR], gr[ML_DW1], gr[ML_DW2],
                                           gr[ML_DA1], gr[ML_DB1], gr[ML_DA2], gr[ML_DB2], dy, x,
                                           wr, w1, w2, a1, b1, a2, b2, hprobs, sel, hwts, hstats,
                                           scr, n, d, e, k, f, s->norm_topk, aux, r, s->scale));
        /* a projection without an adapter: its factors' gradients are left as they were */
        for (int q = ML_DA1; q < ML_NGRAD; q++)
            if (g[q] && !(s->adapt >> ((q - ML_DA1) / 2) & 1) &&
                memcmp(g[q]->ref, g[q]->h0, gsize[q] * sizeof(float)) != 0)
                fail("moe_lora_backward [%s]: the twin wrote %s of a missing adapter", label,
                     gnames[q]);
        /* the starved expert's columns of db1 / db2 are left as they were (on the twin; the
         * comparison then checks the CUDA backend) */
        for (int q = ML_DB1; q < ML_NGRAD; q += 2)
            if (s->starve && g[q])
                for (size_t t = (size_t)e - 1; t < gsize[q]; t += (size_t)e)
                    if (g[q]->ref[t] != g[q]->h0[t]) {
                        fail("moe_lora_backward [%s]: the twin wrote the starved expert's %s",
                             label, gnames[q]);
                        break;
                    }
        KC_RUN(K, sbprt_moe_lora_backward(G, gd[ML_DX], gd[ML_DWR], gd[ML_DW1], gd[ML_DW2],
                                          gd[ML_DA1], gd[ML_DB1], gd[ML_DA2], gd[ML_DB2], ddy,
                                          dxi, dwri, dw1i, dw2i, da1i, db1i, da2i, db2i, dpr, dsl,
                                          dwt, dst, dscr2, n, d, e, k, f, s->norm_topk, aux, r,
                                          s->scale));
    }
}

/* The adapters' argument errors: the same status from both backends, found before anything
 * runs (so one buffer can stand for every tensor; it is never read). */
static void t_moe_lora_errors(void)
{
    kstat *s = kstat_get("moe_lora argument errors", 0);
    s->cases++;
    const int before = nfail;
    const int dd = 4, e = 3, k = 1, f = 2;
    float *d = dnew(4096 * sizeof(float));
    int32_t *di = (int32_t *)d;
    static float h[4096];
    static const struct {
        const char *what;
        int a1, b1, a2, b2, n, r, want;
    } cases[] = {
        {"a1 without b1", 1, 0, 0, 0, 2, 2, SBPRT_ERR_INVALID},
        {"b2 without a2", 0, 0, 0, 1, 2, 2, SBPRT_ERR_INVALID},
        {"adapters with r = 0", 1, 1, 1, 1, 2, 0, SBPRT_ERR_INVALID},
        {"an adapter with r < 0", 0, 0, 1, 1, 2, -1, SBPRT_ERR_INVALID},
        {"n = 0, a1 without b1", 1, 0, 0, 0, 0, 2, SBPRT_ERR_INVALID},
        {"n = 0, adapters with r = 0", 1, 1, 0, 0, 0, 0, SBPRT_ERR_INVALID},
        {"n = 0, adapters", 1, 1, 1, 1, 0, 2, SBPRT_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const float *ga1 = cases[i].a1 ? d : NULL, *gb1 = cases[i].b1 ? d : NULL;
        const float *ga2 = cases[i].a2 ? d : NULL, *gb2 = cases[i].b2 ? d : NULL;
        const float *ca1 = cases[i].a1 ? h : NULL, *cb1 = cases[i].b1 ? h : NULL;
        const float *ca2 = cases[i].a2 ? h : NULL, *cb2 = cases[i].b2 ? h : NULL;
        const int n = cases[i].n, r = cases[i].r;
        char what[96];
        snprintf(what, sizeof what, "moe_lora_forward %s", cases[i].what);
        check_status(what,
                     sbprt_moe_lora_forward(G, d, d, di, d, NULL, d, d, d, d, ga1, gb1, ga2, gb2,
                                            d, n, dd, e, k, f, 1, r, 1.0f),
                     cases[i].want);
        int cst = cpuref_sbprt_moe_lora_forward(C, h, h, (int32_t *)h, h, NULL, h, h, h, h, ca1,
                                                cb1, ca2, cb2, h, n, dd, e, k, f, 1, r, 1.0f);
        if (cst != cases[i].want)
            fail("%s on the CPU twin returned %d, expected %d", what, cst, cases[i].want);
        snprintf(what, sizeof what, "moe_lora_backward %s", cases[i].what);
        check_status(what,
                     sbprt_moe_lora_backward(G, d, d, d, d, d, d, d, d, d, d, d, d, d, ga1, gb1,
                                             ga2, gb2, d, di, d, NULL, d, n, dd, e, k, f, 0, 0.0f,
                                             r, 1.0f),
                     cases[i].want);
        cst = cpuref_sbprt_moe_lora_backward(C, h, h, h, h, h, h, h, h, h, h, h, h, h, ca1, cb1,
                                             ca2, cb2, h, (int32_t *)h, h, NULL, h, n, dd, e, k,
                                             f, 0, 0.0f, r, 1.0f);
        if (cst != cases[i].want)
            fail("%s on the CPU twin returned %d, expected %d", what, cst, cases[i].want);
    }
    check_status("sync after moe_lora errors", sbprt_sync(G), SBPRT_OK);
    sbprt_arena_free(G, d);
    if (nfail != before)
        s->fails++;
}

static void t_moe(void)
{
    static const moe_shape quick_shapes[] = {
        {"k=2", 37, 24, 6, 2, 20, 1, 1, 0.01f, 0, 0, 1},
        {"k=1, stats NULL", 29, 16, 5, 1, 12, 0, 0, 0.5f, 0, 0, 1},
        {"starved expert", 23, 20, 4, 2, 8, 0, 1, 0.02f, 1, 0, 0},
        {"ties", 17, 12, 7, 3, 16, 1, 1, -0.03f, 0, 1, 0},
        {"one row, k = e", 1, 8, 3, 3, 4, 1, 1, 0.1f, 0, 0, 0},
        {"rows > sort threads, starved expert", 301, 8, 4, 2, 4, 1, 1, 0.01f, 1, 0, 0},
    };
    static const moe_shape full_shapes[] = {
        {"k=2", 1000, 256, 8, 2, 512, 1, 1, 0.01f, 0, 0, 1},
        {"k=1, stats NULL", 777, 128, 16, 1, 256, 0, 0, 0.5f, 0, 0, 1},
        {"starved expert", 513, 192, 8, 2, 320, 0, 1, 0.02f, 1, 0, 0},
        {"ties", 300, 64, 7, 3, 96, 1, 1, -0.03f, 0, 1, 0},
        {"one row, k = e", 1, 64, 4, 4, 32, 1, 1, 0.1f, 0, 0, 0},
        {"Qwen3-like", 2048, 512, 64, 8, 128, 1, 1, 0.001f, 0, 0, 0},
    };
    const moe_shape *shapes = quick ? quick_shapes : full_shapes;
    const size_t ns = quick ? sizeof quick_shapes / sizeof quick_shapes[0]
                            : sizeof full_shapes / sizeof full_shapes[0];
    for (size_t i = 0; i < ns; i++)
        t_moe_shape(&shapes[i]);
    t_moe_errors();
    hfree_all();

    static const moe_lora_shape lora_quick[] = {
        {"both adapters, k=2", 37, 24, 6, 2, 20, 4, 2.0f, 3, 0, 1},
        {"gate/up adapter, starved expert", 23, 20, 4, 2, 8, 3, 0.5f, 1, 1, 0},
        {"down adapter, k=1", 29, 16, 5, 1, 12, 5, 1.5f, 2, 0, 0},
        {"both, rows > sort threads, starved", 301, 8, 4, 2, 4, 2, 4.0f, 3, 1, 1},
    };
    static const moe_lora_shape lora_full[] = {
        {"both adapters, k=2", 1000, 256, 8, 2, 512, 16, 2.0f, 3, 0, 1},
        {"gate/up adapter, starved expert", 513, 192, 8, 2, 320, 8, 0.5f, 1, 1, 0},
        {"down adapter, k=1", 777, 128, 16, 1, 256, 4, 1.5f, 2, 0, 0},
        {"Qwen3-like, both", 2048, 512, 64, 8, 128, 8, 2.0f, 3, 0, 1},
    };
    const moe_lora_shape *ls = quick ? lora_quick : lora_full;
    const size_t nls = quick ? sizeof lora_quick / sizeof lora_quick[0]
                             : sizeof lora_full / sizeof lora_full[0];
    for (size_t i = 0; i < nls; i++) {
        t_moe_lora_shape(&ls[i]);
        hfree_all();
    }
    t_moe_lora_errors();
    hfree_all();
}

/* ---- optimizers --------------------------------------------------------------------------- */
/* Exact: the updates are the CPU twin's operation by operation (no fused multiply-adds), so
 * that --offload optimizer (AdamW on the host for a device step) trains as the device does. */

/* The multi-tensor forms against the CPU twin's per-tensor calls, one per span: bitwise (the
 * spans overlap nowhere, one is empty, one spans two partials of the norm, and the three
 * blocks' offsets differ). The norm also against the device's own per-tensor loop. */
static void t_optim_multi(void)
{
    const size_t n = 20000;
    const sbprt_span sp[] = {{0, 0, 0, 1000},
                             {1000, 1500, 1000, 0},
                             {1000, 1200, 1000, 9000},
                             {10000, 10300, 10000, 200},
                             {12000, 12000, 12000, 8000}};
    const int ns = (int)(sizeof sp / sizeof sp[0]);
    const float *param = hrand(n, -1, 1), *grad = hrand(n, -1, 1);
    const float *m = hrand(n, -0.1f, 0.1f), *v = hrand(n, 0.001f, 0.01f);
    kcase K;
    for (int wd = 0; wd < 2; wd++) {
        kc_begin(&K, "sgd_update_multi (exact)", 0, "spans=%d wd=%d", ns, wd);
        float *dg = KC_IN_F(&K, grad, n);
        obuf *p = kc_out(&K, "param", param, n, 1);
        for (int i = 0; i < ns; i++)
            REF(cpuref_sbprt_sgd_update(C, p->ref + sp[i].param, grad + sp[i].grad, sp[i].n, 0.05,
                                        wd ? 0.1 : 0.0));
        KC_RUN(K, sbprt_sgd_update_multi(G, p->d, dg, sp, ns, 0.05, wd ? 0.1 : 0.0));
    }
    for (int step = 1; step <= 3; step += 2) {
        kc_begin(&K, "adamw_update_multi (exact)", 0, "spans=%d step=%d", ns, step);
        float *dg = KC_IN_F(&K, grad, n);
        obuf *p = kc_out(&K, "param", param, n, 1);
        obuf *mo = kc_out(&K, "m", m, n, 1), *vo = kc_out(&K, "v", v, n, 1);
        for (int i = 0; i < ns; i++)
            REF(cpuref_sbprt_adamw_update(C, p->ref + sp[i].param, mo->ref + sp[i].state,
                                          vo->ref + sp[i].state, grad + sp[i].grad, sp[i].n, 0.05,
                                          0.9, 0.999, 1e-8, 0.01, step));
        KC_RUN(K, sbprt_adamw_update_multi(G, p->d, mo->d, vo->d, dg, sp, ns, 0.05, 0.9, 0.999,
                                           1e-8, 0.01, step));
    }
    kc_begin(&K, "scale_multi (exact)", 0, "spans=%d", ns);
    obuf *g = kc_out(&K, "grads", grad, n, 1);
    for (int i = 0; i < ns; i++)
        REF(cpuref_sbprt_scale(C, g->ref + sp[i].grad, g->ref + sp[i].grad, sp[i].n, 0.375f));
    KC_RUN(K, sbprt_scale_multi(G, g->d, sp, ns, 0.375f));

    /* the norm: host doubles, compared directly */
    kc_begin(&K, "grad_sq_norm_multi", TOL_FP32, "spans=%d", ns);
    float *dg = KC_IN_F(&K, grad, n);
    double got = 0, loop = 0, ref = 0;
    int st = SBPRT_OK;
    for (int i = 0; i < ns && !st; i++)
        if (!(st = cpuref_sbprt_grad_sq_norm(C, &ref, grad + sp[i].grad, sp[i].n)))
            st = sbprt_grad_sq_norm(G, &loop, dg + sp[i].grad, sp[i].n);
    if (!st)
        st = sbprt_grad_sq_norm_multi(G, &got, dg, sp, ns);
    if (st || got != loop || !(fabs(got - ref) <= 1e-12 * fabs(ref)))
        fail("grad_sq_norm_multi: status %s, %.17g against the per-tensor loop's %.17g and the "
             "CPU twin's %.17g", sbprt_status_string(st), got, loop, ref);
    /* the same list again reuses the device table; a changed one rebuilds it */
    double again = 0, shorter = 0, shorter_loop = 0;
    if (!st)
        st = sbprt_grad_sq_norm_multi(G, &again, dg, sp, ns);
    if (!st)
        st = sbprt_grad_sq_norm_multi(G, &shorter, dg, sp, 2);
    for (int i = 0; i < 2 && !st; i++)
        st = sbprt_grad_sq_norm(G, &shorter_loop, dg + sp[i].grad, sp[i].n);
    if (st || again != got || shorter != shorter_loop)
        fail("grad_sq_norm_multi again: status %s, %.17g then %.17g; two spans %.17g against "
             "%.17g", sbprt_status_string(st), got, again, shorter, shorter_loop);
    kc_finish(&K, 0);
    hfree_all();
}

static void t_optim(void)
{
    const size_t n = quick ? 3001 : ((size_t)1 << 22) + 1;
    const float *param = hrand(n, -1, 1), *grad = hrand(n, -1, 1);
    const float *m = hrand(n, -0.1f, 0.1f), *v = hrand(n, 0.001f, 0.01f);
    kcase K;

    for (int wd = 0; wd < 2; wd++) {
        kc_begin(&K, "sgd_update (exact)", 0, "n=%zu wd=%d", n, wd);
        float *dg = KC_IN_F(&K, grad, n);
        obuf *p = kc_out(&K, "param", param, n, 1);
        REF(cpuref_sbprt_sgd_update(C, p->ref, grad, n, 0.05, wd ? 0.1 : 0.0));
        KC_RUN(K, sbprt_sgd_update(G, p->d, dg, n, 0.05, wd ? 0.1 : 0.0));
    }
    const int steps[] = {1, 3, 1000};
    for (int i = 0; i < 3; i++) {
        kc_begin(&K, "adamw_update (exact)", 0, "n=%zu step=%d", n, steps[i]);
        float *dg = KC_IN_F(&K, grad, n);
        obuf *p = kc_out(&K, "param", param, n, 1);
        obuf *mo = kc_out(&K, "m", m, n, 1), *vo = kc_out(&K, "v", v, n, 1);
        REF(cpuref_sbprt_adamw_update(C, p->ref, mo->ref, vo->ref, grad, n, 0.05, 0.9, 0.999, 1e-8,
                                      0.01, steps[i]));
        KC_RUN(K, sbprt_adamw_update(G, p->d, mo->d, vo->d, dg, n, 0.05, 0.9, 0.999, 1e-8, 0.01,
                                     steps[i]));
    }
    hfree_all();
    t_optim_multi();
}

/* ---- layout and broadcasting -------------------------------------------------------------- */

static size_t count_of(int rank, const int *dims)
{
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)dims[i];
    return n;
}

static void t_permute_one(int rank, const int *dims, const int *perm)
{
    const size_t n = count_of(rank, dims);
    const float *x = hrand(n, -1, 1);
    kcase K;
    kc_begin(&K, "permute_forward", TOL_FP32, "rank=%d n=%zu", rank, n);
    float *dx = KC_IN_F(&K, x, n);
    obuf *out = kc_out_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_permute_forward(C, out->ref, x, rank, dims, perm));
    KC_RUN(K, sbprt_permute_forward(G, out->d, dx, rank, dims, perm));

    kc_begin(&K, "permute_backward", TOL_FP32, "rank=%d n=%zu", rank, n);
    float *ddo = KC_IN_F(&K, x, n);
    obuf *g = kc_out_rand(&K, "dx", n, 1);
    REF(cpuref_sbprt_permute_backward(C, g->ref, x, rank, dims, perm));
    KC_RUN(K, sbprt_permute_backward(G, g->d, ddo, rank, dims, perm));
}

static void t_bcast_one(int rank, const int *dims, const int *ad, const int *bd)
{
    const size_t n = count_of(rank, dims), na = count_of(rank, ad), nb = count_of(rank, bd);
    const float *a = hrand(na, -1, 1), *b = hrand(nb, 0.5f, 1.5f), *dout = hrand(n, -1, 1);
    static const char *ops[] = {"add", "sub", "mul", "div"};
    for (int op = SBPRT_BIN_ADD; op <= SBPRT_BIN_DIV; op++) {
        kcase K;
        kc_begin(&K, "broadcast_forward", TOL_FP32, "rank=%d n=%zu %s", rank, n, ops[op]);
        float *da = KC_IN_F(&K, a, na), *db = KC_IN_F(&K, b, nb);
        obuf *out = kc_out_rand(&K, "out", n, 0);
        REF(cpuref_sbprt_broadcast_forward(C, out->ref, a, b, op, rank, dims, ad, bd));
        KC_RUN(K, sbprt_broadcast_forward(G, out->d, da, db, op, rank, dims, ad, bd));

        for (int which = 0; which < 2; which++) { /* both gradients; da only */
            kc_begin(&K, "broadcast_backward", TOL_FP32, "rank=%d n=%zu %s%s", rank, n, ops[op],
                     which ? " da only" : "");
            da = KC_IN_F(&K, a, na);
            db = KC_IN_F(&K, b, nb);
            float *ddo = KC_IN_F(&K, dout, n);
            obuf *ga = kc_out_rand(&K, "da", na, 1);
            obuf *gb = which == 0 ? kc_out_rand(&K, "db", nb, 1) : NULL;
            REF(cpuref_sbprt_broadcast_backward(C, ga->ref, gb ? gb->ref : NULL, dout, a, b, op,
                                                rank, dims, ad, bd));
            KC_RUN(K, sbprt_broadcast_backward(G, ga->d, gb ? gb->d : NULL, ddo, da, db, op, rank,
                                               dims, ad, bd));
        }
    }
}

static void t_extra(void)
{
    {
        const int d4[] = {quick ? 2 : 8, quick ? 5 : 64, quick ? 3 : 12, quick ? 7 : 64};
        const int p4[] = {0, 2, 1, 3};
        t_permute_one(4, d4, p4);
        const int d3[] = {5, 7, 9}, p3[] = {2, 0, 1};
        t_permute_one(3, d3, p3);
        const int d1[] = {100}, p1[] = {0};
        t_permute_one(1, d1, p1);
        t_permute_one(0, NULL, NULL);
    }
    {
        const int rows = quick ? 13 : 4096;
        const int w = quick ? 6 : 256, dld = quick ? 20 : 1024, doff = quick ? 9 : 512;
        const int sld = quick ? 11 : 768, soff = quick ? 3 : 100;
        const float *src = hrand((size_t)rows * sld, -1, 1);
        for (int acc = 0; acc < 2; acc++) {
            kcase K;
            kc_begin(&K, "copy_cols", TOL_FP32, "rows=%d w=%d%s", rows, w,
                     acc ? " accumulate" : "");
            float *ds = KC_IN_F(&K, src, (size_t)rows * sld);
            obuf *dst = kc_out_rand(&K, "dst", (size_t)rows * dld, 0);
            REF(cpuref_sbprt_copy_cols(C, dst->ref, src, rows, w, dld, doff, sld, soff, acc));
            KC_RUN(K, sbprt_copy_cols(G, dst->d, ds, rows, w, dld, doff, sld, soff, acc));
        }
    }
    {
        const int o1[] = {quick ? 3 : 8, quick ? 5 : 128, quick ? 70 : 768};
        const int a1[] = {o1[0], o1[1], o1[2]}, b1[] = {1, 1, o1[2]};
        t_bcast_one(3, o1, a1, b1); /* bias-like */
        const int o2[] = {4, 6, 16, 8}, a2[] = {4, 1, 16, 1}, b2[] = {1, 6, 1, 8};
        t_bcast_one(4, o2, a2, b2); /* both broadcast */
        const int o3[] = {quick ? 300 : 100000}, a3[] = {o3[0]}, b3[] = {1};
        t_bcast_one(1, o3, a3, b3); /* scalar operand, many terms */
        t_bcast_one(0, NULL, NULL, NULL);
    }
    hfree_all();
}

/* ---- bf16 (the *_bf16 entry points against their CPU twins, runtime/cpu/bf16.c) ----------
 * Inputs are random bf16 values (never zeros), outputs compared as the fp32 values they stand
 * for, against TOL_BF16: both sides compute in fp32 from the same bf16 inputs and round once,
 * so they differ only where a different fp32 summation order moves a value across a bf16
 * rounding boundary. */

static void t_bf16_gemm(void)
{
    const int m = quick ? 33 : 384, n = quick ? 17 : 512, k = quick ? 29 : 640;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int f32 = 0; f32 < 2; f32++) {
                const int mm = f32 && !quick ? 1024 : m, kk = f32 && !quick ? 256 : k;
                kcase K;
                kc_begin(&K, f32 ? "gemm_bf16_f32" : "gemm_bf16", TOL_BF16,
                         "m=%d n=%d k=%d ta=%d tb=%d", mm, n, kk, ta, tb);
                const sbprt_bf16 *a = hrand_bf((size_t)mm * kk, -1, 1);
                const sbprt_bf16 *b = hrand_bf((size_t)kk * n, -1, 1);
                sbprt_bf16 *da = KC_IN_B(&K, a, (size_t)mm * kk);
                sbprt_bf16 *db = KC_IN_B(&K, b, (size_t)kk * n);
                if (f32) { /* a weight gradient: accumulated into fp32 */
                    obuf *c = kc_out_rand(&K, "c", (size_t)mm * n, 1);
                    REF(cpuref_sbprt_gemm_bf16_f32(C, c->ref, a, b, ta, tb, mm, n, kk, 1.0f, 1.0f));
                    KC_RUN(K, sbprt_gemm_bf16_f32(G, c->d, da, db, ta, tb, mm, n, kk, 1.0f, 1.0f));
                } else {
                    obuf *c = kc_out_bf_rand(&K, "c", (size_t)mm * n, 0);
                    REF(cpuref_sbprt_gemm_bf16(C, BREF(c), a, b, ta, tb, mm, n, kk, 0.75f, 0.5f));
                    KC_RUN(K, sbprt_gemm_bf16(G, BDEV(c), da, db, ta, tb, mm, n, kk, 0.75f, 0.5f));
                }
            }
    kcase K;
    kc_begin(&K, "gemm_bf16", TOL_BF16, "k=0 beta=0.5"); /* c = beta c; a, b not read */
    const sbprt_bf16 *one = hrand_bf(1, -1, 1);
    sbprt_bf16 *d1 = KC_IN_B(&K, one, 1);
    obuf *c = kc_out_bf_rand(&K, "c", 30, 0);
    REF(cpuref_sbprt_gemm_bf16(C, BREF(c), one, one, 0, 0, 5, 6, 0, 1.0f, 0.5f));
    KC_RUN(K, sbprt_gemm_bf16(G, BDEV(c), d1, d1, 0, 0, 5, 6, 0, 1.0f, 0.5f));
    hfree_all();
}

static void t_bf16_bias_ew(void)
{
    const int bn = quick ? 200 : 4096, bc = quick ? 33 : 768;
    kcase K;
    const float *bias = hrand(bc, -1, 1);
    const sbprt_bf16 *dy = hrand_bf((size_t)bn * bc, -1, 1);
    kc_begin(&K, "bias_add_bf16", TOL_BF16, "n=%d c=%d", bn, bc);
    float *dbias = KC_IN_F(&K, bias, bc);
    obuf *y = kc_out_bf_rand(&K, "y", (size_t)bn * bc, 1);
    REF(cpuref_sbprt_bias_add_bf16(C, BREF(y), bias, bn, bc));
    KC_RUN(K, sbprt_bias_add_bf16(G, BDEV(y), dbias, bn, bc));
    kc_begin(&K, "bias_backward_bf16", TOL_BF16, "n=%d c=%d", bn, bc);
    sbprt_bf16 *ddy = KC_IN_B(&K, dy, (size_t)bn * bc);
    obuf *db = kc_out_rand(&K, "dbias", bc, 1);
    REF(cpuref_sbprt_bias_backward_bf16(C, db->ref, dy, bn, bc));
    KC_RUN(K, sbprt_bias_backward_bf16(G, db->d, ddy, bn, bc));

    const size_t n = quick ? 9001 : ((size_t)1 << 22) + 3;
    const sbprt_bf16 *a = hrand_bf(n, -1, 1), *b = hrand_bf(n, -1, 1);
    const sbprt_bf16 *x = hrand_bf(n, -4, 4), *dout = hrand_bf(n, -1, 1);
    kc_begin(&K, "add_bf16", TOL_BF16, "n=%zu", n);
    sbprt_bf16 *da = KC_IN_B(&K, a, n), *dbb = KC_IN_B(&K, b, n);
    obuf *o = kc_out_bf_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_add_bf16(C, BREF(o), a, b, n));
    KC_RUN(K, sbprt_add_bf16(G, BDEV(o), da, dbb, n));
    kc_begin(&K, "accumulate_bf16", TOL_BF16, "n=%zu", n);
    da = KC_IN_B(&K, a, n);
    o = kc_out_bf_rand(&K, "y", n, 1);
    REF(cpuref_sbprt_accumulate_bf16(C, BREF(o), a, n));
    KC_RUN(K, sbprt_accumulate_bf16(G, BDEV(o), da, n));

    typedef int (*sbfn)(sbprt_ctx *, sbprt_bf16 *, const sbprt_bf16 *, size_t, float);
    const struct {
        const char *name;
        sbfn g, c;
        int acc;
        float k;
    } scal[] = {
        {"scale_bf16", sbprt_scale_bf16, cpuref_sbprt_scale_bf16, 0, 30.0f},
        {"scale_accumulate_bf16", sbprt_scale_accumulate_bf16,
         cpuref_sbprt_scale_accumulate_bf16, 1, 30.0f},
        {"div_scalar_bf16", sbprt_div_scalar_bf16, cpuref_sbprt_div_scalar_bf16, 0, 30.0f},
        {"div_scalar_accumulate_bf16", sbprt_div_scalar_accumulate_bf16,
         cpuref_sbprt_div_scalar_accumulate_bf16, 1, 0.7f},
    };
    for (int i = 0; i < 4; i++) {
        kc_begin(&K, scal[i].name, TOL_BF16, "n=%zu c=%g", n, (double)scal[i].k);
        sbprt_bf16 *dx = KC_IN_B(&K, x, n);
        o = kc_out_bf_rand(&K, "out", n, scal[i].acc);
        REF(scal[i].c(C, BREF(o), x, n, scal[i].k));
        KC_RUN(K, scal[i].g(G, BDEV(o), dx, n, scal[i].k));
        if (scal[i].acc)
            continue;
        kc_begin(&K, scal[i].name, TOL_BF16, "n=%zu c=%g in place", n, (double)scal[i].k);
        o = kc_out_bf(&K, "out", x, n, 0);
        REF(scal[i].c(C, BREF(o), BREF(o), n, scal[i].k));
        KC_RUN(K, scal[i].g(G, BDEV(o), BDEV(o), n, scal[i].k));
    }

    typedef int (*ffn)(sbprt_ctx *, sbprt_bf16 *, const sbprt_bf16 *, size_t);
    typedef int (*bfn)(sbprt_ctx *, sbprt_bf16 *, const sbprt_bf16 *, const sbprt_bf16 *, size_t);
    const struct {
        const char *fname, *bname;
        ffn gf, cf;
        bfn gb, cb;
        int saved_out; /* the backward takes the forward's output (as t_activation) */
    } acts[] = {
        {"gelu_tanh_forward_bf16", "gelu_tanh_backward_bf16", sbprt_gelu_tanh_forward_bf16,
         cpuref_sbprt_gelu_tanh_forward_bf16, sbprt_gelu_tanh_backward_bf16,
         cpuref_sbprt_gelu_tanh_backward_bf16, 0},
        {"gelu_erf_forward_bf16", "gelu_erf_backward_bf16", sbprt_gelu_erf_forward_bf16,
         cpuref_sbprt_gelu_erf_forward_bf16, sbprt_gelu_erf_backward_bf16,
         cpuref_sbprt_gelu_erf_backward_bf16, 0},
        {"silu_forward_bf16", "silu_backward_bf16", sbprt_silu_forward_bf16,
         cpuref_sbprt_silu_forward_bf16, sbprt_silu_backward_bf16,
         cpuref_sbprt_silu_backward_bf16, 0},
        {"relu_forward_bf16", "relu_backward_bf16", sbprt_relu_forward_bf16,
         cpuref_sbprt_relu_forward_bf16, sbprt_relu_backward_bf16,
         cpuref_sbprt_relu_backward_bf16, 0},
        {"tanh_forward_bf16", "tanh_backward_bf16", sbprt_tanh_forward_bf16,
         cpuref_sbprt_tanh_forward_bf16, sbprt_tanh_backward_bf16,
         cpuref_sbprt_tanh_backward_bf16, 1},
    };
    const sbprt_bf16 *ysaved = hrand_bf(n, -1, 1); /* tanh's saved output: in (-1, 1) */
    for (int i = 0; i < (int)(sizeof acts / sizeof acts[0]); i++) {
        kc_begin(&K, acts[i].fname, TOL_BF16, "n=%zu", n);
        sbprt_bf16 *dx = KC_IN_B(&K, x, n);
        o = kc_out_bf_rand(&K, "out", n, 0);
        REF(acts[i].cf(C, BREF(o), x, n));
        KC_RUN(K, acts[i].gf(G, BDEV(o), dx, n));
        kc_begin(&K, acts[i].fname, TOL_BF16, "n=%zu in place", n);
        o = kc_out_bf(&K, "out", x, n, 0);
        REF(acts[i].cf(C, BREF(o), BREF(o), n));
        KC_RUN(K, acts[i].gf(G, BDEV(o), BDEV(o), n));
        const sbprt_bf16 *saved = acts[i].saved_out ? ysaved : x;
        kc_begin(&K, acts[i].bname, TOL_BF16, "n=%zu", n);
        dx = KC_IN_B(&K, saved, n);
        sbprt_bf16 *ddo = KC_IN_B(&K, dout, n);
        o = kc_out_bf_rand(&K, "dx", n, 1);
        REF(acts[i].cb(C, BREF(o), dout, saved, n));
        KC_RUN(K, acts[i].gb(G, BDEV(o), ddo, dx, n));
    }
    kc_begin(&K, "swiglu_forward_bf16", TOL_BF16, "n=%zu", n);
    sbprt_bf16 *dg = KC_IN_B(&K, x, n), *du = KC_IN_B(&K, b, n);
    o = kc_out_bf_rand(&K, "out", n, 0);
    REF(cpuref_sbprt_swiglu_forward_bf16(C, BREF(o), x, b, n));
    KC_RUN(K, sbprt_swiglu_forward_bf16(G, BDEV(o), dg, du, n));
    kc_begin(&K, "swiglu_backward_bf16", TOL_BF16, "n=%zu", n);
    dg = KC_IN_B(&K, x, n);
    du = KC_IN_B(&K, b, n);
    sbprt_bf16 *ddo = KC_IN_B(&K, dout, n);
    obuf *g1 = kc_out_bf_rand(&K, "dgate", n, 1), *g2 = kc_out_bf_rand(&K, "dup", n, 1);
    REF(cpuref_sbprt_swiglu_backward_bf16(C, BREF(g1), BREF(g2), dout, x, b, n));
    KC_RUN(K, sbprt_swiglu_backward_bf16(G, BDEV(g1), BDEV(g2), ddo, dg, du, n));

    const float *f = hrand(n, -3, 3);
    kc_begin(&K, "convert_f32_to_bf16", TOL_BF16, "n=%zu", n);
    float *df = KC_IN_F(&K, f, n);
    o = kc_out_bf_rand(&K, "dst", n, 0);
    REF(cpuref_sbprt_convert_f32_to_bf16(C, BREF(o), f, n));
    KC_RUN(K, sbprt_convert_f32_to_bf16(G, BDEV(o), df, n));
    kc_begin(&K, "convert_bf16_to_f32", TOL_BF16, "n=%zu", n);
    da = KC_IN_B(&K, a, n);
    o = kc_out_rand(&K, "dst", n, 0);
    REF(cpuref_sbprt_convert_bf16_to_f32(C, o->ref, a, n));
    KC_RUN(K, sbprt_convert_bf16_to_f32(G, o->d, da, n));
    hfree_all();
}

static void t_bf16_rows(void)
{
    kcase K;
    /* embedding */
    const int n = quick ? 61 : 4096, v = quick ? 30 : 50257, c = quick ? 70 : 768;
    int32_t *ids = hnew((size_t)n * sizeof(int32_t));
    for (int r = 0; r < n; r++)
        ids[r] = r % 3 == 0 ? rng_int(16) : rng_int(v);
    const float *table = hrand((size_t)v * c, -1, 1);
    const sbprt_bf16 *dout = hrand_bf((size_t)n * c, -1, 1);
    kc_begin(&K, "embedding_forward_bf16", TOL_BF16, "n=%d v=%d c=%d", n, v, c);
    float *dt = KC_IN_F(&K, table, (size_t)v * c);
    int32_t *di = KC_IN_I(&K, ids, n);
    obuf *o = kc_out_bf_rand(&K, "out", (size_t)n * c, 0);
    REF(cpuref_sbprt_embedding_forward_bf16(C, BREF(o), table, ids, n, v, c));
    KC_RUN(K, sbprt_embedding_forward_bf16(G, BDEV(o), dt, di, n, v, c));
    /* a table kept as bf16 (sbpc --base-precision bf16): its rows copied, bit for bit */
    const sbprt_bf16 *btable = hrand_bf((size_t)v * c, -1, 1);
    kc_begin(&K, "embedding_forward_bf16_table (exact)", 0, "n=%d v=%d c=%d", n, v, c);
    sbprt_bf16 *dbtab = KC_IN_B(&K, btable, (size_t)v * c);
    di = KC_IN_I(&K, ids, n);
    o = kc_out_bf_rand(&K, "out", (size_t)n * c, 0);
    REF(cpuref_sbprt_embedding_forward_bf16_table(C, BREF(o), btable, ids, n, v, c));
    KC_RUN(K, sbprt_embedding_forward_bf16_table(G, BDEV(o), dbtab, di, n, v, c));
    kc_begin(&K, "embedding_backward_bf16", TOL_BF16, "n=%d v=%d c=%d", n, v, c);
    sbprt_bf16 *ddo = KC_IN_B(&K, dout, (size_t)n * c);
    di = KC_IN_I(&K, ids, n);
    o = kc_out_rand(&K, "dtable", (size_t)v * c, 1);
    REF(cpuref_sbprt_embedding_backward_bf16(C, o->ref, dout, ids, n, v, c));
    KC_RUN(K, sbprt_embedding_backward_bf16(G, o->d, ddo, di, n, v, c));
    hfree_all();

    /* norms */
    const int nn = quick ? 70 : 4096, nc = quick ? 33 : 1024;
    const float eps = 1e-5f;
    const sbprt_bf16 *x = hrand_bf((size_t)nn * nc, -2, 3), *dy = hrand_bf((size_t)nn * nc, -1, 1);
    const float *gamma = hrand(nc, 0.5f, 1.5f), *beta = hrand(nc, -1, 1);
    float *mean = hnew((size_t)nn * sizeof(float)), *rstd = hnew((size_t)nn * sizeof(float));
    sbprt_bf16 *tmp = hnew((size_t)nn * nc * sizeof(sbprt_bf16));
    REF(cpuref_sbprt_layernorm_forward_bf16(C, tmp, mean, rstd, x, gamma, beta, nn, nc, eps));
    kc_begin(&K, "layernorm_forward_bf16", TOL_BF16, "n=%d c=%d", nn, nc);
    sbprt_bf16 *dx = KC_IN_B(&K, x, (size_t)nn * nc);
    float *dgm = KC_IN_F(&K, gamma, nc), *dbt = KC_IN_F(&K, beta, nc);
    o = kc_out_bf_rand(&K, "out", (size_t)nn * nc, 0);
    obuf *mo = kc_out_rand(&K, "mean", nn, 0), *ro = kc_out_rand(&K, "rstd", nn, 0);
    REF(cpuref_sbprt_layernorm_forward_bf16(C, BREF(o), mo->ref, ro->ref, x, gamma, beta, nn, nc,
                                            eps));
    KC_RUN(K, sbprt_layernorm_forward_bf16(G, BDEV(o), mo->d, ro->d, dx, dgm, dbt, nn, nc, eps));
    kc_begin(&K, "layernorm_backward_bf16", TOL_BF16, "n=%d c=%d", nn, nc);
    dx = KC_IN_B(&K, x, (size_t)nn * nc);
    sbprt_bf16 *ddy = KC_IN_B(&K, dy, (size_t)nn * nc);
    dgm = KC_IN_F(&K, gamma, nc);
    float *dm = KC_IN_F(&K, mean, nn), *dr = KC_IN_F(&K, rstd, nn);
    obuf *gx = kc_out_bf_rand(&K, "dx", (size_t)nn * nc, 1);
    obuf *gg = kc_out_rand(&K, "dgamma", nc, 1), *gb = kc_out_rand(&K, "dbeta", nc, 1);
    REF(cpuref_sbprt_layernorm_backward_bf16(C, BREF(gx), gg->ref, gb->ref, dy, x, gamma, mean,
                                             rstd, nn, nc));
    KC_RUN(K, sbprt_layernorm_backward_bf16(G, BDEV(gx), gg->d, gb->d, ddy, dx, dgm, dm, dr, nn,
                                            nc));
    REF(cpuref_sbprt_rmsnorm_forward_bf16(C, tmp, rstd, x, gamma, nn, nc, eps));
    kc_begin(&K, "rmsnorm_forward_bf16", TOL_BF16, "n=%d c=%d", nn, nc);
    dx = KC_IN_B(&K, x, (size_t)nn * nc);
    dgm = KC_IN_F(&K, gamma, nc);
    o = kc_out_bf_rand(&K, "out", (size_t)nn * nc, 0);
    ro = kc_out_rand(&K, "rstd", nn, 0);
    REF(cpuref_sbprt_rmsnorm_forward_bf16(C, BREF(o), ro->ref, x, gamma, nn, nc, eps));
    KC_RUN(K, sbprt_rmsnorm_forward_bf16(G, BDEV(o), ro->d, dx, dgm, nn, nc, eps));
    kc_begin(&K, "rmsnorm_forward_bf16", TOL_BF16, "n=%d c=%d in place", nn, nc);
    dgm = KC_IN_F(&K, gamma, nc);
    o = kc_out_bf(&K, "out", x, (size_t)nn * nc, 0);
    REF(cpuref_sbprt_rmsnorm_forward_bf16(C, BREF(o), NULL, BREF(o), gamma, nn, nc, eps));
    KC_RUN(K, sbprt_rmsnorm_forward_bf16(G, BDEV(o), NULL, BDEV(o), dgm, nn, nc, eps));
    kc_begin(&K, "rmsnorm_backward_bf16", TOL_BF16, "n=%d c=%d", nn, nc);
    dx = KC_IN_B(&K, x, (size_t)nn * nc);
    ddy = KC_IN_B(&K, dy, (size_t)nn * nc);
    dgm = KC_IN_F(&K, gamma, nc);
    dr = KC_IN_F(&K, rstd, nn);
    gx = kc_out_bf_rand(&K, "dx", (size_t)nn * nc, 1);
    gg = kc_out_rand(&K, "dgamma", nc, 1);
    REF(cpuref_sbprt_rmsnorm_backward_bf16(C, BREF(gx), gg->ref, dy, x, gamma, rstd, nn, nc));
    KC_RUN(K, sbprt_rmsnorm_backward_bf16(G, BDEV(gx), gg->d, ddy, dx, dgm, dr, nn, nc));
    hfree_all();

    /* RoPE */
    const int rows = quick ? 9 : 4096, heads = quick ? 3 : 16, hd = quick ? 16 : 128;
    const int rot = quick ? 12 : 128, max_pos = quick ? 40 : 8192;
    const size_t rn = (size_t)rows * heads * hd;
    int32_t *pos = hnew((size_t)rows * sizeof(int32_t));
    for (int r = 0; r < rows; r++)
        pos[r] = rng_int(max_pos);
    const float *cs = hrand((size_t)max_pos * rot, -1, 1), *sn = hrand((size_t)max_pos * rot, -1, 1);
    const sbprt_bf16 *rx = hrand_bf(rn, -1, 1), *rd = hrand_bf(rn, -1, 1);
    for (int bw = 0; bw < 2; bw++) {
        kc_begin(&K, bw ? "rope_backward_bf16" : "rope_forward_bf16", TOL_BF16,
                 "rows=%d heads=%d hd=%d rot=%d", rows, heads, hd, rot);
        int32_t *dp = KC_IN_I(&K, pos, rows);
        float *dc = KC_IN_F(&K, cs, (size_t)max_pos * rot), *ds = KC_IN_F(&K, sn, (size_t)max_pos * rot);
        sbprt_bf16 *din = KC_IN_B(&K, bw ? rd : rx, rn);
        o = kc_out_bf_rand(&K, bw ? "dx" : "out", rn, bw);
        if (bw) {
            REF(cpuref_sbprt_rope_backward_bf16(C, BREF(o), rd, pos, cs, sn, rows, heads, hd, rot,
                                                max_pos));
            KC_RUN(K, sbprt_rope_backward_bf16(G, BDEV(o), din, dp, dc, ds, rows, heads, hd, rot,
                                               max_pos));
        } else {
            REF(cpuref_sbprt_rope_forward_bf16(C, BREF(o), rx, pos, cs, sn, rows, heads, hd, rot,
                                               max_pos));
            KC_RUN(K, sbprt_rope_forward_bf16(G, BDEV(o), din, dp, dc, ds, rows, heads, hd, rot,
                                              max_pos));
        }
    }
    hfree_all();
}

static void t_bf16_attention_shape(att_shape s)
{
    const size_t nq = (size_t)s.b * s.t * s.hq * s.d, nkv = (size_t)s.b * s.tk * s.hkv * s.d;
    const size_t nl = (size_t)s.b * s.hq * s.t;
    const float scale = 1.0f / sqrtf((float)s.d);
    const sbprt_bf16 *q = hrand_bf(nq, -1, 1);
    sbprt_bf16 *k = hrand_bf(nkv, -1, 1), *v = hrand_bf(nkv, -1, 1);
    /* keys the chunk must never read hold NaN */
    for (int bi = 0; bi < s.b; bi++)
        for (int j = 0; j < s.tk; j++)
            for (size_t e = 0; e < (size_t)s.hkv * s.d && att_unread(s, j); e++) {
                k[((size_t)bi * s.tk + j) * s.hkv * s.d + e] = f_to_bf(NAN);
                v[((size_t)bi * s.tk + j) * s.hkv * s.d + e] = f_to_bf(NAN);
            }
    const sbprt_bf16 *dout = hrand_bf(nq, -1, 1);
    sbprt_bf16 *out = hnew(nq * sizeof(sbprt_bf16));
    float *lse = hnew(nl * sizeof(float));
    REF(cpuref_sbprt_attention_forward_ex_bf16(C, out, lse, q, k, v, s.b, s.t, s.tk, s.hq, s.hkv,
                                               s.d, s.q_start, scale, s.window, s.softcap));
    char label[160];
    att_label(label, sizeof label, s);
    kcase K;
    kc_begin(&K, "attention_forward_bf16", TOL_BF16, "%s", label);
    sbprt_bf16 *dq = KC_IN_B(&K, q, nq), *dk = KC_IN_B(&K, k, nkv), *dv = KC_IN_B(&K, v, nkv);
    obuf *o = kc_out_bf_rand(&K, "out", nq, 0), *l = kc_out_rand(&K, "lse", nl, 0);
    REF(cpuref_sbprt_attention_forward_ex_bf16(C, BREF(o), l->ref, q, k, v, s.b, s.t, s.tk, s.hq,
                                               s.hkv, s.d, s.q_start, scale, s.window, s.softcap));
    KC_RUN(K, sbprt_attention_forward_ex_bf16(G, BDEV(o), l->d, dq, dk, dv, s.b, s.t, s.tk, s.hq,
                                              s.hkv, s.d, s.q_start, scale, s.window, s.softcap));
    kc_begin(&K, "attention_backward_bf16", TOL_BF16, "%s", label);
    dq = KC_IN_B(&K, q, nq);
    dk = KC_IN_B(&K, k, nkv);
    dv = KC_IN_B(&K, v, nkv);
    sbprt_bf16 *ddo = KC_IN_B(&K, dout, nq), *dout_ = KC_IN_B(&K, out, nq);
    float *dl = KC_IN_F(&K, lse, nl);
    obuf *gq = kc_out_bf_rand(&K, "dq", nq, 1), *gk = kc_out_bf_rand(&K, "dk", nkv, 1);
    obuf *gv = kc_out_bf_rand(&K, "dv", nkv, 1);
    REF(cpuref_sbprt_attention_backward_ex_bf16(C, BREF(gq), BREF(gk), BREF(gv), dout, q, k, v,
                                                out, lse, s.b, s.t, s.tk, s.hq, s.hkv, s.d,
                                                s.q_start, scale, s.window, s.softcap));
    KC_RUN(K, sbprt_attention_backward_ex_bf16(G, BDEV(gq), BDEV(gk), BDEV(gv), ddo, dq, dk, dv,
                                               dout_, dl, s.b, s.t, s.tk, s.hq, s.hkv, s.d,
                                               s.q_start, scale, s.window, s.softcap));
}

static void t_bf16_attention_loss(void)
{
    static const att_shape full[] = {
        {2, 512, 512, 8, 2, 64, 0, 0, 0},
        {1, 256, 1024, 4, 4, 128, 768, 0, 0},
        {1, 1024, 1024, 16, 8, 128, 0, 0, 0},
        {2, 512, 512, 8, 2, 64, 0, 100, 2.0f},
        {1, 256, 1024, 4, 4, 128, 768, 300, 0},
        {1, 1024, 1024, 16, 8, 128, 0, 256, 50.0f},
    };
    static const att_shape small[] = {
        {1, 40, 40, 2, 1, 16, 0, 0, 0},
        {2, 20, 45, 4, 2, 24, 25, 0, 0},
        {2, 20, 45, 4, 2, 24, 25, 11, 0},
        {1, 40, 40, 2, 1, 16, 0, 7, 1.5f},
        {1, 100, 100, 2, 1, 64, 0, 0, 0}, /* the tensor-core forward's head sizes */
        {2, 70, 150, 4, 2, 128, 80, 40, 3.0f},
    };
    const att_shape *shapes = quick ? small : full;
    const int ns = quick ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    for (int i = 0; i < ns; i++) {
        t_bf16_attention_shape(shapes[i]);
        hfree_all();
    }

    const int n = quick ? 7 : 1024, v = quick ? 1000 : 50257;
    int32_t *labels = hnew((size_t)n * sizeof(int32_t));
    int scored = 0;
    for (int r = 0; r < n; r++) {
        labels[r] = r % 5 == 3 ? SBPRT_IGNORE_INDEX : rng_int(v);
        scored += labels[r] != SBPRT_IGNORE_INDEX;
    }
    const sbprt_bf16 *logits = hrand_bf((size_t)n * v, -6, 6);
    const float scale = 1.0f / (float)scored;
    for (int variant = 0; variant < 3; variant++) { /* separate dlogits; in place; loss only */
        kcase K;
        kc_begin(&K, "cross_entropy_forward_backward_bf16", TOL_BF16, "n=%d v=%d %s", n, v,
                 variant == 0 ? "" : variant == 1 ? "in place" : "loss only");
        int32_t *dlab = KC_IN_I(&K, labels, n);
        float init = 1.5f;
        obuf *loss = kc_out(&K, "loss_sum", &init, 1, 1);
        if (variant == 1) {
            obuf *io = kc_out_bf(&K, "dlogits", logits, (size_t)n * v, 0);
            REF(cpuref_sbprt_cross_entropy_forward_backward_bf16(C, loss->ref, BREF(io), BREF(io),
                                                                 labels, n, v, scale));
            KC_RUN(K, sbprt_cross_entropy_forward_backward_bf16(G, loss->d, BDEV(io), BDEV(io), dlab,
                                                                n, v, scale));
        } else {
            sbprt_bf16 *dlog = KC_IN_B(&K, logits, (size_t)n * v);
            obuf *dl = variant == 0 ? kc_out_bf_rand(&K, "dlogits", (size_t)n * v, 0) : NULL;
            REF(cpuref_sbprt_cross_entropy_forward_backward_bf16(
                C, loss->ref, dl ? BREF(dl) : NULL, logits, labels, n, v, scale));
            KC_RUN(K, sbprt_cross_entropy_forward_backward_bf16(G, loss->d, dl ? BDEV(dl) : NULL,
                                                                dlog, dlab, n, v, scale));
        }
    }
    hfree_all();
}

static void t_bf16_layout(void)
{
    kcase K;
    const int d4[] = {quick ? 2 : 8, quick ? 5 : 64, quick ? 3 : 12, quick ? 7 : 64};
    const int p4[] = {0, 2, 1, 3};
    const size_t n4 = count_of(4, d4);
    const sbprt_bf16 *x = hrand_bf(n4, -1, 1);
    for (int bw = 0; bw < 2; bw++) {
        kc_begin(&K, bw ? "permute_backward_bf16" : "permute_forward_bf16", TOL_BF16, "n=%zu", n4);
        sbprt_bf16 *dx = KC_IN_B(&K, x, n4);
        obuf *o = kc_out_bf_rand(&K, bw ? "dx" : "out", n4, bw);
        if (bw) {
            REF(cpuref_sbprt_permute_backward_bf16(C, BREF(o), x, 4, d4, p4));
            KC_RUN(K, sbprt_permute_backward_bf16(G, BDEV(o), dx, 4, d4, p4));
        } else {
            REF(cpuref_sbprt_permute_forward_bf16(C, BREF(o), x, 4, d4, p4));
            KC_RUN(K, sbprt_permute_forward_bf16(G, BDEV(o), dx, 4, d4, p4));
        }
    }
    const int rows = quick ? 13 : 4096, w = quick ? 6 : 256, dld = quick ? 20 : 1024;
    const int doff = quick ? 9 : 512, sld = quick ? 11 : 768, soff = quick ? 3 : 100;
    const sbprt_bf16 *src = hrand_bf((size_t)rows * sld, -1, 1);
    for (int acc = 0; acc < 2; acc++) {
        kc_begin(&K, "copy_cols_bf16", TOL_BF16, "rows=%d w=%d%s", rows, w, acc ? " accumulate" : "");
        sbprt_bf16 *ds = KC_IN_B(&K, src, (size_t)rows * sld);
        obuf *dst = kc_out_bf_rand(&K, "dst", (size_t)rows * dld, 0);
        REF(cpuref_sbprt_copy_cols_bf16(C, BREF(dst), src, rows, w, dld, doff, sld, soff, acc));
        KC_RUN(K, sbprt_copy_cols_bf16(G, BDEV(dst), ds, rows, w, dld, doff, sld, soff, acc));
    }
    const int od[] = {quick ? 3 : 8, quick ? 5 : 128, quick ? 70 : 768};
    const int ad[] = {od[0], od[1], od[2]}, bd[] = {1, od[1], od[2]};
    const size_t n = count_of(3, od), nb = count_of(3, bd);
    const sbprt_bf16 *a = hrand_bf(n, -1, 1), *b = hrand_bf(nb, 0.5f, 1.5f);
    const sbprt_bf16 *dout = hrand_bf(n, -1, 1);
    for (int op = SBPRT_BIN_ADD; op <= SBPRT_BIN_DIV; op++) {
        kc_begin(&K, "broadcast_forward_bf16", TOL_BF16, "n=%zu op=%d", n, op);
        sbprt_bf16 *da = KC_IN_B(&K, a, n), *db = KC_IN_B(&K, b, nb);
        obuf *o = kc_out_bf_rand(&K, "out", n, 0);
        REF(cpuref_sbprt_broadcast_forward_bf16(C, BREF(o), a, b, op, 3, od, ad, bd));
        KC_RUN(K, sbprt_broadcast_forward_bf16(G, BDEV(o), da, db, op, 3, od, ad, bd));
        kc_begin(&K, "broadcast_backward_bf16", TOL_BF16, "n=%zu op=%d", n, op);
        da = KC_IN_B(&K, a, n);
        db = KC_IN_B(&K, b, nb);
        sbprt_bf16 *ddo = KC_IN_B(&K, dout, n);
        obuf *ga = kc_out_bf_rand(&K, "da", n, 1), *gb = kc_out_bf_rand(&K, "db", nb, 1);
        REF(cpuref_sbprt_broadcast_backward_bf16(C, BREF(ga), BREF(gb), dout, a, b, op, 3, od, ad,
                                                 bd));
        KC_RUN(K, sbprt_broadcast_backward_bf16(G, BDEV(ga), BDEV(gb), ddo, da, db, op, 3, od, ad,
                                                bd));
    }
    hfree_all();
}

/* ---- memory, errors, diagnostics ---------------------------------------------------------- */

static void t_memory(void)
{
    kstat *s = kstat_get("memcpy, memset_zero", 0);
    s->cases++;
    const size_t n = quick ? 1000 : 1 << 20;
    const float *h = hrand(n, -1, 1);
    float *back = hnew(n * sizeof(float));
    float *d1 = dnew(n * sizeof(float)), *d2 = dnew(n * sizeof(float));
    check_status("memcpy H2D", sbprt_memcpy(G, d1, h, n * sizeof(float), SBPRT_COPY_HOST_TO_DEVICE),
                 SBPRT_OK);
    check_status("memcpy D2D",
                 sbprt_memcpy(G, d2, d1, n * sizeof(float), SBPRT_COPY_DEVICE_TO_DEVICE), SBPRT_OK);
    check_status("memcpy D2H", sbprt_memcpy(G, back, d2, n * sizeof(float), SBPRT_COPY_DEVICE_TO_HOST),
                 SBPRT_OK);
    if (memcmp(back, h, n * sizeof(float)) != 0) {
        fail("memcpy round trip differs");
        s->fails++;
    }
    check_status("memset_zero", sbprt_memset_zero(G, d2, n * sizeof(float)), SBPRT_OK);
    check_status("memcpy D2H", sbprt_memcpy(G, back, d2, n * sizeof(float), SBPRT_COPY_DEVICE_TO_HOST),
                 SBPRT_OK);
    for (size_t i = 0; i < n; i++)
        if (back[i] != 0.0f) {
            fail("memset_zero left a nonzero at %zu", i);
            s->fails++;
            break;
        }
    check_status("memcpy bad kind", sbprt_memcpy(G, d2, d1, 4, 7), SBPRT_ERR_INVALID);
    check_status("memcpy 0 bytes", sbprt_memcpy(G, NULL, NULL, 0, SBPRT_COPY_HOST_TO_DEVICE),
                 SBPRT_OK);
    /* device memory: what is in use covers the two buffers, within the capacity */
    size_t used = 0, total = 0;
    check_status("device_memory", sbprt_device_memory(G, &used, &total), SBPRT_OK);
    if (total == 0 || used > total || used < 2 * n * sizeof(float)) {
        fail("device_memory: %zu bytes in use of %zu, with %zu allocated", used, total,
             2 * n * sizeof(float));
        s->fails++;
    }
    check_status("device_memory NULL", sbprt_device_memory(NULL, &used, NULL), SBPRT_ERR_INVALID);
    sbprt_arena_free(G, d1);
    sbprt_arena_free(G, d2);
    sbprt_arena_free(G, NULL);
    hfree_all();
}

/* Each index-taking kernel with one bad index: the call returns SBPRT_OK, the next sync
 * SBPRT_ERR_RANGE, the one after SBPRT_OK. */
static void t_range_errors(void)
{
    kstat *s = kstat_get("index checks (sync -> RANGE)", 0);
    const int n = 4, v = 10, c = 8;
    int32_t ids[4] = {1, 2, 10, 3}, neg[4] = {0, -1, 2, 3};
    int32_t starts[4] = {0, 0, 3, 1}; /* position 3's document start goes back */
    int32_t labels[4] = {1, SBPRT_IGNORE_INDEX, 11, 0};
    const float *h = hrand((size_t)v * c * 4, -1, 1);
    float *buf = dnew((size_t)v * c * 4 * sizeof(float));
    float *buf2 = dnew((size_t)v * c * 4 * sizeof(float));
    float *loss = dnew(sizeof(float));
    upload(buf, h, (size_t)v * c * 4 * sizeof(float));
    upload(buf2, h, (size_t)v * c * 4 * sizeof(float));
    int32_t *d_ids = dnew(sizeof ids), *d_neg = dnew(sizeof neg), *d_lab = dnew(sizeof labels);
    int32_t *d_starts = dnew(sizeof starts), *d_i32 = dnew(sizeof starts);
    upload(d_starts, starts, sizeof starts);
    upload(d_ids, ids, sizeof ids);
    upload(d_neg, neg, sizeof neg);
    upload(d_lab, labels, sizeof labels);
    check_status("sync before", sbprt_sync(G), SBPRT_OK);
    const size_t moe_scr = sbprt_moe_scratch_floats(n, c, 4, 1, 4);
    float *d_moe = dnew(moe_scr * sizeof(float));
    for (int which = 0; which < 15; which++) {
        int st = -1;
        const char *name = "";
        switch (which) {
        case 0: name = "embedding_forward"; st = sbprt_embedding_forward(G, buf2, buf, d_ids, n, v, c); break;
        case 1: name = "embedding_backward"; st = sbprt_embedding_backward(G, buf2, buf, d_neg, n, v, c); break;
        case 2: name = "rope_forward"; st = sbprt_rope_forward(G, buf2, buf, d_ids, buf, buf, n, 1, 4, 4, 10); break;
        case 3: name = "rope_backward"; st = sbprt_rope_backward(G, buf2, buf, d_neg, buf, buf, n, 1, 4, 4, 10); break;
        case 4: name = "cross_entropy"; st = sbprt_cross_entropy_forward_backward(G, loss, buf2, buf, d_lab, n, v, 0.5f); break;
        case 5: name = "label_logprob_forward"; st = sbprt_label_logprob_forward(G, buf2, buf2 + 64, buf, d_lab, n, v); break;
        case 6: name = "label_logprob_backward"; st = sbprt_label_logprob_backward(G, buf2, buf, buf, d_lab, buf + 100, n, v); break;
        case 7: name = "label_logprob_grad"; st = sbprt_label_logprob_grad(G, buf2, buf, buf, d_lab, NULL, n, v); break;
        case 8: name = "doc_starts"; st = sbprt_doc_starts(G, d_i32, d_ids, 1, n); break;
        case 9: name = "doc_positions"; st = sbprt_doc_positions(G, d_i32, d_neg, 2, 2); break;
        case 10: name = "attention_forward_packed"; st = sbprt_attention_forward_packed(G, buf2, buf2 + 64, buf, buf, buf, d_starts, 1, 2, n, 1, 1, c, 2, 1.0f, 0, 0); break;
        case 11: name = "attention_backward_packed"; st = sbprt_attention_backward_packed(G, buf2, buf2 + 64, buf2 + 128, buf, buf, buf, buf, buf, buf, d_starts, 1, 2, n, 1, 1, c, 2, 1.0f, 0, 0); break;
        case 12: name = "attention_forward_packed (negative)"; st = sbprt_attention_forward_packed(G, buf2, buf2 + 64, buf, buf, buf, d_neg, 1, 2, n, 1, 1, c, 0, 1.0f, 0, 0); break;
        case 13: name = "embedding_forward_bf16_table"; st = sbprt_embedding_forward_bf16_table(G, (sbprt_bf16 *)buf2, (const sbprt_bf16 *)buf, d_ids, n, v, c); break;
        case 14: name = "moe_backward (expert 10 of 4)"; st = sbprt_moe_backward(G, buf2, NULL, NULL, NULL, buf, buf, buf, buf, buf, buf, d_ids, buf, NULL, d_moe, n, c, 4, 1, 4, 0, 0.0f); break;
        }
        s->cases++;
        int st1 = sbprt_sync(G), st2 = sbprt_sync(G);
        if (st != SBPRT_OK || st1 != SBPRT_ERR_RANGE || st2 != SBPRT_OK) {
            fail("%s with a bad index: call %d, sync %d, sync again %d (want 0, %d, 0)", name, st,
                 st1, st2, SBPRT_ERR_RANGE);
            s->fails++;
        }
    }
    sbprt_arena_free(G, buf);
    sbprt_arena_free(G, buf2);
    sbprt_arena_free(G, loss);
    sbprt_arena_free(G, d_ids);
    sbprt_arena_free(G, d_neg);
    sbprt_arena_free(G, d_lab);
    sbprt_arena_free(G, d_starts);
    sbprt_arena_free(G, d_i32);
    sbprt_arena_free(G, d_moe);
    hfree_all();
}

static void t_errors(void)
{
    kstat *s = kstat_get("errors, diagnostics", 0);
    s->cases++;
    int before = nfail;
    /* out of memory names the bytes asked and free, and the context stays usable */
    void *p = (void *)1;
    const size_t huge = (size_t)1 << 50;
    check_status("arena_alloc 2^50 bytes", sbprt_arena_alloc(G, &p, huge), SBPRT_ERR_NOMEM);
    const char *msg = sbprt_ctx_last_error(G);
    char want[32];
    snprintf(want, sizeof want, "%zu bytes", huge);
    if (p != NULL || !strstr(msg, want) || !strstr(msg, "free"))
        fail("out-of-memory diagnostic \"%s\" should name %s and the bytes free", msg, want);
    else
        printf("  out of memory reads: %s\n", msg);
    check_status("sync after OOM", sbprt_sync(G), SBPRT_OK);
    /* argument errors, found up front */
    float *d = dnew(64 * sizeof(float));
    check_status("attention d=300", sbprt_attention_forward(G, d, d, d, d, d, 1, 1, 1, 1, 1, 300, 0, 1.0f),
                 SBPRT_ERR_INVALID);
    check_status("attention hq % hkv", sbprt_attention_forward(G, d, d, d, d, d, 1, 1, 1, 3, 2, 4, 0, 1.0f),
                 SBPRT_ERR_INVALID);
    check_status("attention window -1", sbprt_attention_forward_ex(G, d, d, d, d, d, 1, 1, 1, 1, 1, 4, 0, 1.0f, -1, 0),
                 SBPRT_ERR_INVALID);
    check_status("attention softcap NaN", sbprt_attention_backward_ex(G, d, d, d, d, d, d, d, d, d, 1, 1, 1, 1, 1, 4, 0, 1.0f, 0, NAN),
                 SBPRT_ERR_INVALID);
    check_status("attention bf16 softcap -1", sbprt_attention_forward_ex_bf16(G, (sbprt_bf16 *)d, d, (sbprt_bf16 *)d, (sbprt_bf16 *)d, (sbprt_bf16 *)d, 1, 0, 1, 1, 1, 4, 0, 1.0f, 0, -1.0f),
                 SBPRT_ERR_INVALID);
    check_status("gemm lda too small", sbprt_gemm_strided_batched(G, d, d, d, 0, 0, 2, 2, 3, 1, 0, 2, 0, 3, 0, 2, 0, 1),
                 SBPRT_ERR_INVALID);
    check_status("rope odd rot_dim", sbprt_rope_forward(G, d, d, (int32_t *)d, d, d, 1, 1, 4, 3, 1),
                 SBPRT_ERR_INVALID);
    check_status("NULL context", sbprt_add(NULL, d, d, d, 4), SBPRT_ERR_INVALID);
    check_status("set_tf32 NULL", sbprt_ctx_set_tf32(NULL, 1), SBPRT_ERR_INVALID);
    /* size 0 is a no-op, even with NULL tensors */
    check_status("gemm m=0", sbprt_gemm(G, NULL, NULL, NULL, 0, 0, 0, 4, 4, 1, 0), SBPRT_OK);
    check_status("add n=0", sbprt_add(G, NULL, NULL, NULL, 0), SBPRT_OK);
    check_status("attention t=0", sbprt_attention_forward(G, NULL, NULL, d, d, d, 1, 0, 4, 2, 1, 4, 0, 1.0f),
                 SBPRT_OK);
    sbprt_arena_free(G, d);
    if (strcmp(sbprt_backend_name(), "cuda") != 0)
        fail("sbprt_backend_name() = %s", sbprt_backend_name());
    if (strcmp(cpuref_sbprt_backend_name(), "cpu") != 0)
        fail("the CPU twin says it is %s", cpuref_sbprt_backend_name());
    if (strcmp(sbprt_status_string(SBPRT_ERR_RANGE), cpuref_sbprt_status_string(SBPRT_ERR_RANGE)) != 0)
        fail("status strings differ between backends");
    if (sbprt_ctx_nthreads(G) < 1)
        fail("sbprt_ctx_nthreads = %d", sbprt_ctx_nthreads(G));
    check_status("sync at end", sbprt_sync(G), SBPRT_OK);
    if (nfail != before)
        s->fails++;
}

/* ---- sequence parallelism ----------------------------------------------------------------
 * sbprt_sp_* on a group of N ranks, each rank a thread with its own context (CUDA backend, or
 * the CPU twin) and a loopback communicator: the group's all-to-all is a barrier at which
 * every rank posts its send and receive buffers, then each rank copies its blocks out of the
 * others' send buffers (cudaMemcpy device to device, or memcpy for the twin), then a second
 * barrier (no send buffer is reused before everyone has read it).
 *
 * The emulator is not thread-safe (one global scheduler, one set of coroutine stacks, one
 * "last error"), so the ranks do not run at the same time: they take turns under one mutex
 * (sp_mu), which a rank holds from its first call to its last and gives up only while it waits
 * at the communicator's barriers (pthread_cond_wait on that mutex).  Each emulated call then
 * runs alone and completes, as it does single-threaded, and a collective works as a real one:
 * each rank runs until it reaches the exchange, the last to arrive releases the others.  On a
 * real GPU the same test runs the same way (the turns cost little at these sizes).  With
 * stream_ordered set the callback first waits for the stream it is given (legal for an
 * exchange "queued" on it), so that path of the backend is run too.
 *
 * Each case runs a layer's whole sequence-parallel pipeline on every rank: positions, (packed
 * cases) the gather of document ids, doc starts and doc positions, the K and V gathers, the
 * forward of each query chunk, the backward of each chunk (dq from random values, dkh and dvh
 * accumulated over the chunks from zero), the K and V scatters into random dk, dv.  It runs on
 * the CPU twin's group once and on the CUDA group twice (the second must be bitwise equal),
 * and compares every output of every rank: integers and the K/V gathers (pure copies)
 * exactly, the rest at 1e-5 as elsewhere.  Both groups' assembled out, dq, dk, dv are also
 * compared with the twin's plain packed attention over the whole sequence (the scheme itself).
 */

#define SP_MAXR 4

typedef struct {
    int n;                    /* ranks */
    int device;               /* buffers are CUDA memory (cudaMemcpy), else host memory */
    int ordered;              /* stream_ordered: the callback waits for the stream itself */
    int arrived, gen;         /* the barrier */
    pthread_cond_t cv;
    const void *send[SP_MAXR];
    void *recv[SP_MAXR];
    size_t bytes[SP_MAXR];
    int calls[SP_MAXR];     /* exchanges each rank has entered */
    int fail_call[SP_MAXR]; /* > 0: that exchange of the rank returns nonzero at once */
} sp_group;

typedef struct {
    sp_group *g;
    int rank;
} sp_member;

static pthread_mutex_t sp_mu = PTHREAD_MUTEX_INITIALIZER;

/* Called with sp_mu held; gives it up while waiting. */
static void sp_barrier(sp_group *g)
{
    const int gen = g->gen;
    if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (gen == g->gen)
            pthread_cond_wait(&g->cv, &sp_mu);
    }
}

static int sp_loopback(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    sp_member *me = user;
    sp_group *g = me->g;
    if (++g->calls[me->rank] == g->fail_call[me->rank])
        return 7;
    if (g->device && g->ordered && cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess)
        return 8;
    g->send[me->rank] = send;
    g->recv[me->rank] = recv;
    g->bytes[me->rank] = bytes;
    sp_barrier(g);
    int rc = 0;
    for (int n = 0; n < g->n; n++)
        if (g->bytes[n] != bytes)
            rc = 9; /* the ranks disagree: every rank sees it */
    for (int n = 0; n < g->n && !rc; n++) {
        char *dst = (char *)recv + (size_t)n * bytes;
        const char *src = (const char *)g->send[n] + (size_t)me->rank * bytes;
        if (!g->device)
            memcpy(dst, src, bytes);
        else if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice) != cudaSuccess)
            rc = 10;
    }
    /* a device-to-device cudaMemcpy may return before it is done: finish it before the
     * owners of the send buffers may rewrite them */
    if (g->device && !rc && cudaDeviceSynchronize() != cudaSuccess)
        rc = 10;
    sp_barrier(g);
    return rc;
}

/* The API of one backend, so that one rank body drives either. */
typedef struct {
    int device;
    __typeof__(&sbprt_ctx_create) ctx_create;
    __typeof__(&sbprt_ctx_destroy) ctx_destroy;
    __typeof__(&sbprt_ctx_set_comm) set_comm;
    __typeof__(&sbprt_ctx_last_error) last_error;
    __typeof__(&sbprt_sync) sync;
    __typeof__(&sbprt_arena_alloc) arena_alloc;
    __typeof__(&sbprt_arena_free) arena_free;
    __typeof__(&sbprt_memcpy) memcpy;
    __typeof__(&sbprt_memset_zero) memset_zero;
    __typeof__(&sbprt_doc_starts) doc_starts;
    __typeof__(&sbprt_sp_positions) positions;
    __typeof__(&sbprt_sp_gather_rows) gather_rows;
    __typeof__(&sbprt_sp_doc_positions) doc_positions;
    __typeof__(&sbprt_sp_kv_gather) kv_gather;
    __typeof__(&sbprt_sp_kv_scatter) kv_scatter;
    __typeof__(&sbprt_sp_attention_forward) attention_forward;
    __typeof__(&sbprt_sp_attention_backward) attention_backward;
} sp_api;

static const sp_api sp_cuda = {
    1, sbprt_ctx_create, sbprt_ctx_destroy, sbprt_ctx_set_comm, sbprt_ctx_last_error,
    sbprt_sync, sbprt_arena_alloc, sbprt_arena_free, sbprt_memcpy, sbprt_memset_zero,
    sbprt_doc_starts, sbprt_sp_positions, sbprt_sp_gather_rows, sbprt_sp_doc_positions,
    sbprt_sp_kv_gather, sbprt_sp_kv_scatter, sbprt_sp_attention_forward,
    sbprt_sp_attention_backward,
};
static const sp_api sp_cpu = {
    0, cpuref_sbprt_ctx_create, cpuref_sbprt_ctx_destroy, cpuref_sbprt_ctx_set_comm,
    cpuref_sbprt_ctx_last_error, cpuref_sbprt_sync, cpuref_sbprt_arena_alloc,
    cpuref_sbprt_arena_free, cpuref_sbprt_memcpy, cpuref_sbprt_memset_zero,
    cpuref_sbprt_doc_starts, cpuref_sbprt_sp_positions, cpuref_sbprt_sp_gather_rows,
    cpuref_sbprt_sp_doc_positions, cpuref_sbprt_sp_kv_gather, cpuref_sbprt_sp_kv_scatter,
    cpuref_sbprt_sp_attention_forward, cpuref_sbprt_sp_attention_backward,
};

typedef struct sp_rank sp_rank;
struct sp_rank {
    sp_group *g;
    sp_member mem;
    int rank;
    const sp_api *api;
    sbprt_ctx *ctx;
    void (*body)(sp_rank *);
    void *arg;
    void *bufs[64]; /* backend buffers, freed when the body returns */
    int nbufs;
    int status; /* first failed call of the body */
    char msg[480];
};

static void *sp_new(sp_rank *r, size_t bytes)
{
    void *p = NULL;
    if (r->nbufs == (int)(sizeof r->bufs / sizeof r->bufs[0]) ||
        r->api->arena_alloc(r->ctx, &p, bytes ? bytes : 1) != SBPRT_OK) {
        fprintf(stderr, "test: rank %d: allocation of %zu bytes failed\n", r->rank, bytes);
        exit(1);
    }
    r->bufs[r->nbufs++] = p;
    return p;
}

static void sp_put(sp_rank *r, void *d, const void *h, size_t bytes)
{
    if (r->api->memcpy(r->ctx, d, h, bytes, SBPRT_COPY_HOST_TO_DEVICE) != SBPRT_OK) {
        fprintf(stderr, "test: rank %d: upload failed\n", r->rank);
        exit(1);
    }
}

static void sp_get(sp_rank *r, void *h, const void *d, size_t bytes)
{
    if (r->api->memcpy(r->ctx, h, d, bytes, SBPRT_COPY_DEVICE_TO_HOST) != SBPRT_OK) {
        fprintf(stderr, "test: rank %d: download failed\n", r->rank);
        exit(1);
    }
}

/* A backend copy of host h (uploaded). */
static void *sp_in(sp_rank *r, const void *h, size_t bytes)
{
    void *d = sp_new(r, bytes);
    sp_put(r, d, h, bytes);
    return d;
}

/* Records the first failed call of a rank's body. */
static void sp_call(sp_rank *r, int st, const char *what)
{
    if (st != SBPRT_OK && r->status == SBPRT_OK) {
        r->status = st;
        snprintf(r->msg, sizeof r->msg, "%s -> %s (%s)", what, sbprt_status_string(st),
                 r->api->last_error(r->ctx));
    }
}
#define SP_CALL(r, call) sp_call((r), (call), #call)

static void *sp_thread(void *p)
{
    sp_rank *r = p;
    pthread_mutex_lock(&sp_mu);
    if (r->api->ctx_create(&r->ctx, 0) != SBPRT_OK) {
        fprintf(stderr, "test: rank %d: context creation failed\n", r->rank);
        exit(1);
    }
    const sbprt_comm comm = {r->rank, r->g->n, sp_loopback, &r->mem,
                             r->api->device && r->g->ordered};
    SP_CALL(r, r->api->set_comm(r->ctx, &comm));
    r->body(r);
    for (int i = r->nbufs - 1; i >= 0; i--)
        r->api->arena_free(r->ctx, r->bufs[i]);
    r->api->ctx_destroy(r->ctx);
    pthread_mutex_unlock(&sp_mu);
    return NULL;
}

/* Runs body on every rank of an n-rank group of the given backend; returns when all did.
 * ranks[i].status / msg tell how rank i's calls went. */
static void sp_run(sp_rank *ranks, sp_group *g, int n, const sp_api *api, int ordered,
                   void (*body)(sp_rank *), void *arg)
{
    memset(g, 0, sizeof *g);
    g->n = n;
    g->device = api->device;
    g->ordered = ordered;
    pthread_cond_init(&g->cv, NULL);
    pthread_t th[SP_MAXR];
    for (int i = 0; i < n; i++) {
        memset(&ranks[i], 0, sizeof ranks[i]);
        ranks[i].g = g;
        ranks[i].mem.g = g;
        ranks[i].mem.rank = i;
        ranks[i].rank = i;
        ranks[i].api = api;
        ranks[i].body = body;
        ranks[i].arg = arg;
        if (pthread_create(&th[i], NULL, sp_thread, &ranks[i]) != 0) {
            fprintf(stderr, "test: pthread_create failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_cond_destroy(&g->cv);
}

/* ---- the pipeline of one layer ---- */

typedef struct {
    const char *name;
    int n, b, tl, hq, hkv, d, tc; /* ranks, batch, tokens per rank, heads, head size, chunk */
    int window;
    float softcap;
    const int *lens; /* document lengths (0-terminated, cyclic), NULL: one document a row */
    int ordered;     /* the CUDA group's communicator is stream-ordered */
} sp_case;

typedef struct { /* what one rank computed (host copies) */
    int32_t *pos, *ids_all, *dpos;
    float *kh, *vh, *out, *lse, *dq, *dkh, *dvh, *dk, *dv;
} sp_res;

typedef struct {
    const sp_case *c;
    int T, hkv_r;
    size_t nq, nkv, nkh, nlse; /* per rank: b*tl*hq*d, b*tl*hkv*d, b*T*hkv_r*d, lse floats */
    /* whole-sequence inputs: [b, T, ...] */
    const float *q, *k, *v, *dout, *dq0, *dk0, *dv0;
    const int32_t *ids;
    sp_res res[SP_MAXR];
} sp_job;

/* dst[bi][i][:] = src[bi][row0 + i][:] for i < rows (w elements of `es` bytes a row; src rows
 * of src_t), and its inverse. */
static void sp_take(void *dst, const void *src, int b, int src_t, int row0, int rows, size_t w,
                    size_t es)
{
    for (int bi = 0; bi < b; bi++)
        memcpy((char *)dst + (size_t)bi * rows * w * es,
               (const char *)src + ((size_t)bi * src_t + row0) * w * es, (size_t)rows * w * es);
}

static void sp_place(void *dst, int dst_t, int row0, const void *src, int b, int rows, size_t w,
                     size_t es)
{
    for (int bi = 0; bi < b; bi++)
        memcpy((char *)dst + ((size_t)bi * dst_t + row0) * w * es,
               (const char *)src + (size_t)bi * rows * w * es, (size_t)rows * w * es);
}

static void sp_body_pipeline(sp_rank *r)
{
    sp_job *J = r->arg;
    const sp_case *c = J->c;
    const sp_api *A = r->api;
    sbprt_ctx *x = r->ctx;
    sp_res *o = &J->res[r->rank];
    const int N = c->n, b = c->b, tl = c->tl, T = J->T, hq = c->hq, hkv = c->hkv, d = c->d;
    const int hkv_r = J->hkv_r, hq_r = hq / N, row0 = r->rank * tl;
    const size_t wq = (size_t)hq * d, wkv = (size_t)hkv * d, wh = (size_t)hkv_r * d;
    const float scale = 1.0f / sqrtf((float)d);

    int32_t *pos = sp_new(r, (size_t)b * tl * sizeof(int32_t));
    SP_CALL(r, A->positions(x, pos, b, tl, N));
    sp_get(r, o->pos, pos, (size_t)b * tl * sizeof(int32_t));

    int32_t *ds = NULL;
    if (c->lens) {
        int32_t *mine_h = hnew((size_t)b * tl * sizeof(int32_t));
        sp_take(mine_h, J->ids, b, T, row0, tl, 1, sizeof(int32_t));
        int32_t *mine = sp_in(r, mine_h, (size_t)b * tl * sizeof(int32_t));
        int32_t *all = sp_new(r, (size_t)b * T * sizeof(int32_t));
        int32_t *scr = sp_new(r, (size_t)N * tl * sizeof(int32_t));
        SP_CALL(r, A->gather_rows(x, all, mine, scr, b, tl, N));
        sp_get(r, o->ids_all, all, (size_t)b * T * sizeof(int32_t));
        ds = sp_new(r, (size_t)b * T * sizeof(int32_t));
        SP_CALL(r, A->doc_starts(x, ds, all, b, T));
        int32_t *dpos = sp_new(r, (size_t)b * tl * sizeof(int32_t));
        SP_CALL(r, A->doc_positions(x, dpos, ds, b, tl, N));
        sp_get(r, o->dpos, dpos, (size_t)b * tl * sizeof(int32_t));
    }

    float *hbuf = hnew(J->nq * sizeof(float)); /* host staging, the largest local tensor */
    sp_take(hbuf, J->k, b, T, row0, tl, wkv, sizeof(float));
    float *k = sp_in(r, hbuf, J->nkv * sizeof(float));
    sp_take(hbuf, J->v, b, T, row0, tl, wkv, sizeof(float));
    float *v = sp_in(r, hbuf, J->nkv * sizeof(float));
    float *kh = sp_new(r, J->nkh * sizeof(float)), *vh = sp_new(r, J->nkh * sizeof(float));
    float *kvs = sp_new(r, (size_t)N * tl * wh * sizeof(float));
    SP_CALL(r, A->kv_gather(x, kh, k, kvs, b, tl, hq, hkv, d, N));
    SP_CALL(r, A->kv_gather(x, vh, v, kvs, b, tl, hq, hkv, d, N));
    sp_get(r, o->kh, kh, J->nkh * sizeof(float));
    sp_get(r, o->vh, vh, J->nkh * sizeof(float));

    enum { MAXCH = 8 };
    const int nch = (tl + c->tc - 1) / c->tc;
    if (nch > MAXCH) {
        fprintf(stderr, "test: too many chunks\n");
        exit(1);
    }
    const size_t smax = (size_t)b * c->tc * wq;
    float *s[4];
    for (int i = 0; i < 4; i++)
        s[i] = sp_new(r, smax * sizeof(float));
    float *qc[MAXCH], *oc[MAXCH], *lc[MAXCH];
    float *chunk_h = hnew(smax * sizeof(float));
    size_t lse_off = 0;
    for (int ch = 0; ch < nch; ch++) {
        const int q0 = ch * c->tc, t = tl - q0 < c->tc ? tl - q0 : c->tc;
        const size_t nc = (size_t)b * t * wq, nl = (size_t)N * b * hq_r * t;
        sp_take(chunk_h, J->q, b, T, row0 + q0, t, wq, sizeof(float));
        qc[ch] = sp_in(r, chunk_h, nc * sizeof(float));
        oc[ch] = sp_new(r, nc * sizeof(float));
        lc[ch] = sp_new(r, nl * sizeof(float));
        SP_CALL(r, A->attention_forward(x, oc[ch], lc[ch], qc[ch], kh, vh, ds, s[0], s[1], b, t,
                                        tl, hq, hkv, d, q0, scale, c->window, c->softcap, N));
        sp_get(r, chunk_h, oc[ch], nc * sizeof(float));
        sp_place(o->out, tl, q0, chunk_h, b, t, wq, sizeof(float));
        sp_get(r, o->lse + lse_off, lc[ch], nl * sizeof(float));
        lse_off += nl;
    }

    float *dkh = sp_new(r, J->nkh * sizeof(float)), *dvh = sp_new(r, J->nkh * sizeof(float));
    SP_CALL(r, A->memset_zero(x, dkh, J->nkh * sizeof(float)));
    SP_CALL(r, A->memset_zero(x, dvh, J->nkh * sizeof(float)));
    for (int ch = 0; ch < nch; ch++) {
        const int q0 = ch * c->tc, t = tl - q0 < c->tc ? tl - q0 : c->tc;
        const size_t nc = (size_t)b * t * wq;
        sp_take(chunk_h, J->dq0, b, T, row0 + q0, t, wq, sizeof(float));
        float *dqc = sp_in(r, chunk_h, nc * sizeof(float));
        sp_take(chunk_h, J->dout, b, T, row0 + q0, t, wq, sizeof(float));
        float *doc = sp_in(r, chunk_h, nc * sizeof(float));
        SP_CALL(r, A->attention_backward(x, dqc, dkh, dvh, doc, qc[ch], kh, vh, oc[ch], lc[ch],
                                         ds, s[0], s[1], s[2], s[3], b, t, tl, hq, hkv, d, q0,
                                         scale, c->window, c->softcap, N));
        sp_get(r, chunk_h, dqc, nc * sizeof(float));
        sp_place(o->dq, tl, q0, chunk_h, b, t, wq, sizeof(float));
    }
    sp_get(r, o->dkh, dkh, J->nkh * sizeof(float));
    sp_get(r, o->dvh, dvh, J->nkh * sizeof(float));

    sp_take(hbuf, J->dk0, b, T, row0, tl, wkv, sizeof(float));
    float *dk = sp_in(r, hbuf, J->nkv * sizeof(float));
    sp_take(hbuf, J->dv0, b, T, row0, tl, wkv, sizeof(float));
    float *dv = sp_in(r, hbuf, J->nkv * sizeof(float));
    SP_CALL(r, A->kv_scatter(x, dk, dkh, kvs, b, tl, hq, hkv, d, N));
    SP_CALL(r, A->kv_scatter(x, dv, dvh, kvs, b, tl, hq, hkv, d, N));
    sp_get(r, o->dk, dk, J->nkv * sizeof(float));
    sp_get(r, o->dv, dv, J->nkv * sizeof(float));
    SP_CALL(r, A->sync(x));
}

/* Result buffers of every rank of a job. */
static void sp_alloc_res(sp_job *J)
{
    const sp_case *c = J->c;
    for (int r = 0; r < c->n; r++) {
        sp_res *o = &J->res[r];
        o->pos = hnew((size_t)c->b * c->tl * sizeof(int32_t));
        o->dpos = hnew((size_t)c->b * c->tl * sizeof(int32_t));
        o->ids_all = hnew((size_t)c->b * J->T * sizeof(int32_t));
        memset(o->dpos, 0, (size_t)c->b * c->tl * sizeof(int32_t));
        memset(o->ids_all, 0, (size_t)c->b * J->T * sizeof(int32_t));
        o->kh = hnew(J->nkh * sizeof(float));
        o->vh = hnew(J->nkh * sizeof(float));
        o->dkh = hnew(J->nkh * sizeof(float));
        o->dvh = hnew(J->nkh * sizeof(float));
        o->out = hnew(J->nq * sizeof(float));
        o->dq = hnew(J->nq * sizeof(float));
        o->lse = hnew(J->nlse * sizeof(float));
        o->dk = hnew(J->nkv * sizeof(float));
        o->dv = hnew(J->nkv * sizeof(float));
    }
}

/* One comparison into a kernel's statistics: normalised error (base: accumulated output, the
 * error relative to the increment) against the kstat's tolerance, 0 meaning bitwise. */
static void sp_check(kstat *s, const char *label, const char *what, const void *got,
                     const void *ref, const float *base, size_t n, int exact)
{
    if (exact) {
        if (memcmp(got, ref, n * 4) != 0) {
            fail("%s [%s] %s: differs from the CPU twin (must be equal)", s->name, label, what);
            s->fails++;
        }
        return;
    }
    const double e = nerr(got, ref, base, n);
    if (isnan(e) || (!isnan(s->max_err) && e > s->max_err))
        s->max_err = e;
    if (!(e <= s->tol)) {
        fail("%s [%s] %s: error %.3g > %.3g", s->name, label, what, e, s->tol);
        s->fails++;
    }
}

/* Assembles a whole-sequence tensor [b, T, w] from the ranks' [b, tl, w] shares. */
static float *sp_assemble(const sp_job *J, size_t off_field, size_t w)
{
    const sp_case *c = J->c;
    float *all = hnew((size_t)c->b * J->T * w * sizeof(float));
    for (int r = 0; r < c->n; r++) {
        const float *part = *(float *const *)((const char *)&J->res[r] + off_field);
        sp_place(all, J->T, r * c->tl, part, c->b, c->tl, w, sizeof(float));
    }
    return all;
}

static void t_seqpar_case(const sp_case *c)
{
    char label[200];
    int len = snprintf(label, sizeof label, "%s: N=%d b=%d tl=%d hq=%d hkv=%d d=%d chunk=%d",
                       c->name, c->n, c->b, c->tl, c->hq, c->hkv, c->d, c->tc);
    if (c->window && len > 0 && (size_t)len < sizeof label)
        len += snprintf(label + len, sizeof label - len, " window=%d", c->window);
    if (c->softcap > 0 && len > 0 && (size_t)len < sizeof label)
        len += snprintf(label + len, sizeof label - len, " softcap=%g", (double)c->softcap);
    if (c->lens && len > 0 && (size_t)len < sizeof label)
        len += snprintf(label + len, sizeof label - len, " docs");
    if (c->ordered && len > 0 && (size_t)len < sizeof label)
        snprintf(label + len, sizeof label - len, " stream-ordered");

    const int N = c->n, b = c->b, T = N * c->tl, hq = c->hq, hkv = c->hkv, d = c->d;
    const size_t wq = (size_t)hq * d, wkv = (size_t)hkv * d;
    sp_job base;
    memset(&base, 0, sizeof base);
    base.c = c;
    base.T = T;
    base.hkv_r = hkv % N == 0 ? hkv / N : 1;
    base.nq = (size_t)b * c->tl * wq;
    base.nkv = (size_t)b * c->tl * wkv;
    base.nkh = (size_t)b * T * base.hkv_r * d;
    base.nlse = (size_t)N * b * (hq / N) * c->tl;
    const size_t nQ = (size_t)b * T * wq, nK = (size_t)b * T * wkv;
    base.q = hrand(nQ, -1, 1);
    base.k = hrand(nK, -1, 1);
    base.v = hrand(nK, -1, 1);
    base.dout = hrand(nQ, -1, 1);
    base.dq0 = hrand(nQ, -1, 1);
    base.dk0 = hrand(nK, -1, 1);
    base.dv0 = hrand(nK, -1, 1);
    int32_t *ids = NULL, *ds_full = NULL;
    if (c->lens) {
        ids = hnew((size_t)b * T * sizeof(int32_t));
        int nl = 0;
        while (c->lens[nl])
            nl++;
        for (int bi = 0; bi < b; bi++) {
            int p = 0, li = bi % nl, id = 3 * bi - 1;
            while (p < T) {
                for (int e = 0; e < c->lens[li] && p < T; e++, p++)
                    ids[(size_t)bi * T + p] = id;
                id += 1 + (li & 1);
                li = (li + 1) % nl;
            }
        }
        ds_full = hnew((size_t)b * T * sizeof(int32_t));
        REF(cpuref_sbprt_doc_starts(C, ds_full, ids, b, T));
    }
    base.ids = ids;

    sp_job cpu = base, gpu = base, gpu2 = base;
    sp_alloc_res(&cpu);
    sp_alloc_res(&gpu);
    sp_alloc_res(&gpu2);
    sp_rank ranks[SP_MAXR];
    sp_group g;
    sp_run(ranks, &g, N, &sp_cpu, 0, sp_body_pipeline, &cpu);
    for (int r = 0; r < N; r++)
        if (ranks[r].status != SBPRT_OK) {
            fprintf(stderr, "test: CPU twin failed on rank %d: %s\n", r, ranks[r].msg);
            exit(1);
        }
    int gst = SBPRT_OK;
    for (int run = 0; run < 2; run++) {
        sp_run(ranks, &g, N, &sp_cuda, c->ordered, sp_body_pipeline, run ? &gpu2 : &gpu);
        for (int r = 0; r < N; r++)
            if (ranks[r].status != SBPRT_OK) {
                if (gst == SBPRT_OK)
                    fail("seqpar [%s] rank %d: %s", label, r, ranks[r].msg);
                gst = ranks[r].status;
            }
    }

    kstat *s_idx = kstat_get("sp_positions, gather_rows, doc_pos", 0);
    kstat *s_kvg = kstat_get("sp_kv_gather (exact)", 0);
    kstat *s_fwd = kstat_get("sp_attention_forward", TOL_FP32);
    kstat *s_bwd = kstat_get("sp_attention_backward", TOL_FP32);
    kstat *s_sct = kstat_get("sp_kv_scatter", TOL_FP32);
    kstat *s_all = kstat_get("sp scheme vs whole-sequence attn", TOL_FP32);
    kstat *all_s[] = {s_idx, s_kvg, s_fwd, s_bwd, s_sct, s_all};
    int fails0[6];
    for (int i = 0; i < 6; i++) {
        all_s[i]->cases++;
        fails0[i] = all_s[i]->fails;
    }
    if (gst != SBPRT_OK)
        for (int i = 0; i < 6; i++)
            all_s[i]->fails++;

    /* the second CUDA run must be bitwise the first */
    for (int r = 0; r < N; r++) {
        const sp_res *a = &gpu.res[r], *z = &gpu2.res[r];
        const struct {
            const char *what;
            const void *x, *y;
            size_t n;
            kstat *s;
        } det[] = {
            {"out", a->out, z->out, base.nq, s_fwd},     {"lse", a->lse, z->lse, base.nlse, s_fwd},
            {"dq", a->dq, z->dq, base.nq, s_bwd},        {"dkh", a->dkh, z->dkh, base.nkh, s_bwd},
            {"dvh", a->dvh, z->dvh, base.nkh, s_bwd},    {"dk", a->dk, z->dk, base.nkv, s_sct},
            {"dv", a->dv, z->dv, base.nkv, s_sct},       {"kh", a->kh, z->kh, base.nkh, s_kvg},
        };
        for (size_t i = 0; i < sizeof det / sizeof det[0]; i++)
            if (memcmp(det[i].x, det[i].y, det[i].n * sizeof(float)) != 0) {
                fail("%s [%s] rank %d %s: two runs differ (not deterministic)", det[i].s->name,
                     label, r, det[i].what);
                det[i].s->nondet++;
                det[i].s->fails++;
            }
    }

    /* every rank's outputs against the CPU twin's */
    for (int r = 0; r < N; r++) {
        const sp_res *gr = &gpu.res[r], *cr = &cpu.res[r];
        char rl[240];
        snprintf(rl, sizeof rl, "%s, rank %d", label, r);
        sp_check(s_idx, rl, "positions", gr->pos, cr->pos, NULL, (size_t)b * c->tl, 1);
        if (c->lens) {
            sp_check(s_idx, rl, "gathered ids", gr->ids_all, cr->ids_all, NULL, (size_t)b * T, 1);
            sp_check(s_idx, rl, "doc positions", gr->dpos, cr->dpos, NULL, (size_t)b * c->tl, 1);
        }
        sp_check(s_kvg, rl, "kh", gr->kh, cr->kh, NULL, base.nkh, 1);
        sp_check(s_kvg, rl, "vh", gr->vh, cr->vh, NULL, base.nkh, 1);
        sp_check(s_fwd, rl, "out", gr->out, cr->out, NULL, base.nq, 0);
        sp_check(s_fwd, rl, "lse", gr->lse, cr->lse, NULL, base.nlse, 0);
        float *dq0 = hnew(base.nq * sizeof(float)), *dk0 = hnew(base.nkv * sizeof(float));
        float *dv0 = hnew(base.nkv * sizeof(float));
        sp_take(dq0, base.dq0, b, T, r * c->tl, c->tl, wq, sizeof(float));
        sp_take(dk0, base.dk0, b, T, r * c->tl, c->tl, wkv, sizeof(float));
        sp_take(dv0, base.dv0, b, T, r * c->tl, c->tl, wkv, sizeof(float));
        sp_check(s_bwd, rl, "dq", gr->dq, cr->dq, dq0, base.nq, 0);
        sp_check(s_bwd, rl, "dkh", gr->dkh, cr->dkh, NULL, base.nkh, 0);
        sp_check(s_bwd, rl, "dvh", gr->dvh, cr->dvh, NULL, base.nkh, 0);
        sp_check(s_sct, rl, "dk", gr->dk, cr->dk, dk0, base.nkv, 0);
        sp_check(s_sct, rl, "dv", gr->dv, cr->dv, dv0, base.nkv, 0);
        /* the indices against what they must be */
        for (int bi = 0; bi < b; bi++)
            for (int i = 0; i < c->tl; i++) {
                const int p = r * c->tl + i;
                const size_t e = (size_t)bi * c->tl + i;
                if (cr->pos[e] != p || (c->lens && cr->dpos[e] != p - ds_full[(size_t)bi * T + p])) {
                    fail("%s [%s]: the twin's positions are wrong at row %d, token %d",
                         s_idx->name, rl, bi, i);
                    s_idx->fails++;
                    bi = b;
                    break;
                }
            }
    }

    /* the scheme: assembled out, dq, dk, dv against one attention over the whole sequence */
    const float scale = 1.0f / sqrtf((float)d);
    float *out_f = hnew(nQ * sizeof(float)), *lse_f = hnew((size_t)b * hq * T * sizeof(float));
    float *dq_f = hnew(nQ * sizeof(float)), *dk_f = hnew(nK * sizeof(float));
    float *dv_f = hnew(nK * sizeof(float));
    memcpy(dq_f, base.dq0, nQ * sizeof(float));
    memcpy(dk_f, base.dk0, nK * sizeof(float));
    memcpy(dv_f, base.dv0, nK * sizeof(float));
    REF(cpuref_sbprt_attention_forward_packed(C, out_f, lse_f, base.q, base.k, base.v, ds_full, b,
                                              T, T, hq, hkv, d, 0, scale, c->window, c->softcap));
    REF(cpuref_sbprt_attention_backward_packed(C, dq_f, dk_f, dv_f, base.dout, base.q, base.k,
                                               base.v, out_f, lse_f, ds_full, b, T, T, hq, hkv, d,
                                               0, scale, c->window, c->softcap));
    for (int be = 0; be < 2; be++) {
        const sp_job *J = be ? &gpu : &cpu;
        char bl[240];
        snprintf(bl, sizeof bl, "%s, %s", label, be ? "cuda" : "cpu twin");
        sp_check(s_all, bl, "out", sp_assemble(J, offsetof(sp_res, out), wq), out_f, NULL, nQ, 0);
        sp_check(s_all, bl, "dq", sp_assemble(J, offsetof(sp_res, dq), wq), dq_f, base.dq0, nQ, 0);
        sp_check(s_all, bl, "dk", sp_assemble(J, offsetof(sp_res, dk), wkv), dk_f, base.dk0, nK, 0);
        sp_check(s_all, bl, "dv", sp_assemble(J, offsetof(sp_res, dv), wkv), dv_f, base.dv0, nK, 0);
    }
    for (int i = 0; i < 6; i++)
        if (all_s[i]->fails > fails0[i])
            all_s[i]->fails = fails0[i] + 1; /* failed cases, not failed checks */
}

/* ---- argument errors, a failing exchange, device index checks (CUDA, 2 ranks) ---- */

static void sp_expect(sp_rank *r, const char *what, int got, int want, const char *msg_has)
{
    const char *msg = sbprt_ctx_last_error(r->ctx);
    if (got != want || (msg_has && !strstr(msg, msg_has))) {
        fail("seqpar errors, rank %d: %s returned %d (want %d), diagnostic \"%s\"%s%s", r->rank,
             what, got, want, msg, msg_has ? " should mention " : "", msg_has ? msg_has : "");
        r->status = SBPRT_ERR_INVALID;
    }
}

static void sp_body_errors(sp_rank *r)
{
    sbprt_ctx *x = r->ctx;
    sp_group *g = r->g;
    const int me = r->rank, tl = 4;
    float *f = sp_new(r, 64 * sizeof(float)), *o = sp_new(r, 64 * sizeof(float));
    float *s1 = sp_new(r, 64 * sizeof(float)), *s2 = sp_new(r, 64 * sizeof(float));
    float *kh = sp_new(r, 64 * sizeof(float));
    sp_put(r, f, hrand(64, -1, 1), 64 * sizeof(float));
    sp_put(r, kh, hrand(64, -1, 1), 64 * sizeof(float));
    /* refused up front: no exchange is entered (no rank is left waiting) */
    const int calls0 = g->calls[me];
    sp_expect(r, "kv_gather nranks 4 on a 2-rank communicator",
              sbprt_sp_kv_gather(x, kh, f, s1, 1, tl, 2, 2, 4, 4), SBPRT_ERR_INVALID,
              "communicator");
    sp_expect(r, "kv_gather hq 6, hkv 3 over 2 ranks",
              sbprt_sp_kv_gather(x, kh, f, s1, 1, tl, 6, 3, 4, 2), SBPRT_ERR_INVALID, "ranks");
    sp_expect(r, "kv_scatter hq 3 over 2 ranks",
              sbprt_sp_kv_scatter(x, f, kh, s1, 1, tl, 3, 1, 4, 2), SBPRT_ERR_INVALID, NULL);
    sp_expect(r, "attention_forward chunk past tl",
              sbprt_sp_attention_forward(x, o, s2, f, kh, kh, NULL, s1, s2, 1, 3, tl, 2, 2, 4, 2,
                                         1.0f, 0, 0, 2),
              SBPRT_ERR_INVALID, NULL);
    sp_expect(r, "attention_forward window -1",
              sbprt_sp_attention_forward(x, o, s2, f, kh, kh, NULL, s1, s2, 1, 2, tl, 2, 2, 4, 0,
                                         1.0f, -1, 0, 2),
              SBPRT_ERR_INVALID, NULL);
    sp_expect(r, "attention_forward d 300 (the CUDA limit)",
              sbprt_sp_attention_forward(x, o, s2, f, kh, kh, NULL, s1, s2, 1, 1, 1, 2, 2, 300, 0,
                                         1.0f, 0, 0, 2),
              SBPRT_ERR_INVALID, "head size");
    sp_expect(r, "attention_backward d 300",
              sbprt_sp_attention_backward(x, o, o, o, f, f, kh, kh, f, f, NULL, s1, s2, s1, s2, 1,
                                          1, 1, 2, 2, 300, 0, 1.0f, 0, 0, 2),
              SBPRT_ERR_INVALID, "head size");
    sp_expect(r, "attention_backward lse NULL",
              sbprt_sp_attention_backward(x, o, o, o, f, f, kh, kh, f, NULL, NULL, s1, s2, s1, s2,
                                          1, 2, tl, 2, 2, 4, 0, 1.0f, 0, 0, 2),
              SBPRT_ERR_INVALID, NULL);
    sp_expect(r, "positions b 0 (no-op, NULL)", sbprt_sp_positions(x, NULL, 0, tl, 2), SBPRT_OK,
              NULL);
    sp_expect(r, "attention_forward t 0 (no-op, NULL)",
              sbprt_sp_attention_forward(x, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 0,
                                         tl, 2, 2, 4, 0, 1.0f, 0, 0, 2),
              SBPRT_OK, NULL);
    if (g->calls[me] != calls0)
        fail("seqpar errors, rank %d: refused calls entered %d exchanges", me,
             g->calls[me] - calls0);
    /* a failing exchange: SBPRT_ERR_BACKEND with a diagnostic, on every rank */
    g->fail_call[me] = g->calls[me] + 1;
    sp_expect(r, "kv_gather with a failing all-to-all",
              sbprt_sp_kv_gather(x, kh, f, s1, 1, tl, 2, 2, 4, 2), SBPRT_ERR_BACKEND,
              "all-to-all");
    g->fail_call[me] = g->calls[me] + 2; /* the forward's second one, after the kernels */
    sp_expect(r, "attention_forward with a failing second all-to-all",
              sbprt_sp_attention_forward(x, o, s2 + 32, f, kh, kh, NULL, s1, s2, 1, 2, tl, 2, 2, 4,
                                         0, 1.0f, 0, 0, 2),
              SBPRT_ERR_BACKEND, "all-to-all");
    g->fail_call[me] = 0;
    sp_expect(r, "sync after the failed exchanges", sbprt_sync(x), SBPRT_OK, NULL);
    /* a bad document start in the chunk of rank 1's rows: every rank computes that chunk for
     * its heads, so every rank's sync reports it */
    const int32_t bad_att[8] = {0, 0, 0, 0, 4, 4, 7, 4};
    int32_t *dsa = sp_in(r, bad_att, sizeof bad_att);
    sp_expect(r, "attention_forward with a bad doc_start",
              sbprt_sp_attention_forward(x, o, s2 + 32, f, kh, kh, dsa, s1, s2, 1, 2, tl, 2, 2, 4,
                                         2, 1.0f, 0, 0, 2),
              SBPRT_OK, NULL);
    sp_expect(r, "sync after it", sbprt_sync(x), SBPRT_ERR_RANGE, NULL);
    sp_expect(r, "sync again", sbprt_sync(x), SBPRT_OK, NULL);
    /* sp_doc_positions reads this rank's positions only: rank 1's holds a start past its
     * position, rank 0's are fine */
    const int32_t bad_pos[8] = {0, 0, 0, 0, 4, 4, 9, 4};
    int32_t *dsp = sp_in(r, bad_pos, sizeof bad_pos), *pos = sp_new(r, tl * sizeof(int32_t));
    sp_expect(r, "doc_positions with a bad start", sbprt_sp_doc_positions(x, pos, dsp, 1, tl, 2),
              SBPRT_OK, NULL);
    sp_expect(r, "sync after it", sbprt_sync(x), me == 1 ? SBPRT_ERR_RANGE : SBPRT_OK, NULL);
    /* and the context works on */
    sp_expect(r, "positions", sbprt_sp_positions(x, pos, 1, tl, 2), SBPRT_OK, NULL);
    int32_t got[4];
    sp_get(r, got, pos, sizeof got);
    for (int i = 0; i < tl; i++)
        if (got[i] != me * tl + i) {
            fail("seqpar errors, rank %d: position %d is %d", me, i, got[i]);
            break;
        }
    sp_expect(r, "sync at end", sbprt_sync(x), SBPRT_OK, NULL);
}

static int sp_dummy_alltoall(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    (void)user, (void)send, (void)recv, (void)bytes, (void)stream;
    return 1;
}

static void t_seqpar_errors(void)
{
    kstat *s = kstat_get("sp errors, exchange, index checks", 0);
    s->cases++;
    const int before = nfail;
    /* the communicator calls, on the main context */
    check_status("comm_size without one", sbprt_ctx_comm_size(G), 1);
    check_status("comm_rank without one", sbprt_ctx_comm_rank(G), 0);
    check_status("comm_size NULL", sbprt_ctx_comm_size(NULL), 1);
    sbprt_comm bad = {0, 0, sp_dummy_alltoall, NULL, 0};
    check_status("set_comm size 0", sbprt_ctx_set_comm(G, &bad), SBPRT_ERR_INVALID);
    bad.size = 2, bad.rank = 2;
    check_status("set_comm rank 2 of 2", sbprt_ctx_set_comm(G, &bad), SBPRT_ERR_INVALID);
    bad.rank = 1, bad.alltoall = NULL;
    check_status("set_comm no alltoall", sbprt_ctx_set_comm(G, &bad), SBPRT_ERR_INVALID);
    bad.alltoall = sp_dummy_alltoall;
    check_status("set_comm NULL ctx", sbprt_ctx_set_comm(NULL, &bad), SBPRT_ERR_INVALID);
    check_status("set_comm rank 1 of 2", sbprt_ctx_set_comm(G, &bad), SBPRT_OK);
    check_status("comm_size", sbprt_ctx_comm_size(G), 2);
    check_status("comm_rank", sbprt_ctx_comm_rank(G), 1);
    check_status("set_comm NULL (remove)", sbprt_ctx_set_comm(G, NULL), SBPRT_OK);
    check_status("comm_size after removal", sbprt_ctx_comm_size(G), 1);
    /* one rank without a communicator: positions are 0 .. tl-1; 2 ranks need one */
    int32_t *pos = dnew(5 * sizeof(int32_t)), got[5];
    check_status("sp_positions nranks 1", sbprt_sp_positions(G, pos, 1, 5, 1), SBPRT_OK);
    download(got, pos, sizeof got);
    for (int i = 0; i < 5; i++)
        if (got[i] != i) {
            fail("sp_positions without a communicator: %d at %d", got[i], i);
            break;
        }
    check_status("sp_positions nranks 2 without a communicator",
                 sbprt_sp_positions(G, pos, 1, 5, 2), SBPRT_ERR_INVALID);
    sbprt_arena_free(G, pos);
    /* two ranks */
    sp_rank ranks[SP_MAXR];
    sp_group g;
    sp_run(ranks, &g, 2, &sp_cuda, 0, sp_body_errors, NULL);
    if (nfail != before)
        s->fails++;
    hfree_all();
}

static void t_seqpar(void)
{
    static const int docs_a[] = {5, 1, 37, 9, 0}, docs_b[] = {1, 30, 3, 0};
    static const sp_case small[] = {
        {"MHA", 2, 2, 24, 4, 4, 16, 24, 0, 0, NULL, 0},
        {"GQA, 2 kv heads a rank, chunks", 2, 1, 40, 8, 4, 8, 16, 0, 0, NULL, 0},
        {"GQA, 1 kv head a rank", 2, 2, 33, 4, 2, 16, 20, 0, 0, NULL, 0},
        {"MQA: kv head replicated", 2, 2, 24, 4, 1, 16, 12, 0, 0, NULL, 0},
        {"window", 2, 1, 40, 4, 2, 16, 16, 13, 0, NULL, 0},
        {"softcap", 2, 2, 24, 4, 1, 16, 24, 0, 2.0f, NULL, 0},
        {"packed documents", 2, 2, 40, 4, 2, 16, 16, 0, 0, docs_a, 0},
        {"documents, window, softcap", 2, 1, 36, 4, 1, 16, 20, 20, 5.0f, docs_b, 1},
        {"4 ranks, kv heads on 2 each", 4, 1, 16, 8, 2, 8, 16, 0, 0, docs_a, 0},
        {"one rank (a group of one)", 1, 2, 40, 4, 2, 16, 16, 9, 0, docs_a, 0},
    };
    static const sp_case full[] = {
        {"MHA", 2, 2, 256, 8, 8, 64, 256, 0, 0, NULL, 0},
        {"GQA, 2 kv heads a rank, chunks", 2, 1, 512, 16, 4, 64, 128, 0, 0, NULL, 0},
        {"GQA, 1 kv head a rank", 2, 2, 300, 8, 2, 64, 100, 0, 0, NULL, 0},
        {"MQA: kv head replicated", 2, 2, 256, 8, 1, 128, 128, 0, 0, NULL, 0},
        {"window", 2, 1, 512, 8, 2, 64, 200, 100, 0, NULL, 0},
        {"softcap", 2, 2, 256, 8, 1, 64, 256, 0, 30.0f, NULL, 1},
        {"packed documents", 2, 2, 384, 8, 2, 64, 128, 0, 0, docs_a, 0},
        {"documents, window, softcap", 2, 1, 300, 8, 1, 80, 150, 77, 30.0f, docs_b, 1},
        {"4 ranks, kv heads on 2 each", 4, 1, 256, 8, 2, 64, 128, 0, 0, docs_a, 0},
        {"one rank (a group of one)", 1, 2, 256, 8, 2, 64, 128, 64, 0, docs_a, 0},
    };
    const sp_case *cases = quick ? small : full;
    const int nc = quick ? (int)(sizeof small / sizeof small[0]) : (int)(sizeof full / sizeof full[0]);
    for (int i = 0; i < nc; i++) {
        t_seqpar_case(&cases[i]);
        hfree_all();
    }
    t_seqpar_errors();
}

/* ---- report ------------------------------------------------------------------------------- */

static void report(double total_ms)
{
    printf("\n%-36s %6s %12s %8s %6s %11s  %s\n", "kernel", "cases", "max rel err", "tol", "det",
           "time (ms)", "status");
    int kernels = 0, cases = 0, bad = 0;
    for (int i = 0; i < nstats; i++) {
        const kstat *s = &stats[i];
        char err[16] = "-", tol[16] = "-", ms[16] = "-";
        if (s->tol > 0) {
            snprintf(err, sizeof err, "%.2e", s->max_err);
            snprintf(tol, sizeof tol, "%.0e", s->tol);
            kernels++;
        }
        if (s->ms >= 0)
            snprintf(ms, sizeof ms, "%.3f", s->ms);
        printf("%-36s %6d %12s %8s %6s %11s  %s\n", s->name, s->cases, err, tol,
               s->tol > 0 ? (s->nondet ? "NO" : "yes") : "-", ms, s->fails ? "FAIL" : "ok");
        cases += s->cases;
        bad += s->fails > 0;
    }
    printf("\nsummary: %d kernels (%d cases with the checks above) on %s backend vs cpu twin: "
           "%s; %d failed checks; %.1f s\n",
           kernels, cases, sbprt_backend_name(), bad ? "FAILED" : "all passed", nfail,
           total_ms / 1e3);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--only GROUP]\n", argv[0]);
            return 2;
        }
    }
    if (quick)
        reps = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);

    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIPPED: no CUDA device (%s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount = 0");
        return EXIT_SKIP;
    }
    int dev = 0;
    struct cudaDeviceProp prop;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        printf("device %d: %s, %d SMs, %.1f GiB, sm_%d%d\n", dev, prop.name,
               prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.major,
               prop.minor);
    if (sbprt_ctx_create(&G, 0) != SBPRT_OK) {
        printf("FAIL: sbprt_ctx_create on the CUDA backend: %s\n", sbprt_ctx_last_error(NULL));
        return 1;
    }
    if (cpuref_sbprt_ctx_create(&C, 0) != SBPRT_OK) {
        printf("FAIL: sbprt_ctx_create on the CPU twin\n");
        return 1;
    }
    printf("sizes: %s; CPU twin on %d threads\n", quick ? "quick" : "full",
           cpuref_sbprt_ctx_nthreads(C));

    const double t0 = now_ms();
    struct {
        const char *name;
        void (*fn)(void);
    } groups[] = {
        {"memory", t_memory},   {"gemm", t_gemm},           {"bias", t_bias},
        {"elementwise", t_elementwise}, {"embedding", t_embedding}, {"norm", t_norm},
        {"rope", t_rope},       {"attention", t_attention},
        {"attention packed", t_attention_packed}, {"loss", t_loss},
        {"optim", t_optim},     {"extra", t_extra},         {"bf16 gemm", t_bf16_gemm},
        {"bf16 elementwise", t_bf16_bias_ew}, {"bf16 rows", t_bf16_rows},
        {"bf16 attn, loss", t_bf16_attention_loss}, {"bf16 layout", t_bf16_layout},
        {"moe", t_moe},         {"seqpar", t_seqpar},       {"index checks", t_range_errors},
        {"errors", t_errors},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        if (only && strcmp(only, groups[i].name) != 0)
            continue;
        const double g0 = now_ms();
        groups[i].fn();
        printf("  %-14s done in %7.2f s (%d failed checks so far)\n", groups[i].name,
               (now_ms() - g0) / 1e3, nfail);
    }
    report(now_ms() - t0);
    sbprt_ctx_destroy(G);
    cpuref_sbprt_ctx_destroy(C);
    return nfail ? 1 : 0;
}
