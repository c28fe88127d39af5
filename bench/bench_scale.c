/* bench_scale.c — compile time against program length, phase by phase.
 *
 *   bench_scale [--batch N] [--seq-len N] [--strategy S] [-o DIR] MODEL.onnx...
 *
 * Runs sbpc's whole pipeline on each model, timing each phase once: import (ir_import_onnx),
 * canonicalise (sbp_canonicalize), build (objective + sbp_train_build_until the schedule:
 * autodiff, the strategy's program, sequence analysis, verification), plan (sbp_memplan:
 * gradient zeroing, liveness, offsets) and emit (sbp_codegen_write_target to DIR/NAME.c, the C
 * files that `sbpc MODEL -o x.c` writes). Prints one row per model: nodes imported, nodes after
 * canonicalisation, instructions and workspace buffers of the program, the planned workspace,
 * the seconds of each phase and their total. bench/bench_scale.py generates the models (a long
 * chain, a deep Llama) and runs this; a pipeline linear (or n log n) in the program length keeps
 * the time per node flat.
 */
#include "codegen.h"
#include "ir.h"
#include "memplan.h"
#include "passes.h"
#include "train.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(ir_diag *d, const char *what)
{
    ir_diag_print(d, stderr, "bench_scale");
    fprintf(stderr, "bench_scale: %s failed\n", what);
    return 1;
}

/* One model through the pipeline; prints its row. */
static int run(const char *model, const sbp_pass_options *popt, const sbp_train_options *topt,
               const char *outdir)
{
    ir_diag d;
    ir_diag_init(&d, model);
    double t[6];
    t[0] = now();
    ir_graph *g = ir_import_onnx(model, &d, NULL);
    if (!g)
        return fail(&d, "import");
    int n_raw = g->n_nodes;
    t[1] = now();
    if (sbp_canonicalize(g, popt, NULL) != IR_OK)
        return fail(&d, "canonicalise");
    ir_graph_compact(g);
    int n_canon = g->n_nodes;
    t[2] = now();
    sbp_objective chosen;
    if (sbp_pass_objective(g, SBP_OBJECTIVE_SFT, &chosen) != IR_OK)
        return fail(&d, "objective");
    sbp_train_program *p = sbp_train_build_until(g, chosen, topt, SBP_TRAIN_UNTIL_SCHEDULE);
    if (!p)
        return fail(&d, "build");
    t[3] = now();
    if (sbp_memplan(p, &d) != IR_OK)
        return fail(&d, "plan");
    t[4] = now();
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    size_t nl = strlen(base);
    if (nl > 5 && strcmp(base + nl - 5, ".onnx") == 0)
        nl -= 5;
    char out[4096];
    snprintf(out, sizeof out, "%s/%.*s.c", outdir, (int)nl, base);
    if (sbp_codegen_write_target(p, out, model, NULL, "cpu", &d) != IR_OK)
        return fail(&d, "emit");
    t[5] = now();
    int n_insts = 0, n_ws = 0;
    for (int b = 0; b < p->n_blocks; b++)
        n_insts += p->blocks[b]->n_insts;
    for (int b = 0; b < p->n_bufs; b++)
        n_ws += p->bufs[b]->kind == TP_BUF_WS;
    printf("%-24.*s %8d %8d %8d %8d %12zu %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", (int)nl, base,
           n_raw, n_canon, n_insts, n_ws, p->workspace_bytes, t[1] - t[0], t[2] - t[1],
           t[3] - t[2], t[4] - t[3], t[5] - t[4], t[5] - t[0]);
    fflush(stdout);
    ir_graph_free(g);
    ir_diag_free(&d);
    return 0;
}

int main(int argc, char **argv)
{
    sbp_pass_options popt = {.batch = 0, .seq_len = 0, .verify = true};
    sbp_train_options topt = {.strategy = SBP_STRATEGY_STREAM};
    const char *outdir = ".";
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            popt.batch = atoll(argv[++i]);
        else if (strcmp(argv[i], "--seq-len") == 0 && i + 1 < argc)
            popt.seq_len = atoll(argv[++i]);
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            outdir = argv[++i];
        else if (strcmp(argv[i], "--strategy") == 0 && i + 1 < argc) {
            const char *s = argv[++i];
            topt.strategy = strcmp(s, "store") == 0        ? SBP_STRATEGY_STORE
                            : strcmp(s, "checkpoint") == 0 ? SBP_STRATEGY_CHECKPOINT
                                                           : SBP_STRATEGY_STREAM;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: bench_scale [--batch N] [--seq-len N] [--strategy S] "
                            "[-o DIR] MODEL.onnx...\n");
            return 1;
        } else {
            first = i;
            break;
        }
    }
    if (first >= argc) {
        fprintf(stderr, "bench_scale: no model given\n");
        return 1;
    }
    printf("%-24s %8s %8s %8s %8s %12s %8s %8s %8s %8s %8s %8s\n", "model", "nodes", "canon",
           "insts", "bufs", "workspace", "import", "canon", "build", "plan", "emit", "total");
    for (int m = first; m < argc; m++)
        if (run(argv[m], &popt, &topt, outdir))
            return 1;
    return 0;
}
