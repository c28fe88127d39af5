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
    w->row_logps = calloc((size_t)in->batch, sizeof *w->row_logps);
    return w->row_logps ? 0 : -1;
}

void train_rewards_free(train_rewards *w)
{
    free(w->row_logps);
    w->row_logps = NULL;
}

void train_rewards_begin(train_rewards *w) { memset(w->sum, 0, sizeof w->sum); }

double *train_rewards_out(train_rewards *w) { return w->on ? w->row_logps : NULL; }

void train_rewards_add(train_rewards *w, const float *ref)
{
    if (!w->on || !ref) /* (a DPO step always has its reference: ti_open requires it) */
        return;
    const int64_t h = w->B / 2;
    for (int64_t j = 0; j < h; j++) {
        const double c = w->beta * (w->row_logps[j] - ref[j]);
        const double r = w->beta * (w->row_logps[h + j] - ref[h + j]);
        w->sum[0] += c;
        w->sum[1] += r;
        w->sum[2] += c - r;
        w->sum[3] += c > r;
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
