/* dataset.c — sbp-prepare's dataset files (docs/dataset-format.md, sbpio.h "datasets").
 *
 * The file is a safetensors file opened header only: a dataset may be larger than memory, and
 * a training run needs a few examples at a time. The open still reads everything once, in
 * pieces of a few MiB, because a file whose offsets lie or whose ids reach past the vocabulary
 * must be refused before step 1, not at the step that meets the bad example: it keeps only the
 * offsets (8 bytes an example) and the per-example fields, and the hash of what it read (the
 * data's identity in checkpoints). Examples are then read with pread (sbpio_st_read_range).
 *
 * The label rule is checked too (labels[t] is -100 or ids[t + 1] of the same example, the last
 * position -100): a file of unshifted labels, the usual off-by-one of hand-made data, would
 * otherwise train every token to predict itself. So is that each example scores a token: a
 * batch of examples that score nothing has no mean loss.
 */
#include "io_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PIECE = 1 << 20 }; /* tokens per read while validating */

/* Metadata key as an integer in [lo, hi]: the whole string, decimal. */
static int meta_int(const sbpio_st_file *f, const char *key, int64_t lo, int64_t hi,
                    int64_t *out, char *err, size_t errlen)
{
    const char *v = sbpio_st_meta(f, key);
    if (!v)
        return sbpio_errf(err, errlen, "%s: not a dataset file of sbp-prepare: the metadata has "
                          "no '%s'", sbpio_st_path(f), key);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) || x < lo ||
        x > hi)
        return sbpio_errf(err, errlen, "%s: metadata '%s' is '%.40s', not an integer from %" PRId64
                          " to %" PRId64, sbpio_st_path(f), key, v, lo, hi);
    *out = x;
    return SBPIO_OK;
}

/* The tensor `name`: present, of dtype dt, rank 1 with n elements (n < 0: any). */
static int vec(const sbpio_st_file *f, const char *name, sbpio_dtype dt, int64_t n,
               const sbpio_st_info **out, char *err, size_t errlen)
{
    const sbpio_st_info *t = sbpio_st_find(f, name);
    if (!t)
        return sbpio_errf(err, errlen, "%s: not a dataset file of sbp-prepare: no tensor '%s'",
                          sbpio_st_path(f), name);
    if (t->dtype != dt || t->rank != 1 || (n >= 0 && t->numel != n))
        return sbpio_errf(err, errlen, "%s: tensor '%s' is %s [%" PRId64 "%s], the format has "
                          "%s [%" PRId64 "]", sbpio_st_path(f), name, sbpio_dtype_name(t->dtype),
                          t->rank ? t->shape[0] : 0, t->rank > 1 ? ", ..." : "",
                          sbpio_dtype_name(dt), n);
    *out = t;
    return SBPIO_OK;
}

/* Reads the offsets and checks them against n_tok and max_len. */
static int load_offsets(sbpio_dataset *d, const sbpio_st_info *t, char *err, size_t errlen)
{
    const char *path = sbpio_st_path(d->f);
    const int64_t n = d->n_ex + 1;
    unsigned char *raw = malloc((size_t)n * 8);
    d->offsets = malloc((size_t)n * sizeof *d->offsets);
    if (!raw || !d->offsets) {
        free(raw);
        return sbpio_errf(err, errlen, "%s: out of memory for %" PRId64 " offsets", path, n);
    }
    int rc = sbpio_st_read_range(d->f, t, 0, n, raw, err, errlen);
    if (rc == SBPIO_OK)
        d->hash = sbpio_fnv1a(d->hash, raw, (size_t)n * 8);
    for (int64_t i = 0; i < n && rc == SBPIO_OK; i++) {
        d->offsets[i] = (int64_t)sbpio_le64(raw + 8 * i);
        const int64_t prev = i ? d->offsets[i - 1] : 0;
        if (i == 0 && d->offsets[0] != 0)
            rc = sbpio_errf(err, errlen, "%s: offsets[0] is %" PRId64 ", not 0", path,
                            d->offsets[0]);
        else if (i > 0 && (d->offsets[i] <= prev || d->offsets[i] > d->n_tok))
            rc = sbpio_errf(err, errlen, "%s: example %" PRId64 " spans tokens %" PRId64
                            " to %" PRId64 " of %" PRId64 ": the offsets must increase and stay "
                            "within input_ids", path, i - 1, prev, d->offsets[i], d->n_tok);
        else if (i > 0 && d->offsets[i] - prev > d->max_len)
            rc = sbpio_errf(err, errlen, "%s: example %" PRId64 " has %" PRId64 " tokens, more "
                            "than the file's max_len %" PRId64, path, i - 1,
                            d->offsets[i] - prev, d->max_len);
        else if (i > 0 && d->offsets[i] - prev > d->longest)
            d->longest = d->offsets[i] - prev;
    }
    if (rc == SBPIO_OK && d->offsets[d->n_ex] != d->n_tok)
        rc = sbpio_errf(err, errlen, "%s: the offsets end at token %" PRId64 ", but input_ids "
                        "holds %" PRId64, path, d->offsets[d->n_ex], d->n_tok);
    free(raw);
    return rc;
}

/* Every id and label, a piece at a time, against the vocabulary and the label rule. */
static int check_tokens(sbpio_dataset *d, char *err, size_t errlen)
{
    const char *path = sbpio_st_path(d->f);
    unsigned char *ids = malloc((size_t)PIECE * 4 + 4), *labels = malloc((size_t)PIECE * 4);
    int rc = !ids || !labels ? sbpio_errf(err, errlen, "%s: out of memory", path) : SBPIO_OK;
    int64_t ex = 0, ex_scored = 0; /* the example of token `at`, and its scored labels */
    for (int64_t at = 0; at < d->n_tok && rc == SBPIO_OK; at += PIECE) {
        /* one token past the piece, for the last label's next token */
        const int64_t m = d->n_tok - at < PIECE ? d->n_tok - at : PIECE;
        const int64_t m1 = at + m < d->n_tok ? m + 1 : m;
        if ((rc = sbpio_st_read_range(d->f, d->ids, at, m1, ids, err, errlen)) != SBPIO_OK ||
            (rc = sbpio_st_read_range(d->f, d->labels, at, m, labels, err, errlen)) != SBPIO_OK)
            break;
        d->hash = sbpio_fnv1a(sbpio_fnv1a(d->hash, ids, (size_t)m * 4), labels, (size_t)m * 4);
        for (int64_t k = 0; k < m && rc == SBPIO_OK; k++) {
            const int64_t t = at + k;
            while (t >= d->offsets[ex + 1]) {
                /* a row of examples that score nothing would have no loss to take the mean of */
                if (ex_scored == 0)
                    rc = sbpio_errf(err, errlen, "%s: example %" PRId64 " scores no token (every "
                                    "label -100): sbp-prepare leaves such examples out", path, ex);
                ex++;
                ex_scored = 0;
            }
            const int32_t id = (int32_t)sbpio_le32(ids + 4 * k);
            const int32_t lab = (int32_t)sbpio_le32(labels + 4 * k);
            const bool last = t + 1 == d->offsets[ex + 1];
            if (id < 0 || id >= d->vocab)
                rc = sbpio_errf(err, errlen, "%s: example %" PRId64 ", token %" PRId64 ": id %d "
                                "is outside the vocabulary of %" PRId64, path, ex,
                                t - d->offsets[ex], id, d->vocab);
            else if (lab != -100 &&
                     (last || lab != (int32_t)sbpio_le32(ids + 4 * (k + 1))))
                rc = sbpio_errf(err, errlen, "%s: example %" PRId64 ", position %" PRId64 ": "
                                "label %d is neither -100 nor the next token (%s): labels are "
                                "the targets of their positions, shifted (docs/dataset-format.md)",
                                path, ex, t - d->offsets[ex], lab,
                                last ? "it is the example's last position" : "the next id");
            d->scored += lab != -100;
            ex_scored += lab != -100;
        }
    }
    if (rc == SBPIO_OK && ex_scored == 0)
        rc = sbpio_errf(err, errlen, "%s: example %" PRId64 " scores no token (every label -100): "
                        "sbp-prepare leaves such examples out", path, ex);
    free(ids);
    free(labels);
    return rc;
}

int sbpio_dataset_open(const char *path, int64_t vocab, sbpio_dataset *d, char *err,
                       size_t errlen)
{
    memset(d, 0, sizeof *d);
    if (sbpio_st_open_header(path, &d->f, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    const char *fmt = sbpio_st_meta(d->f, "format"), *ver = sbpio_st_meta(d->f, "version");
    const char *task = sbpio_st_meta(d->f, "task");
    int rc = SBPIO_OK;
    int64_t examples = 0, tokens = 0, scored = 0;
    const sbpio_st_info *off = NULL, *adv = NULL;
    if (!fmt || strcmp(fmt, "sbp-dataset") != 0)
        rc = sbpio_errf(err, errlen, "%s: not a dataset file of sbp-prepare (metadata format is "
                        "'%.40s', not 'sbp-dataset')", path, fmt ? fmt : "(missing)");
    else if (!ver || strcmp(ver, "1") != 0)
        rc = sbpio_errf(err, errlen, "%s: dataset format version '%.20s'; this sbp-train reads "
                        "version 1", path, ver ? ver : "(missing)");
    else if (!task || (strcmp(task, "sft") && strcmp(task, "dpo") && strcmp(task, "grpo")))
        rc = sbpio_errf(err, errlen, "%s: metadata task is '%.20s', not sft, dpo or grpo", path,
                        task ? task : "(missing)");
    if (rc == SBPIO_OK)
        snprintf(d->task, sizeof d->task, "%s", task);
    if (rc == SBPIO_OK &&
        ((rc = meta_int(d->f, "vocab_size", 1, INT32_MAX, &d->vocab, err, errlen)) ||
         (rc = meta_int(d->f, "max_len", 1, INT32_MAX, &d->max_len, err, errlen)) ||
         (rc = meta_int(d->f, "eos_id", 0, d->vocab - 1, &d->eos_id, err, errlen)) ||
         (rc = meta_int(d->f, "pad_id", 0, d->vocab - 1, &d->pad_id, err, errlen)) ||
         (rc = meta_int(d->f, "examples", 1, INT64_MAX - 1, &examples, err, errlen)) ||
         (rc = meta_int(d->f, "tokens", 1, INT64_MAX, &tokens, err, errlen)) ||
         (rc = meta_int(d->f, "scored_tokens", 0, INT64_MAX, &scored, err, errlen))))
        rc = SBPIO_ERR;
    if (rc == SBPIO_OK && vocab > 0 && d->vocab > vocab)
        rc = sbpio_errf(err, errlen, "%s was tokenised for a vocabulary of %" PRId64 " ids, the "
                        "step's holds %" PRId64 ": prepare it with the model's own tokenizer",
                        path, d->vocab, vocab);
    if (rc == SBPIO_OK) {
        d->n_ex = examples;
        d->n_tok = tokens;
        d->hash = SBPIO_FNV_SEED;
        if ((rc = vec(d->f, "input_ids", SBPIO_DT_I32, tokens, &d->ids, err, errlen)) ||
            (rc = vec(d->f, "labels", SBPIO_DT_I32, tokens, &d->labels, err, errlen)) ||
            (rc = vec(d->f, "offsets", SBPIO_DT_I64, examples + 1, &off, err, errlen)))
            rc = SBPIO_ERR;
    }
    if (rc == SBPIO_OK && strcmp(d->task, "dpo") == 0 && examples % 2)
        rc = sbpio_errf(err, errlen, "%s: a dpo dataset holds pairs, but it has %" PRId64
                        " examples", path, examples);
    if (rc == SBPIO_OK && strcmp(d->task, "grpo") == 0 &&
        (rc = vec(d->f, "advantages", SBPIO_DT_F32, examples, &adv, err, errlen)) == SBPIO_OK) {
        d->advantages = malloc((size_t)examples * sizeof *d->advantages);
        if (!d->advantages ||
            sbpio_st_copy_f32(d->f, "advantages", d->advantages, examples, err, errlen))
            rc = d->advantages ? SBPIO_ERR : sbpio_errf(err, errlen, "%s: out of memory", path);
        for (int64_t i = 0; rc == SBPIO_OK && i < examples; i++)
            if (!isfinite(d->advantages[i]))
                rc = sbpio_errf(err, errlen, "%s: example %" PRId64 "'s advantage is %g", path, i,
                                (double)d->advantages[i]);
        if (rc == SBPIO_OK)
            d->hash = sbpio_fnv1a(d->hash, d->advantages, (size_t)examples * sizeof(float));
    }
    if (rc == SBPIO_OK)
        rc = load_offsets(d, off, err, errlen);
    if (rc == SBPIO_OK)
        rc = check_tokens(d, err, errlen);
    if (rc == SBPIO_OK && d->scored != scored)
        rc = sbpio_errf(err, errlen, "%s: the metadata says %" PRId64 " scored tokens, the "
                        "labels hold %" PRId64, path, scored, d->scored);
    if (rc == SBPIO_OK && d->scored == 0)
        rc = sbpio_errf(err, errlen, "%s: no label is scored (all -100): nothing to train", path);
    if (rc != SBPIO_OK)
        sbpio_dataset_close(d);
    return rc;
}

void sbpio_dataset_close(sbpio_dataset *d)
{
    if (!d)
        return;
    sbpio_st_close(d->f);
    free(d->offsets);
    free(d->advantages);
    memset(d, 0, sizeof *d);
}

int64_t sbpio_dataset_len(const sbpio_dataset *d, int64_t i)
{
    return i >= 0 && i < d->n_ex ? d->offsets[i + 1] - d->offsets[i] : 0;
}

int sbpio_dataset_example(const sbpio_dataset *d, int64_t i, int32_t *ids, int32_t *labels,
                          char *err, size_t errlen)
{
    if (i < 0 || i >= d->n_ex)
        return sbpio_errf(err, errlen, "%s: no example %" PRId64 " (it holds %" PRId64 ")",
                          sbpio_st_path(d->f), i, d->n_ex);
    const int64_t a = d->offsets[i], n = d->offsets[i + 1] - a;
    if (sbpio_st_read_range(d->f, d->ids, a, n, ids, err, errlen) != SBPIO_OK ||
        sbpio_st_read_range(d->f, d->labels, a, n, labels, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    if (!sbpio_host_is_le())
        for (int64_t k = 0; k < n; k++) {
            ids[k] = (int32_t)sbpio_le32((const unsigned char *)&ids[k]);
            labels[k] = (int32_t)sbpio_le32((const unsigned char *)&labels[k]);
        }
    /* the open checked these bytes; a file changed since then is caught here */
    for (int64_t k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= d->vocab || (labels[k] != -100 && labels[k] < 0))
            return sbpio_errf(err, errlen, "%s: example %" PRId64 " changed since the file was "
                              "opened", sbpio_st_path(d->f), i);
    return SBPIO_OK;
}
