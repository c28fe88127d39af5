/* sgemm_rate.c — OpenBLAS's single-precision GEMM rate on this machine: the ceiling that the
 * training benchmarks report their GFLOP/s against. Square and transformer-shaped products,
 * median of 5 runs each, at the thread count given (default 2).
 *
 *   build/bench/sgemm_rate [threads]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void openblas_set_num_threads(int);

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

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    openblas_set_num_threads(threads);
    const int shapes[][3] = {{1024, 1024, 1024}, {4096, 256, 256}, {4096, 688, 256},
                             {4096, 32000, 256}, {4096, 256, 688}};
    printf("%-22s %10s\n", "sgemm m x n x k", "GFLOP/s");
    double best = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)k * n),
              *c = malloc(sizeof(float) * (size_t)m * n);
        for (size_t i = 0; i < (size_t)m * k; i++)
            a[i] = (float)(i % 17) * 0.01f;
        for (size_t i = 0; i < (size_t)k * n; i++)
            b[i] = (float)(i % 13) * 0.01f;
        double t[5];
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f,
                        c, n);
            t[r] = now() - t0;
        }
        qsort(t, 5, sizeof(double), cmp);
        double gf = 2.0 * m * n * k / t[2] / 1e9;
        if (gf > best)
            best = gf;
        printf("%5d x %5d x %5d    %10.1f\n", m, n, k, gf);
        free(a);
        free(b);
        free(c);
    }
    printf("peak %.1f GFLOP/s (%d threads)\n", best, threads);
    return 0;
}
