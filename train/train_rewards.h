/* train_rewards.h — DPO's implicit rewards of one optimizer step, as TRL's DPOTrainer logs them.
 *
 * The reward of a row is β (logp - ref): logp as the step's own forward computed it before its
 * backward (sbp_step_args.row_logps, codegen/sbp_step.h), ref the reference log-prob the step
 * was given. Over the pairs of the whole optimizer step (every micro-batch, and under mpirun
 * every rank's, summed with train_dist_sum):
 *   chosen   = mean of β (logp_c - ref_c)        (TRL: rewards/chosen)
 *   rejected = mean of β (logp_r - ref_r)        (rewards/rejected)
 *   margin   = mean of chosen - rejected         (rewards/margins)
 *   accuracy = fraction of pairs with chosen > rejected, strictly (rewards/accuracies)
 * The means are over the step's denominator, its real pairs: a padding pair of a data-parallel
 * rank (nothing scored, reference 0) has logp 0 on both sides, so it adds 0 to every sum and is
 * not counted correct. Objectives other than DPO have none (the figures are NaN).
 */
#ifndef SBP_TRAIN_REWARDS_H
#define SBP_TRAIN_REWARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbp_step.h"
#include "train_dist.h"
#include "train_inputs.h" /* ti_docs */

typedef struct train_rewards_stats {
    double chosen, rejected, margin, accuracy; /* NaN when the step has none */
} train_rewards_stats;

typedef struct train_rewards {
    bool on;            /* a DPO step */
    double beta;        /* the step's β */
    int64_t B;          /* the step's rows: pair j = (row j, row B/2 + j) */
    int64_t T;          /* the step's row length */
    int64_t W;          /* logps a row: 1, or T for a per-document step (document k of row b
                         * at b*T + k, its pairs (b, k) and (B/2 + b, k)) */
    double *row_logps;  /* [B*W] the step's output for one micro-batch (host memory) */
    double sum[4];      /* this rank's sums over the optimizer step so far: chosen, rejected,
                         * margin, pairs correct */
} train_rewards;

/* For the step `in` (nothing to do unless it is a DPO step). 0, or -1: out of memory. */
int train_rewards_open(train_rewards *w, const sbp_step_info *in);
void train_rewards_free(train_rewards *w);
/* Before an optimizer step's first micro-batch: the sums to zero. */
void train_rewards_begin(train_rewards *w);
/* Where the step writes its row logps (args->row_logps): NULL unless a DPO step. */
double *train_rewards_out(train_rewards *w);
/* After a micro-batch: its pairs' rewards added, from w->row_logps and the reference log-probs
 * it was given (ref [B*W], host memory); per document, the micro-batch's labels and doc_ids
 * [B*T] (host memory) say how many document pairs each row pair holds (else not read). */
void train_rewards_add(train_rewards *w, const float *ref, const int32_t *labels,
                       const int32_t *doc_ids);
/* After the last micro-batch: the sums over the ranks (d, may be a single process) and the
 * means over `pairs` (the step's denominator) into *out (NaN when not a DPO step). 0, or -1
 * with err (a failed collective). */
int train_rewards_finish(train_rewards *w, train_dist *d, double pairs, train_rewards_stats *out,
                         char *err, size_t errlen);

#endif
