/* sbpc_dist.c — the per-rank planned bytes of a data-parallel run (sbpc_dist.h says
 * what each figure is and why). Plain arithmetic on the program sbpc built: the same figures as
 * the memory report's column for the chosen strategy, with the optimizer state divided as
 * train_dist.c divides it.
 */
#include "sbpc_dist.h"

#include "cli.h"

#include <string.h>

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

/* The buffers the sequence-parallel lowering adds (passes/train/grad_rules.c, seqpar.c), by
 * their description. */
static bool is_exchange_buffer(const tp_buf *b)
{
    static const char *const whats[] = {"k_heads", "v_heads", "dk_heads", "dv_heads",
                                        "kv_exchange", "sp_exchange_1", "sp_exchange_2",
                                        "sp_exchange_3", "sp_exchange_4", "unused_dq",
                                        "the document ids' exchange (one row)",
                                        "every rank's document ids (the whole rows)"};
    for (size_t i = 0; b->what && i < sizeof whats / sizeof *whats; i++)
        if (strcmp(b->what, whats[i]) == 0)
            return true;
    return false;
}

void sbpc_sp_report(FILE *out, const sbp_train_program *p, int64_t ranks, int64_t zero)
{
    if (p->seq_parallel < 1)
        return;
    const uint64_t N = (uint64_t)p->seq_parallel, E = p->grad_elems;
    const uint64_t R = ranks > 0 ? (uint64_t)ranks : N;
    if (zero < 0)
        zero = 0;
    const uint64_t params = (uint64_t)p->param_elems * 4, grads = E * 4;
    const uint64_t moments = 8 * (zero > 0 ? ceil_div(E, R) : E);
    const uint64_t ws = p->workspace_bytes, total = params + grads + moments + ws;
    uint64_t xbytes = 0;
    int nx = 0;
    for (int i = 0; i < p->n_bufs; i++)
        if (p->bufs[i]->kind == TP_BUF_WS && is_exchange_buffer(p->bufs[i])) {
            xbytes += p->bufs[i]->numel * 4;
            nx++;
        }
    char h[32], h2[32];
    fprintf(out, "\nsequence parallel, per rank (--seq-parallel %llu): each row's %lld tokens "
                 "over %llu ranks, %lld each; %llu ranks in all (%llu data group%s), --zero "
                 "%lld\n",
            (unsigned long long)N, (long long)p->seq_len_global, (unsigned long long)N,
            (long long)p->seq_len, (unsigned long long)R, (unsigned long long)(R / N),
            R / N == 1 ? "" : "s", (long long)zero);
    fprintf(out, "  per rank: parameters          %16llu\n", (unsigned long long)params);
    fprintf(out, "  per rank: gradient block      %16llu  (this rank's tokens' share; summed over "
                 "all ranks once per optimizer step)\n", (unsigned long long)grads);
    fprintf(out, "  per rank: AdamW moments m, v  %16llu%s\n", (unsigned long long)moments,
            zero > 0 ? "  (ZeRO: ceil(grad elems / ranks) elements)" : "");
    fprintf(out, "  per rank: workspace           %16llu\n", (unsigned long long)ws);
    fprintf(out, "    of it, exchange buffers     %16llu  (%d buffers: the rank's heads' K/V over "
                 "the whole rows and their gradients, the all-to-alls' send and receive "
                 "buffers; sizes summed, not all live at once)\n",
            (unsigned long long)xbytes, nx);
    fprintf(out, "  per rank: total               %16llu  (%s)\n", (unsigned long long)total,
            cli_human_bytes(h, sizeof h, (double)total));
    int64_t sent = sbp_train_sp_bytes_sent(p);
    fprintf(out, "  per rank: sent per step       %16lld  (%s to the other %llu ranks of its rows, "
                 "as much received)\n",
            (long long)sent, cli_human_bytes(h2, sizeof h2, (double)sent),
            (unsigned long long)(N - 1));
}
