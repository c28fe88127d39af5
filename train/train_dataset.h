/* train_dataset.h — sbp-train --dataset: the examples of an sbp-prepare file
 * (docs/dataset-format.md) as the rows of each step.
 *
 * Rows. A plain step takes one example per row, from position 0, and pads the rest of the row
 * (id pad_id, label -100: padding is never scored). A packed step (sbpc --packed, with --pack)
 * takes whole examples back to back, next-fit in order: an example that does not fit in the
 * rest of the row starts the next row, and the rest of this row is padding (id pad_id, label
 * -100, a document id of its own); each example is one document (ids 0, 1, 2, ... along the
 * row), keeping its own labels, so no example attends to another or predicts its first token.
 * An example longer than the step's T is refused when the file is opened (prepare the data
 * with --max-len T), never cut silently.
 *
 * DPO. A dpo dataset (examples 2k and 2k + 1: pair k's chosen and rejected answers) trains a
 * dpo step: each step takes the next K*G/2 pairs, pair j's chosen example in row j and its
 * rejected one in row K*G/2 + j (the DPO step's pair layout), one example a row; the order is
 * over pairs. sbp-train computes every example's reference log-probability once, before step 1,
 * from the model's initial weights (the step's sbp_step_logps), and gives each row its own.
 *
 * GRPO. A grpo dataset trains a grpo step, one example (a prompt and its completion) a row,
 * each with the dataset's advantage; old log-probs are on-policy; with beta > 0 each scored
 * token's reference log-probability is computed once before step 1, like DPO's.
 *
 * Packed DPO / GRPO (a step of sbpc --packed --per-document, whose values are per document):
 * GRPO rows take whole rollouts next-fit, each its own document with its own advantage; DPO row
 * pairs (j, N/2 + j) take whole pairs in lockstep, pair m's chosen answer as document m of row j
 * and its rejected one as document m of row N/2 + j, the first pair that does not fit in both
 * rows starting the next row pair (train_dataset_next_docs). A packed step without
 * --per-document is refused for them: it sums a row's documents into one log-prob.
 *
 * Order. Epoch e (from 0) visits every example (DPO: every pair) once: in file order, or with --shuffle-seed S
 * in the order of a Fisher-Yates shuffle (i from n-1 down to 1: j = x mod (i + 1), swap order[i]
 * and order[j]) driven by splitmix64 started at S + (e + 1) * 0x9E3779B97F4A7C15, a new order
 * each epoch that anyone can recompute. The rows of one step may cross from one epoch into the
 * next. The cursor is (epoch, the next example's index in the epoch's order): checkpoints keep
 * it, and a resumed run reads exactly the rows the uninterrupted run would have.
 *
 * Functions that can fail write a message (without the program's prefix) into err and return
 * -1.
 */
#ifndef SBP_TRAIN_DATASET_H
#define SBP_TRAIN_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbp_step.h"
#include "sbpio.h"

typedef struct train_dataset_opts {
    const char *path; /* --dataset FILE, or NULL */
    const char *flag; /* the option that named it, for messages (NULL: "--dataset") */
    int64_t epochs;   /* --epochs E, or 0: --steps decides */
    bool shuffle;     /* --shuffle-seed given */
    uint64_t seed;    /* --shuffle-seed S */
} train_dataset_opts;

typedef struct train_dataset {
    sbpio_dataset d;  /* the file */
    const char *flag; /* its option, for messages */
    int64_t T;        /* the step's row length */
    bool packed;      /* rows of several examples (a packed step) */
    bool pairs;       /* a dpo dataset for a dpo step: the order is over pairs (examples 2k,
                       * 2k + 1), see train_dataset_next_pairs */
    bool per_doc;     /* a dpo or grpo dataset for a packed per-document step (sbpc --packed
                       * --per-document): train_dataset_next_docs */
    int64_t n_units;  /* what the order visits: examples, or pairs */
    bool shuffle;
    uint64_t seed;
    int64_t *order;   /* [n_units] this epoch's order of the examples (or pairs) */
    int64_t epoch;    /* the cursor: the pass over the data, from 0 */
    int64_t pos;      /* ... and the next unit's index in order */
    int32_t *tmp_ids, *tmp_labels; /* [T] one example */
} train_dataset;

/* Opens o->path for step `in` (its vocabulary and T; packed: a packed step's rows). */
int train_dataset_open(train_dataset *s, const train_dataset_opts *o, const sbp_step_info *in,
                       bool packed, char *err, size_t errlen);
void train_dataset_close(train_dataset *s); /* NULL-safe; zeroes *s */

/* The next `rows` rows of T tokens into ids, labels [rows * T] and, for a packed step,
 * doc_ids [rows * T]; the cursor moves on. *examples (may be NULL) gets how many examples
 * they hold. */
int train_dataset_next(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                       int32_t *doc_ids, int64_t *examples, char *err, size_t errlen);

/* DPO (pairs): the next `npairs` pairs as the DPO step's rows [2 * npairs * T]: pair j's chosen
 * example in row j, its rejected one in row npairs + j, one example a row; row_ex [2 * npairs]
 * gets each row's example index (for its reference log-probability). */
int train_dataset_next_pairs(train_dataset *s, int64_t npairs, int32_t *ids, int32_t *labels,
                             int64_t *row_ex, char *err, size_t errlen);

/* GRPO (an unpacked step): the next `rows` rows as train_dataset_next lays them, with
 * row_ex [rows] each row's example (for its advantage and reference log-probs). */
int train_dataset_next_rows(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                            int64_t *row_ex, char *err, size_t errlen);

/* DPO or GRPO on a packed per-document step (per_doc): the next `rows` rows [rows * T] of
 * whole examples with their doc_ids, and doc_ex [rows * T] the example of document k of row r
 * at r*T + k (-1 past the row's documents), where the step reads that document's reference
 * log-prob or advantage. GRPO: next-fit as train_dataset_next. DPO: pairs in lockstep, pair
 * m of a row pair (j, rows/2 + j) its chosen answer as document m of row j and its rejected
 * one as document m of row rows/2 + j; the first pair that does not fit in both rows starts
 * the next row pair. */
int train_dataset_next_docs(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                            int32_t *doc_ids, int64_t *doc_ex, char *err, size_t errlen);

/* Example i alone in one row of T tokens (padded), for the reference pass. */
int train_dataset_row(train_dataset *s, int64_t i, int32_t *ids, int32_t *labels, char *err,
                      size_t errlen);

/* Moves the cursor to (epoch, pos) (a checkpoint's); 0 <= pos < n_units. */
int train_dataset_seek(train_dataset *s, int64_t epoch, int64_t pos, char *err, size_t errlen);

/* The optimizer steps that `epochs` passes take at `rows` rows a step (the last step may
 * reach into the next pass): computed from the examples' lengths, packing included. */
int64_t train_dataset_steps(const train_dataset *s, int64_t epochs, int64_t rows);

/* The dataset against the model it will train: where the model records its eos_token_id
 * (sbp-export keeps config.json in the ONNX metadata, key "sbp.config.json"), the dataset's
 * eos_id must be it (or one of them): data of another tokenizer is refused, naming both ids.
 * A model that records none says nothing. 0, or -1 with the message in err. */
int train_dataset_check_model(const train_dataset *s, const char *model_path, char *err,
                              size_t errlen);

/* A grpo dataset whose every advantage is 0 (groups of one row, or of equal rewards): GRPO's
 * gradient is then 0 at every step. */
bool train_dataset_no_advantage(const train_dataset *s);

/* The usage text of the options (ends in a newline). */
const char *train_dataset_usage(void);

#endif
