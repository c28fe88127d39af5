/* train_dataset.c — rows from an sbp-prepare dataset (train_dataset.h): the epoch's order,
 * one example a row or next-fit packing, and the cursor checkpoints keep.
 *
 * The row filler runs in two modes over the same code: for real (reading each example from the
 * file) and dry (lengths only, from the offsets), so that --epochs can count the steps a
 * packing takes with the very rule that will pack them. */
#include "train_dataset.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* order = epoch e's visiting order of n examples (train_dataset.h, "Order"). */
static void epoch_order(int64_t *order, int64_t n, bool shuffle, uint64_t seed, int64_t e)
{
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    if (!shuffle)
        return;
    uint64_t x = seed + (uint64_t)(e + 1) * 0x9E3779B97F4A7C15ULL;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix64(&x) % (uint64_t)(i + 1));
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

int train_dataset_open(train_dataset *s, const train_dataset_opts *o, const sbp_step_info *in,
                       bool packed, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    char why[600];
    if (sbpio_dataset_open(o->path, in->vocab, &s->d, why, sizeof why) != SBPIO_OK)
        return cli_errf(err, errlen, "--dataset: %s", why);
    if (strcmp(s->d.task, "sft") != 0) {
        cli_errf(err, errlen, "--dataset: %s is a %s dataset; sbp-train trains on sft datasets "
                 "(prepare with sbp-prepare --task sft)", o->path, s->d.task);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    if (in->objective && strcmp(in->objective, "sft") != 0 &&
        strcmp(in->objective, "graph-loss") != 0) {
        cli_errf(err, errlen, "--dataset: the step's objective is %s; an sft dataset trains an "
                 "sft step", in->objective);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    s->T = in->seq_len;
    s->packed = packed;
    s->shuffle = o->shuffle;
    s->seed = o->seed;
    if (s->d.longest > s->T) {
        int64_t at = 0;
        for (int64_t i = 0; i < s->d.n_ex; i++)
            if (sbpio_dataset_len(&s->d, i) > s->T) {
                at = i;
                break;
            }
        cli_errf(err, errlen, "--dataset: %s: example %" PRId64 " has %" PRId64 " tokens, but "
                 "the step's rows hold %" PRId64 ": prepare the data with sbp-prepare --max-len "
                 "%" PRId64 " (and a --truncate mode), or compile the step for a longer "
                 "--seq-len", o->path, at, sbpio_dataset_len(&s->d, at), s->T, s->T);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    s->order = malloc((size_t)s->d.n_ex * sizeof *s->order);
    s->tmp_ids = malloc((size_t)s->T * sizeof *s->tmp_ids);
    s->tmp_labels = malloc((size_t)s->T * sizeof *s->tmp_labels);
    if (!s->order || !s->tmp_ids || !s->tmp_labels) {
        train_dataset_close(s);
        return cli_errf(err, errlen, "out of memory");
    }
    epoch_order(s->order, s->d.n_ex, s->shuffle, s->seed, 0);
    return 0;
}

void train_dataset_close(train_dataset *s)
{
    if (!s)
        return;
    sbpio_dataset_close(&s->d);
    free(s->order);
    free(s->tmp_ids);
    free(s->tmp_labels);
    memset(s, 0, sizeof *s);
}

/* The cursor's example, and the cursor moved past it (into the next epoch at the end). */
static int64_t take(train_dataset *s)
{
    int64_t ex = s->order[s->pos];
    if (++s->pos == s->d.n_ex) {
        s->pos = 0;
        s->epoch++;
        epoch_order(s->order, s->d.n_ex, s->shuffle, s->seed, s->epoch);
    }
    return ex;
}

/* Rows of the cursor's examples; dry: lengths only (ids, labels, doc_ids unused). */
static int fill(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels, int32_t *doc_ids,
                bool dry, int64_t *examples, char *err, size_t errlen)
{
    const int64_t T = s->T;
    int64_t n = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t used = 0, doc = 0;
        for (;;) {
            const int64_t len = sbpio_dataset_len(&s->d, s->order[s->pos]);
            if (used > 0 && (!s->packed || used + len > T))
                break; /* the row is full: padding from here */
            const int64_t ex = take(s);
            n++;
            if (!dry) {
                char why[600];
                if (sbpio_dataset_example(&s->d, ex, s->tmp_ids, s->tmp_labels, why,
                                          sizeof why) != SBPIO_OK)
                    return cli_errf(err, errlen, "--dataset: %s", why);
                memcpy(ids + r * T + used, s->tmp_ids, (size_t)len * sizeof *ids);
                memcpy(labels + r * T + used, s->tmp_labels, (size_t)len * sizeof *labels);
                for (int64_t t = 0; doc_ids && t < len; t++)
                    doc_ids[r * T + used + t] = (int32_t)doc;
            }
            used += len;
            doc++;
            if (used == T)
                break;
        }
        for (int64_t t = used; !dry && t < T; t++) {
            ids[r * T + t] = (int32_t)s->d.pad_id;
            labels[r * T + t] = -100;
            if (doc_ids)
                doc_ids[r * T + t] = (int32_t)doc;
        }
    }
    if (examples)
        *examples = n;
    return 0;
}

int train_dataset_next(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                       int32_t *doc_ids, int64_t *examples, char *err, size_t errlen)
{
    return fill(s, rows, ids, labels, s->packed ? doc_ids : NULL, false, examples, err, errlen);
}

int train_dataset_seek(train_dataset *s, int64_t epoch, int64_t pos, char *err, size_t errlen)
{
    if (epoch < 0 || pos < 0 || pos >= s->d.n_ex)
        return cli_errf(err, errlen, "--dataset: position %" PRId64 " of pass %" PRId64 " is "
                        "outside %s's %" PRId64 " examples", pos, epoch, sbpio_st_path(s->d.f),
                        s->d.n_ex);
    s->epoch = epoch;
    s->pos = pos;
    epoch_order(s->order, s->d.n_ex, s->shuffle, s->seed, epoch);
    return 0;
}

int64_t train_dataset_steps(const train_dataset *s, int64_t epochs, int64_t rows)
{
    train_dataset c = *s; /* a dry run from the start, on its own order */
    c.order = malloc((size_t)s->d.n_ex * sizeof *c.order);
    if (!c.order || epochs < 1 || rows < 1) {
        free(c.order);
        return -1;
    }
    c.epoch = 0;
    c.pos = 0;
    epoch_order(c.order, c.d.n_ex, c.shuffle, c.seed, 0);
    int64_t steps = 0;
    while (c.epoch < epochs) {
        if (fill(&c, rows, NULL, NULL, NULL, true, NULL, NULL, 0))
            break;
        steps++;
    }
    free(c.order);
    return steps;
}

const char *train_dataset_usage(void)
{
    return "datasets (sbp-prepare's files, docs/dataset-format.md):\n"
           "  --dataset FILE          train on the examples of FILE (an sft dataset): one\n"
           "                          example a row from position 0, the rest of the row padding\n"
           "                          (never scored); with a packed step and --pack, whole\n"
           "                          examples back to back, next-fit in order (one that does not\n"
           "                          fit starts the next row; each example its own document,\n"
           "                          with its own labels). An example longer than the step's\n"
           "                          rows is refused: prepare with --max-len T\n"
           "  --epochs E              train E passes over the dataset (sets --steps: the steps\n"
           "                          E passes take, the last one may reach into pass E + 1)\n"
           "  --shuffle-seed S        a new order each pass: a Fisher-Yates shuffle driven by\n"
           "                          splitmix64 from S + (pass + 1) * 0x9E3779B97F4A7C15 (passes\n"
           "                          from 0); without it, file order. Checkpoints keep the pass\n"
           "                          and position: a resumed run reads the same rows\n";
}
