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
 * Order. Epoch e (from 0) visits every example once: in file order, or with --shuffle-seed S
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
    int64_t epochs;   /* --epochs E, or 0: --steps decides */
    bool shuffle;     /* --shuffle-seed given */
    uint64_t seed;    /* --shuffle-seed S */
} train_dataset_opts;

typedef struct train_dataset {
    sbpio_dataset d;  /* the file */
    int64_t T;        /* the step's row length */
    bool packed;      /* rows of several examples (a packed step) */
    bool shuffle;
    uint64_t seed;
    int64_t *order;   /* [d.n_ex] this epoch's order of the examples */
    int64_t epoch;    /* the cursor: the pass over the data, from 0 */
    int64_t pos;      /* ... and the next example's index in order */
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

/* Moves the cursor to (epoch, pos) (a checkpoint's); 0 <= pos < examples. */
int train_dataset_seek(train_dataset *s, int64_t epoch, int64_t pos, char *err, size_t errlen);

/* The optimizer steps that `epochs` passes take at `rows` rows a step (the last step may
 * reach into the next pass): computed from the examples' lengths, packing included. */
int64_t train_dataset_steps(const train_dataset *s, int64_t epochs, int64_t rows);

/* The usage text of the options (ends in a newline). */
const char *train_dataset_usage(void);

#endif
