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
    const char *flag = s->flag = o->flag ? o->flag : "--dataset";
    char why[600];
    if (sbpio_dataset_open(o->path, in->vocab, &s->d, why, sizeof why) != SBPIO_OK)
        return cli_errf(err, errlen, "%s: %s", flag, why);
    const char *obj = in->objective ? in->objective : "sft";
    const bool dpo_step = strcmp(obj, "dpo") == 0;
    const bool sft_step = strcmp(obj, "sft") == 0 || strcmp(obj, "graph-loss") == 0;
    const bool dpo_data = strcmp(s->d.task, "dpo") == 0;
    const bool grpo = strcmp(obj, "grpo") == 0 && strcmp(s->d.task, "grpo") == 0;
    if (!(sft_step && strcmp(s->d.task, "sft") == 0) && !(dpo_step && dpo_data) && !grpo) {
        cli_errf(err, errlen, "%s: %s is a %s dataset, and the step's objective is %s: "
                 "sbp-train trains sft, dpo and grpo steps on datasets of their own task "
                 "(sbp-prepare --task)", flag, o->path, s->d.task, obj);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    if ((dpo_data || grpo) && packed && !in->per_document) {
        cli_errf(err, errlen, "%s: %s: a packed %s step sums each row's documents into one "
                 "log-prob, so packed rows of a %s dataset would mix its examples: compile the "
                 "step with sbpc --packed --per-document (one log-prob per document), or without "
                 "--packed", flag, o->path, s->d.task, s->d.task);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    s->pairs = dpo_data;
    s->per_doc = packed && (dpo_data || grpo);
    s->n_units = dpo_data ? s->d.n_ex / 2 : s->d.n_ex;
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
        cli_errf(err, errlen, "%s: %s: example %" PRId64 " has %" PRId64 " tokens, but "
                 "the step's rows hold %" PRId64 ": prepare the data with sbp-prepare --max-len "
                 "%" PRId64 " (and a --truncate mode), or compile the step for a longer "
                 "--seq-len", flag, o->path, at, sbpio_dataset_len(&s->d, at), s->T, s->T);
        sbpio_dataset_close(&s->d);
        return -1;
    }
    s->order = malloc((size_t)s->n_units * sizeof *s->order);
    s->tmp_ids = malloc((size_t)s->T * sizeof *s->tmp_ids);
    s->tmp_labels = malloc((size_t)s->T * sizeof *s->tmp_labels);
    if (!s->order || !s->tmp_ids || !s->tmp_labels) {
        train_dataset_close(s);
        return cli_errf(err, errlen, "out of memory");
    }
    epoch_order(s->order, s->n_units, s->shuffle, s->seed, 0);
    return 0;
}

int train_dataset_check_model(const train_dataset *s, const char *model_path, char *err,
                              size_t errlen)
{
    sbpio_kv *kv = NULL;
    int n = 0;
    char why[600];
    if (sbpio_onnx_meta_read(model_path, &kv, &n, why, sizeof why) != SBPIO_OK)
        return 0; /* the model's import reports an unreadable file, with its own words */
    const char *cfg = sbpio_onnx_meta_get(kv, n, "sbp.config.json");
    uint64_t eos[16];
    const int k = cfg ? sbpio_json_object_ids(cfg, strlen(cfg), "eos_token_id", eos, 16) : 0;
    bool match = k == 0;
    for (int i = 0; i < k; i++)
        match = match || eos[i] == (uint64_t)s->d.eos_id;
    int rc = 0;
    if (!match)
        rc = cli_errf(err, errlen, "%s: %s was tokenised with eos_id %" PRId64 ", and the "
                      "model's eos_token_id is %" PRIu64 "%s (%s, its config.json): prepare "
                      "the data with the model's tokenizer (sbp-prepare --tokenizer MODEL_DIR)",
                      s->flag, sbpio_st_path(s->d.f), s->d.eos_id, eos[0],
                      k > 1 ? " among others" : "", model_path);
    sbpio_onnx_meta_free(kv, n);
    return rc;
}

bool train_dataset_no_advantage(const train_dataset *s)
{
    for (int64_t i = 0; s->d.advantages && i < s->d.n_ex; i++)
        if (s->d.advantages[i] != 0)
            return false;
    return s->d.advantages != NULL;
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
    if (++s->pos == s->n_units) {
        s->pos = 0;
        s->epoch++;
        epoch_order(s->order, s->n_units, s->shuffle, s->seed, s->epoch);
    }
    return ex;
}

/* Example ex at position `at` of row r as document `doc`: its ids, labels and document ids
 * (doc_ids may be NULL). A per-document step counts a row's documents by their scored tokens,
 * so there an example with none is refused rather than silently shifting the documents after
 * it (sbp-prepare drops such examples). */
static int place(train_dataset *s, int64_t ex, int64_t r, int64_t at, int64_t doc, int32_t *ids,
                 int32_t *labels, int32_t *doc_ids, char *err, size_t errlen)
{
    const int64_t T = s->T, len = sbpio_dataset_len(&s->d, ex);
    char why[600];
    if (sbpio_dataset_example(&s->d, ex, s->tmp_ids, s->tmp_labels, why, sizeof why) !=
        SBPIO_OK)
        return cli_errf(err, errlen, "%s: %s", s->flag, why);
    bool scored = false;
    for (int64_t t = 0; t < len; t++)
        scored = scored || s->tmp_labels[t] != -100;
    if (s->per_doc && !scored)
        return cli_errf(err, errlen, "%s: %s: example %" PRId64 " has no scored token; a "
                        "per-document step's documents are its rows' runs of scored tokens: "
                        "drop the example (sbp-prepare does)", s->flag, sbpio_st_path(s->d.f),
                        ex);
    memcpy(ids + r * T + at, s->tmp_ids, (size_t)len * sizeof *ids);
    memcpy(labels + r * T + at, s->tmp_labels, (size_t)len * sizeof *labels);
    for (int64_t t = 0; doc_ids && t < len; t++)
        doc_ids[r * T + at + t] = (int32_t)doc;
    return 0;
}

/* Row r from position `used` on: padding (id pad_id, label -100, document id `doc`). */
static void pad(train_dataset *s, int64_t r, int64_t used, int64_t doc, int32_t *ids,
                int32_t *labels, int32_t *doc_ids)
{
    const int64_t T = s->T;
    for (int64_t t = used; t < T; t++) {
        ids[r * T + t] = (int32_t)s->d.pad_id;
        labels[r * T + t] = -100;
        if (doc_ids)
            doc_ids[r * T + t] = (int32_t)doc;
    }
}

/* Rows of the cursor's examples; dry: lengths only (ids, labels, doc_ids unused). doc_ex
 * (may be NULL) [rows * T]: document k of row r's example at r*T + k, -1 past the row's. */
static int fill(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels, int32_t *doc_ids,
                int64_t *row_ex, int64_t *doc_ex, bool dry, int64_t *examples, char *err,
                size_t errlen)
{
    const int64_t T = s->T;
    int64_t n = 0;
    for (int64_t i = 0; doc_ex && i < rows * T; i++)
        doc_ex[i] = -1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t used = 0, doc = 0;
        for (;;) {
            const int64_t len = sbpio_dataset_len(&s->d, s->order[s->pos]);
            if (used > 0 && (!s->packed || used + len > T))
                break; /* the row is full: padding from here */
            const int64_t ex = take(s);
            if (row_ex) /* the row's (first) example */
                row_ex[r] = used ? row_ex[r] : ex;
            if (doc_ex)
                doc_ex[r * T + doc] = ex;
            n++;
            if (!dry && place(s, ex, r, used, doc, ids, labels, doc_ids, err, errlen))
                return -1;
            used += len;
            doc++;
            if (used == T)
                break;
        }
        if (!dry)
            pad(s, r, used, doc, ids, labels, doc_ids);
    }
    if (examples)
        *examples = n;
    return 0;
}

/* DPO, packed per document: row pair (j, npairs + j) takes whole pairs in order, pair m's
 * chosen answer as document m of row j and its rejected one as document m of row npairs + j,
 * while both fit (next-fit in lockstep: the first pair that does not fit in either row starts
 * the next row pair); dry: lengths only. doc_ex as fill's. */
static int fill_pairs(train_dataset *s, int64_t npairs, int32_t *ids, int32_t *labels,
                      int32_t *doc_ids, int64_t *doc_ex, bool dry, char *err, size_t errlen)
{
    const int64_t T = s->T;
    for (int64_t i = 0; doc_ex && i < 2 * npairs * T; i++)
        doc_ex[i] = -1;
    for (int64_t j = 0; j < npairs; j++) {
        int64_t used[2] = {0, 0}, doc = 0;
        const int64_t row[2] = {j, npairs + j};
        for (;;) {
            const int64_t p = s->order[s->pos];
            const int64_t len[2] = {sbpio_dataset_len(&s->d, 2 * p),
                                    sbpio_dataset_len(&s->d, 2 * p + 1)};
            if (doc > 0 && (used[0] + len[0] > T || used[1] + len[1] > T))
                break;
            take(s);
            for (int side = 0; side < 2; side++) {
                if (doc_ex)
                    doc_ex[row[side] * T + doc] = 2 * p + side;
                if (!dry && place(s, 2 * p + side, row[side], used[side], doc, ids, labels,
                                  doc_ids, err, errlen))
                    return -1;
                used[side] += len[side];
            }
            doc++;
            if (used[0] == T || used[1] == T)
                break;
        }
        for (int side = 0; !dry && side < 2; side++)
            pad(s, row[side], used[side], doc, ids, labels, doc_ids);
    }
    return 0;
}

int train_dataset_next(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                       int32_t *doc_ids, int64_t *examples, char *err, size_t errlen)
{
    return fill(s, rows, ids, labels, s->packed ? doc_ids : NULL, NULL, NULL, false, examples,
                err, errlen);
}

int train_dataset_next_rows(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                            int64_t *row_ex, char *err, size_t errlen)
{
    return fill(s, rows, ids, labels, NULL, row_ex, NULL, false, NULL, err, errlen);
}

int train_dataset_next_docs(train_dataset *s, int64_t rows, int32_t *ids, int32_t *labels,
                            int32_t *doc_ids, int64_t *doc_ex, char *err, size_t errlen)
{
    if (s->pairs)
        return fill_pairs(s, rows / 2, ids, labels, doc_ids, doc_ex, false, err, errlen);
    return fill(s, rows, ids, labels, doc_ids, NULL, doc_ex, false, NULL, err, errlen);
}

int train_dataset_row(train_dataset *s, int64_t i, int32_t *ids, int32_t *labels, char *err,
                      size_t errlen)
{
    char why[600];
    const int64_t len = sbpio_dataset_len(&s->d, i);
    if (sbpio_dataset_example(&s->d, i, ids, labels, why, sizeof why) != SBPIO_OK)
        return cli_errf(err, errlen, "%s: %s", s->flag, why);
    for (int64_t t = len; t < s->T; t++) {
        ids[t] = (int32_t)s->d.pad_id;
        labels[t] = -100;
    }
    return 0;
}

int train_dataset_next_pairs(train_dataset *s, int64_t npairs, int32_t *ids, int32_t *labels,
                             int64_t *row_ex, char *err, size_t errlen)
{
    for (int64_t j = 0; j < npairs; j++) {
        const int64_t pair = take(s);
        for (int side = 0; side < 2; side++) {
            const int64_t row = side ? npairs + j : j, ex = 2 * pair + side;
            row_ex[row] = ex;
            if (train_dataset_row(s, ex, ids + row * s->T, labels + row * s->T, err, errlen))
                return -1;
        }
    }
    return 0;
}

int train_dataset_seek(train_dataset *s, int64_t epoch, int64_t pos, char *err, size_t errlen)
{
    if (epoch < 0 || pos < 0 || pos >= s->n_units)
        return cli_errf(err, errlen, "%s: position %" PRId64 " of pass %" PRId64 " is "
                        "outside %s's %" PRId64 " %s", s->flag, pos, epoch, sbpio_st_path(s->d.f),
                        s->n_units, s->pairs ? "pairs" : "examples");
    s->epoch = epoch;
    s->pos = pos;
    epoch_order(s->order, s->n_units, s->shuffle, s->seed, epoch);
    return 0;
}

int64_t train_dataset_steps(const train_dataset *s, int64_t epochs, int64_t rows)
{
    if (s->pairs && !s->per_doc) /* rows / 2 pairs a step, whatever their lengths */
        return epochs < 1 || rows < 2 ? -1 : (epochs * s->n_units + rows / 2 - 1) / (rows / 2);
    train_dataset c = *s; /* a dry run from the start, on its own order */
    c.order = malloc((size_t)s->n_units * sizeof *c.order);
    if (!c.order || epochs < 1 || rows < 1) {
        free(c.order);
        return -1;
    }
    c.epoch = 0;
    c.pos = 0;
    epoch_order(c.order, c.n_units, c.shuffle, c.seed, 0);
    int64_t steps = 0;
    while (c.epoch < epochs) {
        if (c.pairs ? fill_pairs(&c, rows / 2, NULL, NULL, NULL, NULL, true, NULL, 0)
                    : fill(&c, rows, NULL, NULL, NULL, NULL, NULL, true, NULL, NULL, 0))
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
           "                          rows is refused: prepare with --max-len T. A dpo dataset\n"
           "                          trains a dpo step: pairs in the step's layout, and the\n"
           "                          reference log-probs computed before step 1 from the\n"
           "                          model's initial weights (the step's sbp_step_logps).\n"
           "                          A grpo dataset trains a grpo step: one rollout a row with\n"
           "                          the file's advantage, old log-probs on-policy, and with\n"
           "                          beta > 0 each token's reference log-prob computed so too.\n"
           "                          Packed (a step of sbpc --packed --per-document, --pack):\n"
           "                          whole rollouts next-fit, or whole pairs in lockstep (pair\n"
           "                          m: document m of rows j and B/2 + j)\n"
           "  --ref-cache FILE        where a dataset's reference log-probs are kept\n"
           "                          (default: ref-logps.safetensors beside the checkpoints),\n"
           "                          keyed by the model's initial weights, the step's model and\n"
           "                          the dataset: a resumed or second run reuses them, another\n"
           "                          model or dataset computes its own; a file there that is\n"
           "                          not such a cache is never replaced (refused)\n"
           "  --compute-logps OUT     with a dpo or grpo step and --dataset: write each\n"
           "                          example's log-prob under the model (OUT.safetensors:\n"
           "                          row_logps [examples]; grpo also token_logps [tokens])\n"
           "                          and train nothing (training's options are refused);\n"
           "                          under mpirun the ranks share the batches (the same file\n"
           "                          as one process's)\n"
           "  (--ref-logps and --old-logps with --dataset: see DPO and GRPO steps below)\n"
           "  --epochs E              train E passes over the dataset (sets --steps: the steps\n"
           "                          E passes take, the last one may reach into pass E + 1)\n"
           "  --shuffle-seed S        a new order each pass: a Fisher-Yates shuffle driven by\n"
           "                          splitmix64 from S + (pass + 1) * 0x9E3779B97F4A7C15 (passes\n"
           "                          from 0); without it, file order. Checkpoints keep the pass\n"
           "                          and position: a resumed run reads the same rows\n";
}
