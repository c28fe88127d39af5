/*
 * test_seqpar.c — the sequence-parallel kernels (sbprt.h, "sequence parallelism";
 * runtime/cpu/seqpar.c) run as N ranks in one process.
 *
 * Each rank is a pthread with its own context and a loopback communicator: the ranks of a
 * group share an exchange area (every rank's send pointer and block size) and a barrier, so
 * an all-to-all is "publish, wait, copy block `rank` of everyone's send, wait" (the second
 * wait keeps a send buffer alive until every peer has read it).  A thread never calls a
 * cmocka assertion (cmocka unwinds with longjmp, which must stay on the test's thread): it
 * records statuses and mismatches, and the main thread checks them after the join.  Every
 * thread makes all of its calls even after a failure, so a broken rank cannot leave the
 * others waiting at the barrier.
 *
 * The reference is naive attention in double over the WHOLE sequence (T = N * tl positions),
 * written here from the mask's definition (causal, sliding window, tanh cap, documents) and
 * its analytic gradient; each rank's forward output, its dq increment and, after
 * sbprt_sp_kv_scatter, its dk and dv increments are compared with the reference rows of its
 * tokens (‖Δ‖ / ‖ref‖ <= 1e-5).  The cases cover MHA, GQA with hkv % N == 0, kv heads
 * replicated over ranks (N % hkv == 0, MQA included), a window, a cap, packed documents whose
 * boundaries cross ranks (with sbprt_sp_gather_rows, sbprt_doc_starts over the gathered ids
 * and sbprt_sp_doc_positions checked exactly), two batch rows, StreamBP-style query chunks
 * (two chunks covering tl), the scalar path (d not a multiple of 8) and key spans over
 * several 64-key tiles; each at N = 1 (no communicator), 2 and 4.  Every case runs three
 * times, twice with one thread per context and once with three, and all runs must agree
 * bitwise; the forward must also equal, bitwise, the plain packed kernel over the whole
 * sequence (attention.c computes each row from its own q and the keys alone).
 * The refusals are checked on one thread with a fake communicator that counts its calls: a
 * refused call must not exchange anything nor write its outputs.
 */
#define _POSIX_C_SOURCE 200809L /* pthread barriers under a strict -std=c11 too */
#include <pthread.h>
#include <stdio.h>

#include "rt_test.h"

#define MAXN 4

/* ---- loopback communicator ------------------------------------------------------------ */

typedef struct {
    int n;
    pthread_barrier_t bar;
    const void *send[MAXN];
    size_t bytes[MAXN];
} lb_group;

typedef struct {
    lb_group *g;
    int rank;
    int calls;
} lb_rank;

static int lb_alltoall(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    lb_rank *me = user;
    lb_group *g = me->g;
    me->calls++;
    g->send[me->rank] = send;
    g->bytes[me->rank] = bytes;
    pthread_barrier_wait(&g->bar);
    int ok = stream == NULL; /* the CPU backend passes no stream */
    for (int i = 0; i < g->n; i++)
        ok = ok && g->bytes[i] == bytes; /* every rank must exchange the same size */
    if (ok)
        for (int i = 0; i < g->n; i++)
            memcpy((char *)recv + (size_t)i * bytes,
                   (const char *)g->send[i] + (size_t)me->rank * bytes, bytes);
    pthread_barrier_wait(&g->bar);
    return ok ? 0 : 1;
}

/* Allocation on a rank's thread: no cmocka there (see the top), so a failure aborts. */
static void *th_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}
#define TH_NEW(type, n) ((type *)th_alloc((size_t)(n) * sizeof(type)))

/* ---- cases ---------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int b, tl, hq, hkv, d;
    int window;     /* 0: none */
    double softcap; /* 0: none */
    int docs;       /* packed documents */
    int chunk;      /* 0: one call over tl; c: two chunks [0, c) and [c, tl) */
} spcase;

/* The heads rule, written from the header's words. */
static int heads_ok(int hq, int hkv, int n)
{
    return hq % hkv == 0 && hq % n == 0 && (hkv % n == 0 || n % hkv == 0);
}
static int kv_heads_of(int hkv, int n) { return hkv % n == 0 ? hkv / n : 1; }

/* One case at one N: the whole-sequence tensors, the reference, and what each rank gives. */
typedef struct {
    const spcase *c;
    int n, T, hkv_r;
    float scale;
    float *Q, *K, *V, *DO;            /* [b, T, hq|hkv, d] */
    float *DQ0, *DK0, *DV0;           /* the gradients' starting values (they accumulate) */
    int32_t *ids, *starts;            /* [b, T] document ids and their starts (or NULL) */
    double *out_ref, *dq_ref, *dk_ref, *dv_ref; /* increments for the gradients */
} spdata;

typedef struct {
    const spdata *s;
    sbprt_ctx *ctx;
    lb_rank comm;
    int rank;
    int status;     /* first non-OK status of a call */
    int bad_index;  /* positions / gathered ids / starts / kh differed from the expected */
    float *out, *dq, *dk, *dv; /* [b, tl, ...]: this rank's rows */
    float *lse;                /* the chunks' lse, one after the other */
} rank_job;

static size_t rows_len(const spdata *s, int t, int heads) { return (size_t)s->c->b * t * heads * s->c->d; }

/* dst [b, t, heads, d] = rows r0 .. r0 + t - 1 of src [b, T, heads, d] */
static void take_rows(float *dst, const float *src, int b, int T, int r0, int t, int heads,
                      int d)
{
    const size_t w = (size_t)heads * d;
    for (int bi = 0; bi < b; bi++)
        memcpy(dst + (size_t)bi * t * w, src + ((size_t)bi * T + r0) * w, (size_t)t * w * sizeof(float));
}
/* the inverse: rows r0 .. of dst [b, T, ...] = src [b, t, ...] */
static void put_rows(float *dst, const float *src, int b, int T, int r0, int t, int heads,
                     int d)
{
    const size_t w = (size_t)heads * d;
    for (int bi = 0; bi < b; bi++)
        memcpy(dst + ((size_t)bi * T + r0) * w, src + (size_t)bi * t * w, (size_t)t * w * sizeof(float));
}

/* ---- reference ------------------------------------------------------------------------ */

/* Whole-sequence attention in double: out, and dq, dk, dv (zeroed here) for the loss
 * Σ DO · out. */
static void reference(spdata *s)
{
    const spcase *c = s->c;
    const int T = s->T, hq = c->hq, hkv = c->hkv, d = c->d, group = hq / hkv;
    const double scale = s->scale, cap = c->softcap;
    const size_t nq = rows_len(s, T, hq), nk = rows_len(s, T, hkv);
    s->out_ref = RT_NEW(double, nq);
    s->dq_ref = RT_NEW(double, nq);
    s->dk_ref = RT_NEW(double, nk);
    s->dv_ref = RT_NEW(double, nk);
    memset(s->dq_ref, 0, nq * sizeof(double));
    memset(s->dk_ref, 0, nk * sizeof(double));
    memset(s->dv_ref, 0, nk * sizeof(double));
    double *p = RT_NEW(double, T), *dcap = RT_NEW(double, T), *dp = RT_NEW(double, T);
    for (int bi = 0; bi < c->b; bi++)
        for (int h = 0; h < hq; h++)
            for (int P = 0; P < T; P++) {
                const int g = h / group;
                int lo = s->starts ? s->starts[(size_t)bi * T + P] : 0;
                if (c->window > 0 && P - c->window + 1 > lo)
                    lo = P - c->window + 1;
                const float *q = s->Q + (((size_t)bi * T + P) * hq + h) * d;
                const float *dout = s->DO + (((size_t)bi * T + P) * hq + h) * d;
                double m = -INFINITY;
                for (int j = lo; j <= P; j++) {
                    const float *k = s->K + (((size_t)bi * T + j) * hkv + g) * d;
                    double dot = 0;
                    for (int e = 0; e < d; e++)
                        dot += (double)q[e] * k[e];
                    p[j] = scale * dot;
                    dcap[j] = 1;
                    if (cap > 0) {
                        const double th = tanh(p[j] / cap);
                        p[j] = cap * th;
                        dcap[j] = 1 - th * th;
                    }
                    m = p[j] > m ? p[j] : m;
                }
                double sum = 0;
                for (int j = lo; j <= P; j++)
                    sum += exp(p[j] - m);
                double *o = s->out_ref + (((size_t)bi * T + P) * hq + h) * d;
                for (int e = 0; e < d; e++)
                    o[e] = 0;
                double delta = 0;
                for (int j = lo; j <= P; j++) {
                    p[j] = exp(p[j] - m) / sum;
                    const float *v = s->V + (((size_t)bi * T + j) * hkv + g) * d;
                    dp[j] = 0;
                    for (int e = 0; e < d; e++) {
                        o[e] += p[j] * v[e];
                        dp[j] += (double)dout[e] * v[e];
                    }
                    delta += p[j] * dp[j];
                }
                double *dq = s->dq_ref + (((size_t)bi * T + P) * hq + h) * d;
                for (int j = lo; j <= P; j++) {
                    const size_t ko = (((size_t)bi * T + j) * hkv + g) * d;
                    const double ds = p[j] * (dp[j] - delta) * dcap[j];
                    for (int e = 0; e < d; e++) {
                        dq[e] += scale * ds * s->K[ko + e];
                        s->dk_ref[ko + e] += scale * ds * q[e];
                        s->dv_ref[ko + e] += p[j] * dout[e];
                    }
                }
            }
    free(p);
    free(dcap);
    free(dp);
}

/* ---- one rank ------------------------------------------------------------------------- */

static void note(rank_job *j, int st)
{
    if (st != SBPRT_OK && j->status == SBPRT_OK)
        j->status = st;
}

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    const spdata *s = j->s;
    const spcase *c = s->c;
    const int n = s->n, r = j->rank, tl = c->tl, T = s->T, b = c->b, hq = c->hq,
              hkv = c->hkv, d = c->d, hr = s->hkv_r;
    sbprt_ctx *ctx = j->ctx;

    /* this rank's rows of everything */
    float *q = TH_NEW(float, rows_len(s, tl, hq)), *dout = TH_NEW(float, rows_len(s, tl, hq));
    float *k = TH_NEW(float, rows_len(s, tl, hkv)), *v = TH_NEW(float, rows_len(s, tl, hkv));
    take_rows(q, s->Q, b, T, r * tl, tl, hq, d);
    take_rows(dout, s->DO, b, T, r * tl, tl, hq, d);
    take_rows(k, s->K, b, T, r * tl, tl, hkv, d);
    take_rows(v, s->V, b, T, r * tl, tl, hkv, d);
    take_rows(j->dq, s->DQ0, b, T, r * tl, tl, hq, d);
    take_rows(j->dk, s->DK0, b, T, r * tl, tl, hkv, d);
    take_rows(j->dv, s->DV0, b, T, r * tl, tl, hkv, d);

    /* positions */
    int32_t *pos = TH_NEW(int32_t, (size_t)b * tl);
    note(j, sbprt_sp_positions(ctx, pos, b, tl, n));
    for (int bi = 0; bi < b; bi++)
        for (int i = 0; i < tl; i++)
            j->bad_index |= pos[(size_t)bi * tl + i] != r * tl + i;

    /* documents: the whole rows' ids from every rank's share, their starts, the positions */
    int32_t *starts = NULL;
    if (c->docs) {
        int32_t *mine = TH_NEW(int32_t, (size_t)b * tl), *all = TH_NEW(int32_t, (size_t)b * T);
        int32_t *xs = TH_NEW(int32_t, (size_t)n * tl);
        for (int bi = 0; bi < b; bi++)
            memcpy(mine + (size_t)bi * tl, s->ids + (size_t)bi * T + r * tl,
                   (size_t)tl * sizeof(int32_t));
        note(j, sbprt_sp_gather_rows(ctx, all, mine, xs, b, tl, n));
        j->bad_index |= memcmp(all, s->ids, (size_t)b * T * sizeof(int32_t)) != 0;
        starts = TH_NEW(int32_t, (size_t)b * T);
        note(j, sbprt_doc_starts(ctx, starts, all, b, T));
        j->bad_index |= memcmp(starts, s->starts, (size_t)b * T * sizeof(int32_t)) != 0;
        note(j, sbprt_sp_doc_positions(ctx, pos, starts, b, tl, n));
        for (int bi = 0; bi < b; bi++)
            for (int i = 0; i < tl; i++) {
                const int P = r * tl + i;
                j->bad_index |= pos[(size_t)bi * tl + i] != P - s->starts[(size_t)bi * T + P];
            }
        free(mine);
        free(all);
        free(xs);
    }

    /* K and V of this rank's heads over the whole sequence; kh checked element by element */
    const size_t nkh = (size_t)b * T * hr * d;
    float *kh = TH_NEW(float, nkh), *vh = TH_NEW(float, nkh);
    float *kx = TH_NEW(float, (size_t)n * tl * hr * d);
    note(j, sbprt_sp_kv_gather(ctx, kh, k, kx, b, tl, hq, hkv, d, n));
    note(j, sbprt_sp_kv_gather(ctx, vh, v, kx, b, tl, hq, hkv, d, n));
    const int kv0 = hkv % n == 0 ? r * (hkv / n) : (r * (hq / n)) / (hq / hkv);
    for (int bi = 0; bi < b; bi++)
        for (int P = 0; P < T; P++)
            for (int g = 0; g < hr; g++)
                for (int e = 0; e < d; e++) {
                    const size_t at = (((size_t)bi * T + P) * hr + g) * d + e;
                    const size_t from = (((size_t)bi * T + P) * hkv + kv0 + g) * d + e;
                    j->bad_index |= kh[at] != s->K[from] || vh[at] != s->V[from];
                }

    /* the query chunks */
    int qs[2] = {0, c->chunk}, qt[2] = {c->chunk ? c->chunk : tl, tl - c->chunk};
    const int nchunks = c->chunk ? 2 : 1;
    const size_t big = rows_len(s, tl, hq);
    float *s1 = TH_NEW(float, big), *s2 = TH_NEW(float, big), *s3 = TH_NEW(float, big),
          *s4 = TH_NEW(float, big);
    float *qc = TH_NEW(float, big), *oc = TH_NEW(float, big), *gc = TH_NEW(float, big),
          *dqc = TH_NEW(float, big);
    size_t lse_at[2] = {0, (size_t)b * hq * qt[0]};
    for (int x = 0; x < nchunks; x++) {
        take_rows(qc, q, b, tl, qs[x], qt[x], hq, d);
        note(j, sbprt_sp_attention_forward(ctx, oc, j->lse + lse_at[x], qc, kh, vh, starts, s1,
                                           s2, b, qt[x], tl, hq, hkv, d, qs[x], s->scale,
                                           c->window, (float)c->softcap, n));
        put_rows(j->out, oc, b, tl, qs[x], qt[x], hq, d);
    }

    /* backward, chunk by chunk, into dq (this rank's rows) and dkh, dvh (its heads) */
    float *dkh = TH_NEW(float, nkh), *dvh = TH_NEW(float, nkh);
    memset(dkh, 0, nkh * sizeof(float));
    memset(dvh, 0, nkh * sizeof(float));
    for (int x = nchunks - 1; x >= 0; x--) { /* StreamBP's backward order */
        take_rows(qc, q, b, tl, qs[x], qt[x], hq, d);
        take_rows(oc, j->out, b, tl, qs[x], qt[x], hq, d);
        take_rows(gc, dout, b, tl, qs[x], qt[x], hq, d);
        take_rows(dqc, j->dq, b, tl, qs[x], qt[x], hq, d);
        note(j, sbprt_sp_attention_backward(ctx, dqc, dkh, dvh, gc, qc, kh, vh, oc,
                                            j->lse + lse_at[x], starts, s1, s2, s3, s4, b,
                                            qt[x], tl, hq, hkv, d, qs[x], s->scale, c->window,
                                            (float)c->softcap, n));
        put_rows(j->dq, dqc, b, tl, qs[x], qt[x], hq, d);
    }
    note(j, sbprt_sp_kv_scatter(ctx, j->dk, dkh, kx, b, tl, hq, hkv, d, n));
    note(j, sbprt_sp_kv_scatter(ctx, j->dv, dvh, kx, b, tl, hq, hkv, d, n));

    free(q), free(dout), free(k), free(v), free(pos), free(starts), free(kh), free(vh);
    free(kx), free(s1), free(s2), free(s3), free(s4), free(qc), free(oc), free(gc), free(dqc);
    free(dkh), free(dvh);
    return NULL;
}

/* ---- driver --------------------------------------------------------------------------- */

static double max_err[4]; /* out, dq, dk, dv over every case and rank */

/* Runs the group: n threads, contexts with nthreads each; jobs[r] keep the results. */
static void run_group(const spdata *s, rank_job *jobs, int nthreads)
{
    const spcase *c = s->c;
    const int n = s->n, tl = c->tl;
    lb_group g = {.n = n};
    assert_int_equal(pthread_barrier_init(&g.bar, NULL, (unsigned)n), 0);
    pthread_t th[MAXN];
    for (int r = 0; r < n; r++) {
        rank_job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->s = s;
        j->rank = r;
        /* created here, one per rank, each then used by its thread alone */
        j->ctx = rt_ctx(nthreads);
        if (n > 1) { /* N = 1 runs without a communicator */
            j->comm = (lb_rank){.g = &g, .rank = r};
            sbprt_comm comm = {.rank = r, .size = n, .alltoall = lb_alltoall, .user = &j->comm};
            rt_assert_ok(sbprt_ctx_set_comm(j->ctx, &comm));
            assert_int_equal(sbprt_ctx_comm_size(j->ctx), n);
            assert_int_equal(sbprt_ctx_comm_rank(j->ctx), r);
        }
        j->out = RT_NEW(float, rows_len(s, tl, c->hq));
        j->dq = RT_NEW(float, rows_len(s, tl, c->hq));
        j->dk = RT_NEW(float, rows_len(s, tl, c->hkv));
        j->dv = RT_NEW(float, rows_len(s, tl, c->hkv));
        j->lse = RT_NEW(float, (size_t)c->b * c->hq * tl);
    }
    for (int r = 0; r < n; r++)
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    for (int r = 0; r < n; r++)
        assert_int_equal(pthread_join(th[r], NULL), 0);
    pthread_barrier_destroy(&g.bar);
    for (int r = 0; r < n; r++) {
        sbprt_ctx_destroy(jobs[r].ctx);
        jobs[r].ctx = NULL;
        if (jobs[r].status != SBPRT_OK)
            print_error("%s N=%d rank %d: status %s\n", c->name, n, r,
                        sbprt_status_string(jobs[r].status));
        rt_assert_ok(jobs[r].status);
        assert_false(jobs[r].bad_index);
        /* two K/V gathers and two scatters (one exchange per batch row each), per chunk one
         * forward exchange pair and four backward exchanges; documents: one per batch row */
        if (n > 1) {
            const int nchunks = c->chunk ? 2 : 1;
            assert_int_equal(jobs[r].comm.calls,
                             4 * c->b + nchunks * 6 + (c->docs ? c->b : 0));
        }
    }
}

static void free_jobs(rank_job *jobs, int n)
{
    for (int r = 0; r < n; r++) {
        free(jobs[r].out), free(jobs[r].dq), free(jobs[r].dk), free(jobs[r].dv);
        free(jobs[r].lse);
    }
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The increment after - before of rank r's rows against the reference rows of its tokens. */
static double rank_err(const spdata *s, int r, const float *got, const float *before_all,
                       const double *ref_all, int heads)
{
    const spcase *c = s->c;
    const size_t n = rows_len(s, c->tl, heads), w = (size_t)heads * c->d;
    float *before = before_all ? RT_NEW(float, n) : NULL;
    double *ref = RT_NEW(double, n);
    if (before)
        take_rows(before, before_all, c->b, s->T, r * c->tl, c->tl, heads, c->d);
    for (int bi = 0; bi < c->b; bi++)
        memcpy(ref + (size_t)bi * c->tl * w, ref_all + ((size_t)bi * s->T + r * c->tl) * w,
               (size_t)c->tl * w * sizeof(double));
    const double e = before ? rt_rel_err_delta(got, before, ref, n) : rt_rel_err(got, ref, n);
    free(before);
    free(ref);
    return e;
}

static void run_case(const spcase *c, int n)
{
    if (!heads_ok(c->hq, c->hkv, n))
        fail_msg("case %s is not valid at N=%d", c->name, n);
    spdata s = {.c = c, .n = n, .T = n * c->tl, .hkv_r = kv_heads_of(c->hkv, n)};
    s.scale = 1.0f / sqrtf((float)c->d);
    rt_rng rng = {0x5E9ull * 1000003 + (uint64_t)n * 7919 + (uint64_t)c->tl * 31 + c->hq};
    const int T = s.T;
    const size_t nq = rows_len(&s, T, c->hq), nk = rows_len(&s, T, c->hkv);
    s.Q = rt_random(&rng, nq, -2, 2);
    s.K = rt_random(&rng, nk, -2, 2);
    s.V = rt_random(&rng, nk, -1, 1);
    s.DO = rt_random(&rng, nq, -1, 1);
    s.DQ0 = rt_random(&rng, nq, -1, 1);
    s.DK0 = rt_random(&rng, nk, -1, 1);
    s.DV0 = rt_random(&rng, nk, -1, 1);
    if (c->docs) {
        /* documents of 1 .. 2*tl/3 + 1 tokens: several per rank's share, boundaries on both
         * sides of the ranks' edges, a different cut for every batch row */
        s.ids = RT_NEW(int32_t, (size_t)c->b * T);
        s.starts = RT_NEW(int32_t, (size_t)c->b * T);
        for (int bi = 0; bi < c->b; bi++) {
            int id = 3 * bi, start = 0, left = 1 + rt_randint(&rng, 2 * c->tl / 3 + 1);
            for (int P = 0; P < T; P++, left--) {
                if (left == 0) {
                    id++;
                    start = P;
                    left = 1 + rt_randint(&rng, 2 * c->tl / 3 + 1);
                }
                s.ids[(size_t)bi * T + P] = id;
                s.starts[(size_t)bi * T + P] = start;
            }
        }
    }
    reference(&s);

    rank_job runs[3][MAXN];
    const int threads[3] = {1, 1, 3};
    for (int run = 0; run < 3; run++)
        run_group(&s, runs[run], threads[run]);

    const size_t lq = rows_len(&s, c->tl, c->hq), lk = rows_len(&s, c->tl, c->hkv);
    const size_t llse = (size_t)c->b * c->hq * c->tl;
    for (int r = 0; r < n; r++) {
        const rank_job *j = &runs[0][r];
        const double e[4] = {
            rank_err(&s, r, j->out, NULL, s.out_ref, c->hq),
            rank_err(&s, r, j->dq, s.DQ0, s.dq_ref, c->hq),
            rank_err(&s, r, j->dk, s.DK0, s.dk_ref, c->hkv),
            rank_err(&s, r, j->dv, s.DV0, s.dv_ref, c->hkv),
        };
        static const char *what[4] = {"out", "dq", "dk", "dv"};
        for (int x = 0; x < 4; x++) {
            char label[96];
            snprintf(label, sizeof label, "%s N=%d r%d %s", c->name, n, r, what[x]);
            rt_assert_err(e[x], RT_TOL, label);
            if (e[x] > max_err[x])
                max_err[x] = e[x];
        }
        /* run to run, and one thread against three: bitwise */
        for (int run = 1; run < 3; run++) {
            const rank_job *o = &runs[run][r];
            assert_true(same(j->out, o->out, lq));
            assert_true(same(j->lse, o->lse, llse));
            assert_true(same(j->dq, o->dq, lq));
            assert_true(same(j->dk, o->dk, lk));
            assert_true(same(j->dv, o->dv, lk));
        }
    }

    /* the forward is the plain packed kernel's over the whole sequence, bitwise */
    sbprt_ctx *ctx = rt_ctx(1);
    float *plain = RT_NEW(float, nq), *mine = RT_NEW(float, lq);
    rt_assert_ok(sbprt_attention_forward_packed(ctx, plain, NULL, s.Q, s.K, s.V, s.starts, c->b,
                                                T, T, c->hq, c->hkv, c->d, 0, s.scale,
                                                c->window, (float)c->softcap));
    for (int r = 0; r < n; r++) {
        take_rows(mine, plain, c->b, T, r * c->tl, c->tl, c->hq, c->d);
        assert_true(same(mine, runs[0][r].out, lq));
    }
    sbprt_ctx_destroy(ctx);
    free(plain);
    free(mine);

    for (int run = 0; run < 3; run++)
        free_jobs(runs[run], n);
    free(s.Q), free(s.K), free(s.V), free(s.DO), free(s.DQ0), free(s.DK0), free(s.DV0);
    free(s.ids), free(s.starts);
    free(s.out_ref), free(s.dq_ref), free(s.dk_ref), free(s.dv_ref);
}

static void run_all_n(const spcase *c)
{
    const int ns[3] = {1, 2, 4};
    for (int x = 0; x < 3; x++)
        run_case(c, ns[x]);
}

/* b, tl, hq, hkv, d, window, softcap, docs, chunk */
static const spcase c_mha = {"mha", 1, 40, 4, 4, 16, 0, 0, 0, 0};
static const spcase c_gqa = {"gqa", 1, 40, 8, 4, 16, 0, 0, 0, 0};
static const spcase c_repl = {"replicated", 1, 40, 8, 2, 16, 0, 0, 0, 0}; /* N=4: replicated */
static const spcase c_mqa = {"mqa", 1, 36, 4, 1, 16, 0, 0, 0, 0};
static const spcase c_window = {"window", 1, 40, 4, 2, 16, 23, 0, 0, 0};
static const spcase c_softcap = {"softcap", 1, 40, 4, 2, 16, 0, 1.5, 0, 0};
static const spcase c_docs = {"docs", 1, 40, 4, 2, 16, 0, 0, 1, 0};
static const spcase c_batch = {"batch2", 2, 40, 4, 2, 16, 0, 0, 0, 0};
static const spcase c_chunk = {"chunked", 1, 40, 4, 4, 16, 0, 0, 0, 17};
static const spcase c_all = {"docs+window+cap+chunks", 2, 40, 8, 4, 16, 30, 2.0, 1, 17};
static const spcase c_scalar = {"scalar d=12", 2, 24, 4, 2, 12, 9, 2.0, 1, 10};
static const spcase c_tiles = {"tiles b=2 hkv=8", 2, 72, 8, 8, 16, 0, 0, 1, 40};

static void test_mha(void **st) { (void)st; run_all_n(&c_mha); }
static void test_gqa(void **st) { (void)st; run_all_n(&c_gqa); }
static void test_replicated(void **st) { (void)st; run_all_n(&c_repl); }
static void test_mqa(void **st) { (void)st; run_all_n(&c_mqa); }
static void test_window(void **st) { (void)st; run_all_n(&c_window); }
static void test_softcap(void **st) { (void)st; run_all_n(&c_softcap); }
static void test_docs(void **st) { (void)st; run_all_n(&c_docs); }
static void test_batch(void **st) { (void)st; run_all_n(&c_batch); }
static void test_chunked(void **st) { (void)st; run_all_n(&c_chunk); }
static void test_everything(void **st) { (void)st; run_all_n(&c_all); }
static void test_scalar_path(void **st) { (void)st; run_all_n(&c_scalar); }
static void test_tiles(void **st) { (void)st; run_all_n(&c_tiles); }

/* ---- refusals ------------------------------------------------------------------------- */

typedef struct {
    int calls;
    int ret;
} fake_comm;

static int fake_alltoall(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    (void)send, (void)recv, (void)bytes, (void)stream;
    fake_comm *f = user;
    f->calls++;
    return f->ret;
}

static sbprt_ctx *ctx_with(fake_comm *f, int rank, int size)
{
    sbprt_ctx *ctx = rt_ctx(1);
    sbprt_comm comm = {.rank = rank, .size = size, .alltoall = fake_alltoall, .user = f};
    rt_assert_ok(sbprt_ctx_set_comm(ctx, &comm));
    return ctx;
}

static void test_set_comm(void **st)
{
    (void)st;
    sbprt_ctx *ctx = rt_ctx(1);
    fake_comm f = {0, 0};
    assert_int_equal(sbprt_ctx_comm_size(ctx), 1);
    assert_int_equal(sbprt_ctx_comm_rank(ctx), 0);
    sbprt_comm comm = {.rank = 1, .size = 4, .alltoall = fake_alltoall, .user = &f};
    assert_int_equal(sbprt_ctx_set_comm(NULL, &comm), SBPRT_ERR_INVALID);
    sbprt_comm bad = comm;
    bad.size = 0, bad.rank = 0;
    assert_int_equal(sbprt_ctx_set_comm(ctx, &bad), SBPRT_ERR_INVALID);
    bad = comm, bad.rank = 4;
    assert_int_equal(sbprt_ctx_set_comm(ctx, &bad), SBPRT_ERR_INVALID);
    bad = comm, bad.rank = -1;
    assert_int_equal(sbprt_ctx_set_comm(ctx, &bad), SBPRT_ERR_INVALID);
    bad = comm, bad.alltoall = NULL;
    assert_int_equal(sbprt_ctx_set_comm(ctx, &bad), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_ctx_comm_size(ctx), 1); /* refusals installed nothing */
    rt_assert_ok(sbprt_ctx_set_comm(ctx, &comm));
    comm.rank = 3, comm.size = 8; /* a copy is kept */
    assert_int_equal(sbprt_ctx_comm_size(ctx), 4);
    assert_int_equal(sbprt_ctx_comm_rank(ctx), 1);
    rt_assert_ok(sbprt_ctx_set_comm(ctx, NULL));
    assert_int_equal(sbprt_ctx_comm_size(ctx), 1);
    assert_int_equal(sbprt_ctx_comm_rank(ctx), 0);
    sbprt_ctx_destroy(ctx);
}

/* Buffers for the refusal calls, big enough for every shape used below (b=1, tl=8, t=8,
 * hq<=8, hkv<=4, d=8, N<=4); outputs filled with a sentinel to see they stay untouched. */
enum { RB = 1, RTL = 8, RD = 8, RBIG = 4096 };
typedef struct {
    float *out, *lse, *q, *kh, *vh, *s[4], *dq, *dk;
    int32_t *ids, *all, *xs, *pos, *starts;
} rbufs;

static void rbufs_init(rbufs *b)
{
    rt_rng rng = {7};
    b->out = rt_random(&rng, RBIG, -1, 1);
    b->lse = rt_random(&rng, RBIG, -1, 1);
    b->q = rt_random(&rng, RBIG, -1, 1);
    b->kh = rt_random(&rng, RBIG, -1, 1);
    b->vh = rt_random(&rng, RBIG, -1, 1);
    for (int i = 0; i < 4; i++)
        b->s[i] = rt_random(&rng, RBIG, -1, 1);
    b->dq = rt_random(&rng, RBIG, -1, 1);
    b->dk = rt_random(&rng, RBIG, -1, 1);
    b->ids = RT_NEW(int32_t, RBIG);
    b->all = RT_NEW(int32_t, RBIG);
    b->xs = RT_NEW(int32_t, RBIG);
    b->pos = RT_NEW(int32_t, RBIG);
    b->starts = RT_NEW(int32_t, RBIG);
    for (int i = 0; i < RBIG; i++)
        b->ids[i] = 0, b->all[i] = -7, b->xs[i] = -7, b->pos[i] = -7, b->starts[i] = 0;
}

static void rbufs_free(rbufs *b)
{
    free(b->out), free(b->lse), free(b->q), free(b->kh), free(b->vh), free(b->dq), free(b->dk);
    for (int i = 0; i < 4; i++)
        free(b->s[i]);
    free(b->ids), free(b->all), free(b->xs), free(b->pos), free(b->starts);
}

/* Every sp function on (hq, hkv, nranks) with valid sizes otherwise; each must give `want`.
 * For a refusal (INVALID or RANGE), nothing may be exchanged or written. */
static void expect_all(sbprt_ctx *ctx, fake_comm *f, rbufs *b, int hq, int hkv, int nranks,
                       int want, int heads_only)
{
    float *out0 = rt_copy(b->out, RBIG), *dq0 = rt_copy(b->dq, RBIG), *dk0 = rt_copy(b->dk, RBIG);
    float *kh0 = rt_copy(b->kh, RBIG), *lse0 = rt_copy(b->lse, RBIG);
    const int calls0 = f ? f->calls : 0;
    const float sc = 0.3f;
    assert_int_equal(sbprt_sp_kv_gather(ctx, b->kh, b->q, b->s[0], RB, RTL, hq, hkv, RD, nranks),
                     want);
    assert_int_equal(sbprt_sp_kv_scatter(ctx, b->dk, b->kh, b->s[0], RB, RTL, hq, hkv, RD,
                                         nranks),
                     want);
    assert_int_equal(sbprt_sp_attention_forward(ctx, b->out, b->lse, b->q, b->kh, b->vh, NULL,
                                                b->s[0], b->s[1], RB, RTL, RTL, hq, hkv, RD, 0,
                                                sc, 0, 0.0f, nranks),
                     want);
    assert_int_equal(sbprt_sp_attention_backward(ctx, b->dq, b->kh, b->vh, b->q, b->q, b->kh,
                                                 b->vh, b->out, b->lse, NULL, b->s[0], b->s[1],
                                                 b->s[2], b->s[3], RB, RTL, RTL, hq, hkv, RD, 0,
                                                 sc, 0, 0.0f, nranks),
                     want);
    if (!heads_only) {
        assert_int_equal(sbprt_sp_positions(ctx, b->pos, RB, RTL, nranks), want);
        assert_int_equal(sbprt_sp_gather_rows(ctx, b->all, b->ids, b->xs, RB, RTL, nranks), want);
        assert_int_equal(sbprt_sp_doc_positions(ctx, b->pos, b->starts, RB, RTL, nranks), want);
    }
    if (want == SBPRT_ERR_INVALID || want == SBPRT_ERR_RANGE) {
        if (f)
            assert_int_equal(f->calls, calls0);
        assert_true(same(b->out, out0, RBIG));
        assert_true(same(b->dq, dq0, RBIG));
        assert_true(same(b->dk, dk0, RBIG));
        assert_true(same(b->kh, kh0, RBIG));
        assert_true(same(b->lse, lse0, RBIG));
        for (int i = 0; i < RBIG; i++)
            assert_true(b->pos[i] == -7 && b->all[i] == -7);
    }
    free(out0), free(dq0), free(dk0), free(kh0), free(lse0);
}

static void test_refuse_heads(void **st)
{
    (void)st;
    rbufs b;
    rbufs_init(&b);
    fake_comm f = {0, 0};
    sbprt_ctx *c4 = ctx_with(&f, 1, 4), *c2 = ctx_with(&f, 1, 2);
    expect_all(c4, &f, &b, 6, 2, 4, SBPRT_ERR_INVALID, 1); /* hq % N != 0 */
    expect_all(c2, &f, &b, 6, 3, 2, SBPRT_ERR_INVALID, 1); /* hkv % N != 0, N % hkv != 0 */
    expect_all(c4, &f, &b, 8, 3, 4, SBPRT_ERR_INVALID, 1); /* hq % hkv != 0 */
    expect_all(c4, &f, &b, 0, 2, 4, SBPRT_ERR_INVALID, 1); /* no heads */
    expect_all(c4, &f, &b, 8, 0, 4, SBPRT_ERR_INVALID, 1);
    assert_int_equal(f.calls, 0);
    sbprt_ctx_destroy(c4);
    sbprt_ctx_destroy(c2);
    rbufs_free(&b);
}

static void test_refuse_nranks(void **st)
{
    (void)st;
    rbufs b;
    rbufs_init(&b);
    fake_comm f = {0, 0};
    sbprt_ctx *c2 = ctx_with(&f, 0, 2), *plain = rt_ctx(1);
    expect_all(c2, &f, &b, 8, 4, 4, SBPRT_ERR_INVALID, 0);    /* nranks 4, group of 2 */
    expect_all(c2, &f, &b, 8, 4, 1, SBPRT_ERR_INVALID, 0);    /* nranks 1, group of 2 */
    expect_all(plain, NULL, &b, 8, 4, 2, SBPRT_ERR_INVALID, 0); /* no communicator */
    expect_all(plain, NULL, &b, 8, 4, 0, SBPRT_ERR_INVALID, 0);
    assert_int_equal(f.calls, 0);
    sbprt_ctx_destroy(c2);
    sbprt_ctx_destroy(plain);
    rbufs_free(&b);
}

/* A failing all-to-all is SBPRT_ERR_BACKEND, returned at the first exchange. */
static void test_alltoall_failure(void **st)
{
    (void)st;
    rbufs b;
    rbufs_init(&b);
    fake_comm f = {0, 5};
    sbprt_ctx *c2 = ctx_with(&f, 0, 2);
    const float sc = 0.3f;
    f.calls = 0;
    assert_int_equal(sbprt_sp_gather_rows(c2, b.all, b.ids, b.xs, RB, RTL, 2), SBPRT_ERR_BACKEND);
    assert_int_equal(f.calls, 1);
    f.calls = 0;
    assert_int_equal(sbprt_sp_kv_gather(c2, b.kh, b.q, b.s[0], RB, RTL, 8, 4, RD, 2),
                     SBPRT_ERR_BACKEND);
    assert_int_equal(f.calls, 1);
    f.calls = 0;
    assert_int_equal(sbprt_sp_kv_scatter(c2, b.dk, b.kh, b.s[0], RB, RTL, 8, 4, RD, 2),
                     SBPRT_ERR_BACKEND);
    assert_int_equal(f.calls, 1);
    float *out0 = rt_copy(b.out, RBIG), *dq0 = rt_copy(b.dq, RBIG);
    f.calls = 0;
    assert_int_equal(sbprt_sp_attention_forward(c2, b.out, b.lse, b.q, b.kh, b.vh, NULL, b.s[0],
                                                b.s[1], RB, RTL, RTL, 8, 4, RD, 0, sc, 0, 0.0f, 2),
                     SBPRT_ERR_BACKEND);
    assert_int_equal(f.calls, 1);
    assert_true(same(b.out, out0, RBIG));
    f.calls = 0;
    assert_int_equal(sbprt_sp_attention_backward(c2, b.dq, b.kh, b.vh, b.q, b.q, b.kh, b.vh,
                                                 b.out, b.lse, NULL, b.s[0], b.s[1], b.s[2],
                                                 b.s[3], RB, RTL, RTL, 8, 4, RD, 0, sc, 0, 0.0f,
                                                 2),
                     SBPRT_ERR_BACKEND);
    assert_int_equal(f.calls, 1);
    assert_true(same(b.dq, dq0, RBIG));
    /* positions and document positions exchange nothing: they still work */
    rt_assert_ok(sbprt_sp_positions(c2, b.pos, RB, RTL, 2));
    rt_assert_ok(sbprt_sp_doc_positions(c2, b.pos, b.starts, RB, RTL, 2));
    free(out0), free(dq0);
    sbprt_ctx_destroy(c2);
    rbufs_free(&b);
}

/* NULL tensors, bad sizes and scalars, and out-of-range document starts: refused before
 * any exchange. */
static void test_refuse_arguments(void **st)
{
    (void)st;
    rbufs b;
    rbufs_init(&b);
    fake_comm f = {0, 0};
    sbprt_ctx *c = ctx_with(&f, 1, 2);
    const float sc = 0.3f;
    float *out0 = rt_copy(b.out, RBIG), *dq0 = rt_copy(b.dq, RBIG);
    float *S0 = b.s[0], *S1 = b.s[1], *S2 = b.s[2], *S3 = b.s[3];
#define FWD(out, q, kh, docs, s1, s2, t, qs, win, cap)                                          \
    sbprt_sp_attention_forward(c, out, b.lse, q, kh, b.vh, docs, s1, s2, RB, t, RTL, 8, 4, RD, \
                               qs, sc, win, cap, 2)
#define BWD(dq, lse, docs, s4, t, qs)                                                           \
    sbprt_sp_attention_backward(c, dq, b.kh, b.vh, b.q, b.q, b.kh, b.vh, b.out, lse, docs, S0,  \
                                S1, S2, s4, RB, t, RTL, 8, 4, RD, qs, sc, 0, 0.0f, 2)
    assert_int_equal(FWD(NULL, b.q, b.kh, NULL, S0, S1, RTL, 0, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, NULL, b.kh, NULL, S0, S1, RTL, 0, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, NULL, NULL, S0, S1, RTL, 0, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, NULL, RTL, 0, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, 5, 4, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, -1, 0, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, 4, -1, 0, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, RTL, 0, -1, 0.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, RTL, 0, 0, -1.0f), SBPRT_ERR_INVALID);
    assert_int_equal(FWD(b.out, b.q, b.kh, NULL, S0, S1, RTL, 0, 0, NAN), SBPRT_ERR_INVALID);
    assert_int_equal(BWD(NULL, b.lse, NULL, S3, RTL, 0), SBPRT_ERR_INVALID);
    assert_int_equal(BWD(b.dq, NULL, NULL, S3, RTL, 0), SBPRT_ERR_INVALID);
    assert_int_equal(BWD(b.dq, b.lse, NULL, NULL, RTL, 0), SBPRT_ERR_INVALID);
    assert_int_equal(BWD(b.dq, b.lse, NULL, S3, 5, 4), SBPRT_ERR_INVALID);
    /* document starts that the chunk of rank 1 (positions 8 .. 15) would read: past their
     * position, then decreasing */
    int32_t *docs = RT_NEW(int32_t, 2 * RTL);
    for (int p = 0; p < 2 * RTL; p++)
        docs[p] = p < 4 ? 0 : 4;
    docs[9] = 10;
    assert_int_equal(FWD(b.out, b.q, b.kh, docs, S0, S1, RTL, 0, 0, 0.0f), SBPRT_ERR_RANGE);
    assert_int_equal(BWD(b.dq, b.lse, docs, S3, RTL, 0), SBPRT_ERR_RANGE);
    docs[9] = 4, docs[12] = 2;
    assert_int_equal(FWD(b.out, b.q, b.kh, docs, S0, S1, RTL, 0, 0, 0.0f), SBPRT_ERR_RANGE);
    docs[12] = 4, docs[10] = -1;
    assert_int_equal(sbprt_sp_doc_positions(c, b.pos, docs, RB, RTL, 2), SBPRT_ERR_RANGE);
    assert_int_equal(sbprt_sp_kv_gather(c, NULL, b.q, S0, RB, RTL, 8, 4, RD, 2), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_kv_scatter(c, b.dk, b.kh, NULL, RB, RTL, 8, 4, RD, 2),
                     SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_kv_gather(c, b.kh, b.q, S0, RB, RTL, 8, 4, 0, 2), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_gather_rows(c, b.all, NULL, b.xs, RB, RTL, 2), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_positions(c, NULL, RB, RTL, 2), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_positions(c, b.pos, -1, RTL, 2), SBPRT_ERR_INVALID);
    assert_int_equal(sbprt_sp_positions(NULL, b.pos, RB, RTL, 2), SBPRT_ERR_INVALID);
    assert_int_equal(f.calls, 0);
    assert_true(same(b.out, out0, RBIG));
    assert_true(same(b.dq, dq0, RBIG));
    for (int i = 0; i < RBIG; i++)
        assert_true(b.pos[i] == -7);
    /* empty calls are no-ops that exchange nothing (every rank skips them alike) */
    rt_assert_ok(FWD(b.out, b.q, b.kh, NULL, S0, S1, 0, 0, 0, 0.0f));
    rt_assert_ok(sbprt_sp_kv_gather(c, b.kh, b.q, S0, 0, RTL, 8, 4, RD, 2));
    assert_int_equal(f.calls, 0);
    free(docs), free(out0), free(dq0);
    sbprt_ctx_destroy(c);
    rbufs_free(&b);
#undef FWD
#undef BWD
}

static int report(void **st)
{
    (void)st;
    print_message("max relative errors over all cases and ranks: out %.3g  dq %.3g  dk %.3g  "
                  "dv %.3g\n",
                  max_err[0], max_err[1], max_err[2], max_err[3]);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mha),
        cmocka_unit_test(test_gqa),
        cmocka_unit_test(test_replicated),
        cmocka_unit_test(test_mqa),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_docs),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_chunked),
        cmocka_unit_test(test_everything),
        cmocka_unit_test(test_scalar_path),
        cmocka_unit_test(test_tiles),
        cmocka_unit_test(test_set_comm),
        cmocka_unit_test(test_refuse_heads),
        cmocka_unit_test(test_refuse_nranks),
        cmocka_unit_test(test_alltoall_failure),
        cmocka_unit_test(test_refuse_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
