/* train_eval.h — held-out evaluation in sbp-train: --eval-data, --eval-every,
 * --eval-batches.
 *
 * An evaluation runs the step's forward-only entry point (sbp_step_eval, codegen/sbp_step.h:
 * no gradients, its own memory plan, the training forward's chunk loops) on the first K
 * batches of a held-out llm.c token shard (--eval-data) or of a dataset file of sbp-prepare's
 * (--eval-dataset: its examples in file order, laid into rows as --dataset lays them), the
 * same K batches every time so that evaluations
 * compare, after the optimizer step they follow. Its loss is the mean token cross-entropy over
 * every scored token of the K batches (Σ_k loss_k · n_k / Σ_k n_k, n_k the scored tokens of
 * batch k), its perplexity exp(loss). Batches are cut from the shard as --data cuts them
 * (llm.c's loader), or packed with whole documents as --pack does when the run packs.
 *
 * This file holds the options and the data; train_run.c runs the step. Functions that can fail
 * write a message (without the program's prefix) into err and return -1.
 */
#ifndef SBP_TRAIN_EVAL_H
#define SBP_TRAIN_EVAL_H

#include <stdbool.h>
#include "train_opt.h"
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "sbpio.h"
#include "train_dataset.h"

typedef struct train_eval_opts {
    const char *data;  /* --eval-data SHARD, or NULL */
    const char *dataset; /* --eval-dataset FILE (sbp-prepare's), or NULL; neither: no
                          * evaluation */
    int64_t every;     /* --eval-every N: after every N-th step; 0: after the last step only */
    int64_t batches;   /* --eval-batches K; 0: every whole batch of the shard */
} train_eval_opts;

/* The options' lines for sbp-train --help. */
const char *train_eval_usage(void);
/* The options (train_opt.h): --eval-data, --eval-every, --eval-batches; the parser answers
 * 0, -1 after cli's message, or TRAIN_OPT_NOT_MINE. */
extern const struct option train_eval_options[];
int train_eval_parse(train_eval_opts *o, cli *c, const char *v);
/* --eval-every / --eval-batches without --eval-data or --eval-dataset, or both of these. */
int train_eval_check_opts(const train_eval_opts *o, char *err, size_t errlen);
/* Whether the run evaluates after optimizer step s of `steps`. */
bool train_eval_due(const train_eval_opts *o, int64_t s, int64_t steps);

/* The held-out batches. */
typedef struct train_eval {
    sbpio_shard shard;
    bool open;
    train_dataset ds;  /* --eval-dataset: its examples in file order, as --dataset lays them */
    bool is_ds;
    bool pack;         /* rows of whole documents (--pack), with doc_ids */
    uint32_t eos;      /* pack: the end-of-document token */
    int64_t B, T, K;   /* the step's batch and length; batches per evaluation */
    int32_t *ids, *labels, *doc_ids; /* [B*T] the current batch (doc_ids: pack only) */
} train_eval;

/* Opens the shard and checks it against the step (B, T, V); with pack, rows are packed with
 * whole documents ending at eos. K = o->batches, or with 0 every whole batch the shard holds
 * (the batches before the shard would wrap); more than it holds is an error. */
int train_eval_open(train_eval *e, const train_eval_opts *o, int64_t B, int64_t T, int64_t V,
                    bool pack, uint32_t eos, char *err, size_t errlen);
/* --eval-dataset: the same for a dataset file, with the rows of step `in` (packed: next-fit, as
 * a packed step's --dataset). K = o->batches, or every whole batch before the file's end. */
int train_eval_open_dataset(train_eval *e, const train_eval_opts *o, const sbp_step_info *in,
                            char *err, size_t errlen);
/* Back to the shard's first batch (each evaluation reads the same K). */
void train_eval_rewind(train_eval *e);
/* The next batch into e->ids, e->labels (and e->doc_ids). */
int train_eval_next(train_eval *e, char *err, size_t errlen);
/* Scored positions of the current batch. */
int64_t train_eval_scored(const train_eval *e);
void train_eval_close(train_eval *e);

#endif
