/* sbpc_dist.c — the per-rank planned bytes of a data-parallel run (sbpc_dist.h says
 * what each figure is and why). Plain arithmetic on the program sbpc built: the same figures as
 * the memory report's column for the chosen strategy, with the optimizer state divided as
 * train_dist.c divides it.
 */
#include "sbpc_dist.h"

#include "cli.h"

int sbpc_dist_check(int64_t ranks, int64_t zero, bool report, char *err, size_t errlen)
{
    if (zero >= 0 && ranks == 0)
        return cli_errf(err, errlen, "--zero applies to --ranks N (the ranks the optimizer "
                        "state is divided over)");
    if (ranks > 0 && !report)
        return cli_errf(err, errlen, "--ranks%s only changes what --report prints (the step is "
                        "one rank's: compile it with --batch = the rows per rank); add --report",
                        zero >= 0 ? " and --zero" : "");
    return 0;
}

/* ceil(a / b) for b > 0, without overflow */
static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

void sbpc_dist_report(FILE *out, const sbp_train_program *p, int64_t ranks, int64_t zero)
{
    if (zero < 0)
        zero = 0;
    const uint64_t N = (uint64_t)ranks, E = p->grad_elems;
    const uint64_t params = (uint64_t)p->param_elems * 4, grads = E * 4;
    /* 2 moments x 4 bytes per element of this rank's slice; the largest slice under ZeRO */
    const uint64_t moments = 8 * (zero > 0 ? ceil_div(E, N) : E);
    const uint64_t ws = p->workspace_bytes, total = params + grads + moments + ws;
    char h[32];
    fprintf(out, "\ndata parallel, per rank (--ranks %llu, --zero %lld): the %s step runs %lld "
                 "rows per rank, a global batch of %llu rows per micro-batch\n",
            (unsigned long long)N, (long long)zero, sbp_strategy_name(p->strategy),
            (long long)p->batch, (unsigned long long)N * (unsigned long long)p->batch);
    fprintf(out, "  per rank: parameters          %16llu\n", (unsigned long long)params);
    fprintf(out, "  per rank: gradient block      %16llu%s\n", (unsigned long long)grads,
            zero == 2 ? "  (whole: the step writes all of it; ZeRO 2's reduce-scatter saves "
                        "traffic, not gradient memory)"
                      : "");
    fprintf(out, "  per rank: AdamW moments m, v  %16llu  (2 x 4 bytes x %s%llu elements; "
                 "%llu without ZeRO)\n",
            (unsigned long long)moments, zero > 0 ? "ceil(grad elems / ranks) = " : "",
            (unsigned long long)(zero > 0 ? ceil_div(E, N) : E), (unsigned long long)(8 * E));
    fprintf(out, "  per rank: workspace           %16llu\n", (unsigned long long)ws);
    fprintf(out, "  per rank: total               %16llu  (%s)\n", (unsigned long long)total,
            cli_human_bytes(h, sizeof h, (double)total));
    if (zero > 0 && N > 1)
        fprintf(out, "  (with checkpoints, rank 0 also buffers one other rank's moment slice on "
                     "the host while it writes them: %llu bytes)\n",
                (unsigned long long)(4 * ceil_div(E, N)));
}
