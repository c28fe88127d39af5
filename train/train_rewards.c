/* train_rewards.c — DPO's rewards per optimizer step (train_rewards.h): four sums in double over
 * the pairs of each micro-batch, summed over the ranks once per step, then divided by the
 * step's pairs. The rewards are formed here, on the host, from the step's row logps and the
 * reference it was given, exactly as the step forms its z = β ((logp_c - ref_c) - (logp_r -
 * ref_r)), so a logged margin is the one the loss was computed from.
 */
#include "train_rewards.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int train_rewards_open(train_rewards *w, const sbp_step_info *in)
{
    memset(w, 0, sizeof *w);
    if (!in->objective || strcmp(in->objective, "dpo") != 0)
        return 0;
    w->on = true;
    w->beta = in->beta;
    w->B = in->batch;
    w->T = in->seq_len;
    w->W = in->per_document ? in->seq_len : 1;
    w->row_logps = calloc((size_t)(in->batch * w->W), sizeof *w->row_logps);
    return w->row_logps ? 0 : -1;
}

void train_rewards_free(train_rewards *w)
{
    free(w->row_logps);
    w->row_logps = NULL;
}

void train_rewards_begin(train_rewards *w) { memset(w->sum, 0, sizeof w->sum); }

double *train_rewards_out(train_rewards *w) { return w->on ? w->row_logps : NULL; }

void train_rewards_add(train_rewards *w, const float *ref, const int32_t *labels,
                       const int32_t *doc_ids)
{
    if (!w->on || !ref) /* (a DPO step always has its reference: ti_open requires it) */
        return;
    const int64_t h = w->B / 2, W = w->W;
    for (int64_t j = 0; j < h; j++) {
        /* per document: the row pair's document pairs (the step refused a mismatch) */
        const int64_t n = W == 1 ? 1 : ti_docs(labels + j * w->T, doc_ids + j * w->T, w->T);
        for (int64_t k = 0; k < n; k++) {
            const int64_t a = j * W + k, b = (h + j) * W + k;
            const double c = w->beta * (w->row_logps[a] - ref[a]);
            const double r = w->beta * (w->row_logps[b] - ref[b]);
            w->sum[0] += c;
            w->sum[1] += r;
            w->sum[2] += c - r;
            w->sum[3] += c > r;
        }
    }
}

int train_rewards_finish(train_rewards *w, train_dist *d, double pairs, train_rewards_stats *out,
                         char *err, size_t errlen)
{
    *out = (train_rewards_stats){NAN, NAN, NAN, NAN};
    if (!w->on || !(pairs > 0))
        return 0;
    if (d->on && train_dist_sum(d, w->sum, 4, err, errlen))
        return -1;
    *out = (train_rewards_stats){w->sum[0] / pairs, w->sum[1] / pairs, w->sum[2] / pairs,
                                 w->sum[3] / pairs};
    return 0;
}
