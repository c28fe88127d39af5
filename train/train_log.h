/* train_log.h — sbp-train's --log FILE.jsonl: one JSON object per optimizer step,
 *
 *   {"step":3,"loss":4.1,"lr":0.002,"grad_norm":1.7,"tokens_per_s":51234.5,"elapsed_s":0.42}
 *
 * with "eval_loss" added on the steps that have one, and on a DPO step's every line its
 * rewards (train_rewards.h; TRL's rewards/chosen, rejected, margins, accuracies) as
 * "rewards_chosen", "rewards_rejected", "rewards_margin" and "rewards_accuracy". Numbers are written in their shortest round-trip form (as Python's repr), a non-finite
 * one as null (JSON has no NaN). The file is flushed after each line, so a run that dies keeps
 * every step it finished, and `tail -f` follows it.
 *
 * Unlike --save and --dump-grads, the log is not written beside and renamed at the end: its
 * point is to survive a crash half-way, so it is written in place. What keeps that safe is
 * done before: sbp-train checks it like every output (not an input of the run, not a FIFO or
 * directory, not another output; ir/files.h) and opens it before step 1, so an unwritable
 * path is an error before any work. A character device (/dev/stdout) is written as it is.
 */
#ifndef SBP_TRAIN_LOG_H
#define SBP_TRAIN_LOG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "train_rewards.h"

typedef struct train_log {
    FILE *f;          /* the open log, or NULL (no --log) */
    const char *path; /* for messages */
    double t0;        /* CLOCK_MONOTONIC seconds at the start of step 1 (elapsed_s) */
} train_log;

/* Opens path; 0, or -1 with a message in err. path NULL: no log. keep_through < 0: a new log
 * (created or truncated). keep_through = k >= 0 (a run resumed after step k): the lines of
 * steps <= k are kept and the rest dropped (an interrupted run may have logged steps past its
 * last checkpoint, which the resumed run redoes), rewritten atomically, then appended to. */
int train_log_open(train_log *l, const char *path, int64_t keep_through, char *err,
                   size_t errlen);
/* Appends step s's line and flushes it; eval_loss NaN: none; aux_loss (a MoE step's
 * load-balancing term) NaN: none; rewards NULL or NaN: none. 0, or -1 with a message. */
int train_log_step(train_log *l, int64_t s, double loss, double lr, double grad_norm,
                   double tokens_per_s, double eval_loss, double aux_loss,
                   const train_rewards_stats *rewards, char *err, size_t errlen);
/* Closes the log; 0, or -1 with a message when the last writes failed. NULL-safe. */
int train_log_close(train_log *l, char *err, size_t errlen);
/* CLOCK_MONOTONIC, in seconds. */
double train_log_now(void);

#endif
