/* bench_attention.c — the CPU attention kernel alone: causal GQA forward and backward at the
 * benchmark model's shape (D=32, Hq=8, Hkv=4, batch 1), GFLOP/s counting the causal
 * products only (forward: QK^T and PV, 2 * 2 * T^2/2 * D per head; backward: the kernel's
 * own work is QK^T, dO V^T, dS K, dS^T Q, P^T dO = 5 products, counted as 5 * T^2 * D per
 * head — the nominal FLOPs, independent of how many times an implementation recomputes).
 * Median of the runs.  With -w W (a sliding window) or -c C (logit soft-capping) it runs the
 * _ex variant; the GFLOP/s still count the causal products (so a window's speed-up shows as
 * a higher rate), and the last column gives the products the window really leaves, w/T-ish.
 * With -d N (packed documents) the row holds N equal documents and the packed kernels run
 * (sbprt_attention_forward_packed: block-diagonal causal, other documents' key tiles skipped);
 * the last column is then the pairs within documents, about 1/N: the ideal ratio.
 *
 *   build/bench/bench_attention [-w window] [-c softcap] [-d docs] [threads] [runs] [T ...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbprt.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *randv(size_t n, unsigned *seed)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        p[i] = ((float)((*seed >> 8) & 0xffff) / 65536.0f - 0.5f);
    }
    return p;
}

int main(int argc, char **argv)
{
    int window = 0, docs = 0;
    float softcap = 0;
    while (argc > 2 && (strcmp(argv[1], "-w") == 0 || strcmp(argv[1], "-c") == 0 ||
                        strcmp(argv[1], "-d") == 0)) {
        if (argv[1][1] == 'w')
            window = atoi(argv[2]);
        else if (argv[1][1] == 'd')
            docs = atoi(argv[2]);
        else
            softcap = (float)atof(argv[2]);
        argv += 2, argc -= 2;
    }
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    int runs = argc > 2 ? atoi(argv[2]) : 3;
    int tdef[] = {1024, 4096}, nt = 2, *ts = tdef;
    if (argc > 3) {
        nt = argc - 3;
        ts = malloc(sizeof(int) * nt);
        for (int i = 0; i < nt; i++)
            ts[i] = atoi(argv[3 + i]);
    }
    const int b = 1, hq = 8, hkv = 4, d = 32;
    sbprt_ctx *ctx;
    if (sbprt_ctx_create(&ctx, threads)) {
        fprintf(stderr, "ctx\n");
        return 1;
    }
    printf("window %d, softcap %g, %d document(s) per row\n", window, (double)softcap,
           docs > 0 ? docs : 1);
    printf("%6s %10s %10s %10s %10s %8s\n", "T", "fwd s", "fwd GF/s", "bwd s", "bwd GF/s",
           "pairs");
    for (int ti = 0; ti < nt; ti++) {
        int t = ts[ti];
        unsigned seed = 1;
        size_t nq = (size_t)b * t * hq * d, nk = (size_t)b * t * hkv * d;
        float *q = randv(nq, &seed), *k = randv(nk, &seed), *v = randv(nk, &seed);
        float *dout = randv(nq, &seed);
        float *out = calloc(nq, 4), *lse = calloc((size_t)b * hq * t, 4);
        float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
        /* -d: N equal documents (the last takes the rest), their starts from the ids */
        int32_t *ids = NULL, *start = NULL;
        int len = docs > 0 ? (t + docs - 1) / docs : t;
        if (docs > 0) {
            ids = malloc(sizeof *ids * (size_t)t);
            start = malloc(sizeof *start * (size_t)t);
            for (int i = 0; i < t; i++)
                ids[i] = i / len;
            if (sbprt_doc_starts(ctx, start, ids, 1, t)) {
                fprintf(stderr, "doc_starts\n");
                return 1;
            }
        }
        double tf[64], tb[64];
        float scale = 0.17677669f;
        for (int r = 0; r < runs && r < 64; r++) {
            double t0 = now();
            sbprt_attention_forward_packed(ctx, out, lse, q, k, v, start, b, t, t, hq, hkv, d, 0,
                                           scale, window, softcap);
            double t1 = now();
            sbprt_attention_backward_packed(ctx, dq, dk, dv, dout, q, k, v, out, lse, start, b, t,
                                            t, hq, hkv, d, 0, scale, window, softcap);
            double t2 = now();
            tf[r] = t1 - t0;
            tb[r] = t2 - t1;
        }
        qsort(tf, runs, sizeof(double), cmp);
        qsort(tb, runs, sizeof(double), cmp);
        double causal = (double)t * t / 2 * d * hq * b;
        double ff = 2 * 2 * causal, fb = 5 * 2 * causal;
        /* (query, key) pairs the mask leaves, as a fraction of the causal ones */
        double pairs = 0;
        for (int i = 0; i < t; i++) {
            int in_doc = docs > 0 ? i % len + 1 : i + 1; /* keys of its document up to it */
            pairs += window > 0 && window < in_doc ? window : in_doc;
        }
        printf("%6d %10.4f %10.2f %10.4f %10.2f %8.4f   (checksum %.6g %.6g)\n", t, tf[runs / 2],
               ff / tf[runs / 2] * 1e-9, tb[runs / 2], fb / tb[runs / 2] * 1e-9,
               pairs / ((double)t * (t + 1) / 2), (double)out[7], (double)dk[5]);
        free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
        free(ids), free(start);
    }
    sbprt_ctx_destroy(ctx);
    return 0;
}
