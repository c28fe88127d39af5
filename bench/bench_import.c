/* bench_import.c — import + canonicalisation time against model depth.
 *
 *   bench/gen_deep_models.py            (exports 8/16/32/64-layer Llama-style models)
 *   build/bench/bench_import bench/models/llama_{8,16,32,64}L.onnx
 *
 * Prints one row per model: layers found (attention ops), nodes before/after, the median of
 * REPS wall-clock runs of import and of canonicalisation, and time per layer — which must stay
 * flat if the pipeline is linear in depth.
 */
#include "ir.h"
#include "flow.h"

#include <stdlib.h>
#include <time.h>

#define REPS 7

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
    if (argc < 2) {
        fprintf(stderr, "usage: bench_import MODEL.onnx...\n");
        return 1;
    }
    printf("%-40s %6s %7s %7s %10s %10s %12s\n", "model", "layers", "nodes", "canon", "import_ms",
           "canon_ms", "total_ms/layer");
    for (int m = 1; m < argc; m++) {
        double ti[REPS], tc[REPS];
        int layers = 0, n_raw = 0, n_canon = 0;
        for (int r = 0; r < REPS; r++) {
            ir_diag d;
            ir_diag_init(&d, argv[m]);
            /* the compile flow (passes/flow.h) run to "import", then on to "cleanup" */
            const sbp_flow_options fo = {.pass = {.batch = 2, .seq_len = 64, .verify = true}};
            sbp_flow f = {.path = argv[m]};
            double t0 = now();
            int rc = sbp_flow_run(&f, &fo, &d, "import");
            double t1 = now();
            ir_graph *g = f.g;
            if (rc != IR_OK) {
                ir_diag_print(&d, stderr, "bench_import");
                return 1;
            }
            n_raw = g->n_nodes;
            if (sbp_flow_run(&f, &fo, &d, "cleanup") != IR_OK) {
                ir_diag_print(&d, stderr, "bench_import");
                return 1;
            }
            double t2 = now();
            ti[r] = t1 - t0;
            tc[r] = t2 - t1;
            layers = ir_graph_count_op(g, IR_OP_ATTENTION);
            n_canon = g->n_nodes;
            ir_graph_free(g);
            ir_diag_free(&d);
        }
        qsort(ti, REPS, sizeof(double), cmp);
        qsort(tc, REPS, sizeof(double), cmp);
        double mi = ti[REPS / 2] * 1e3, mc = tc[REPS / 2] * 1e3;
        printf("%-40s %6d %7d %7d %10.2f %10.2f %12.3f\n", argv[m], layers, n_raw, n_canon, mi,
               mc, layers ? (mi + mc) / layers : 0.0);
    }
    return 0;
}
