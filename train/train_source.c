/* train_source.c — the data sources of train_source.h: each kind's opening checks (against the
 * step's B, T, V, before the model is read: they are cheap) and its `next`.
 */
#include "train_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbprt.h"

/* NumPy's name for an element type, for messages about .npy files. */
static const char *numpy_name(sbpio_dtype t)
{
    switch (t) {
    case SBPIO_DT_BOOL: return "bool";
    case SBPIO_DT_U8: return "uint8";
    case SBPIO_DT_I8: return "int8";
    case SBPIO_DT_U16: return "uint16";
    case SBPIO_DT_I16: return "int16";
    case SBPIO_DT_U32: return "uint32";
    case SBPIO_DT_I32: return "int32";
    case SBPIO_DT_U64: return "uint64";
    case SBPIO_DT_I64: return "int64";
    case SBPIO_DT_F16: return "float16";
    case SBPIO_DT_BF16: return "bfloat16";
    case SBPIO_DT_F32: return "float32";
    case SBPIO_DT_F64: return "float64";
    default: return "an unknown type";
    }
}

/* Reads token ids or labels [K*B,T] (K micro-batches) from a .npy file into out, checking
 * dtype, shape and range; `pairs` (DPO): the rows must pair up. */
static int load_tokens(const char *path, bool labels, const sbp_step_info *in,
                       const char *step_path, int64_t k, bool pairs, int32_t *out,
                       const train_sink *s)
{
    const char *what = labels ? "labels" : "input_ids";
    char err[512];
    sbpio_array a;
    if (sbpio_npy_read(path, &a, err, sizeof err) != SBPIO_OK)
        return train_err(s, "%s", err);
    int rc = 0;
    if (a.dtype != SBPIO_DT_I32 && a.dtype != SBPIO_DT_I64) {
        rc = train_err(s, "%s: %s must be int32 or int64, but the file holds %s", path, what,
                   numpy_name(a.dtype));
    } else if (pairs && a.rank == 2 && a.shape[0] % 2 != 0) {
        rc = train_err(s, "%s: %s have %lld rows, an odd number: the step's objective is dpo, which "
                   "pairs row i (chosen) with row N/2 + i (rejected)", path, what,
                   (long long)a.shape[0]);
    } else if (a.rank != 2 || a.shape[0] != k * in->batch || a.shape[1] != in->seq_len) {
        char hs[256], ws[64], acc[96] = "";
        int64_t want[2] = {k * in->batch, in->seq_len};
        if (k > 1)
            snprintf(acc, sizeof acc, " times --grad-accum %lld", (long long)k);
        rc = train_err(s, "%s: %s have shape %s, but %s was compiled for batch %lld%s and sequence "
                   "length %lld (%s): pass inputs of that shape or recompile the step with "
                   "sbpc --batch and --seq-len", path, what,
                   train_shape_str(hs, sizeof hs, a.rank, a.shape), step_path, (long long)in->batch,
                   acc, (long long)in->seq_len, train_shape_str(ws, sizeof ws, 2, want));
    } else {
        for (int64_t i = 0; i < a.numel && rc == 0; i++) {
            int64_t v = a.dtype == SBPIO_DT_I32 ? ((const int32_t *)a.data)[i]
                                                : ((const int64_t *)a.data)[i];
            long long b = (long long)(i / in->seq_len), t = (long long)(i % in->seq_len);
            if (labels && v != SBPRT_IGNORE_INDEX && (v < 0 || v >= in->vocab))
                rc = train_err(s, "%s: labels[%lld,%lld] = %lld is neither a token id in [0, %lld) nor "
                           "-100 (not scored)", path, b, t, (long long)v, (long long)in->vocab);
            else if (!labels && (v < 0 || v >= in->vocab))
                rc = train_err(s, "%s: input_ids[%lld,%lld] = %lld is out of range: %s was compiled for "
                           "a vocabulary of %lld tokens (ids 0 to %lld)", path, b, t,
                           (long long)v, step_path, (long long)in->vocab,
                           (long long)in->vocab - 1);
            else
                out[i] = (int32_t)v;
        }
    }
    sbpio_array_free(&a);
    return rc;
}


/* --------------------------------------------------------------- next, by kind */

/* npy: the one batch, read at open, every step. */
static int next_npy(train_source *src, int64_t s, const train_sink *sink)
{
    (void)src, (void)s, (void)sink;
    return 0;
}

/* shard / packed: K micro-batches from the cursor; a note when the shard starts over. */
static int next_shard(train_source *src, int64_t s, const train_sink *sink)
{
    const train_config *o = src->c;
    const int64_t G = src->G, T = src->T;
    const size_t gtok = (size_t)(G * T);
    char err[512];
    for (int64_t k = 0; k < src->K; k++) {
        int64_t epoch = src->shard.epoch;
        if (o->pack.pack /* rows of whole documents, the same shard cursor */
                ? train_pack_shard(&src->shard, (uint32_t)o->pack.eos, T, G,
                                   src->ids + (size_t)k * gtok, src->labels + (size_t)k * gtok,
                                   src->doc_ids + (size_t)k * gtok, err, sizeof err)
                : sbpio_shard_next_batch(&src->shard, (int)G, (int)T,
                                         src->ids + (size_t)k * gtok,
                                         src->labels + (size_t)k * gtok, err, sizeof err))
            return train_err(sink, "step %lld: %s", (long long)s, err);
        if (src->shard.epoch != epoch && src->shard.epoch > src->epoch0)
            train_say(sink, "note", "step %lld: %s is exhausted; starting over from its first "
                      "token (pass %lld)", (long long)s, o->data_path,
                      (long long)src->shard.epoch + 1);
    }
    return 0;
}

/* dataset: DPO pairs as (row i, row K*G/2 + i), GRPO rows one example each, or K micro-batches
 * of G rows; the examples of the rows in row_ex when the run needs their reference log-probs;
 * a note when a pass ends (unless --epochs asked for passes). */
static int next_dataset(train_source *src, int64_t s, const train_sink *sink)
{
    const train_config *o = src->c;
    train_dataset *ds = &src->ds;
    const int64_t K = src->K, G = src->G, T = src->T, N = K * G, epoch = ds->epoch;
    char err[700];
    int rc = 0;
    if (ds->per_doc) { /* packed DPO / GRPO: whole examples, one document each */
        rc = train_dataset_next_docs(ds, N, src->ids, src->labels, src->doc_ids, src->doc_ex,
                                     err, sizeof err);
    } else if (ds->pairs) {
        rc = train_dataset_next_pairs(ds, N / 2, src->ids, src->labels, src->row_ex, err,
                                      sizeof err);
    } else if (strcmp(ds->d.task, "grpo") == 0) {
        rc = train_dataset_next_rows(ds, N, src->ids, src->labels, src->row_ex, err, sizeof err);
    } else {
        const size_t gtok = (size_t)(G * T);
        for (int64_t k = 0; k < K && !rc; k++)
            rc = train_dataset_next(ds, G, src->ids + (size_t)k * gtok,
                                    src->labels + (size_t)k * gtok,
                                    src->doc_ids ? src->doc_ids + (size_t)k * gtok : NULL, NULL,
                                    err, sizeof err);
    }
    if (rc)
        return train_err(sink, "step %lld: %s", (long long)s, err);
    if (ds->epoch != epoch && !o->dataset.epochs)
        train_say(sink, "note", "step %lld: pass %lld over %s is done; pass %lld begins",
                  (long long)s, (long long)epoch + 1, o->dataset.path, (long long)ds->epoch + 1);
    return 0;
}

static const train_source_ops npy_ops = {"npy", next_npy};
static const train_source_ops shard_ops = {"shard", next_shard};
static const train_source_ops packed_ops = {"packed", next_shard};
static const train_source_ops dataset_ops = {"dataset", next_dataset};

int train_source_next(train_source *src, int64_t s, const train_sink *sink)
{
    if (src->ops->next(src, s, sink))
        return -1;
    if (src->doc_ids) { /* what packing saves of attention, measured on the (global) data */
        train_pack_attention_work(src->doc_ids, src->K * src->G, src->T, &src->pairs_packed,
                                  &src->pairs_full, &src->n_docs);
        src->n_rows += src->K * src->G;
    }
    return 0;
}

/* --------------------------------------------------------------- open, by kind */

static int open_dataset(train_source *src, const sbp_step_info *in, int64_t *steps,
                        const train_sink *s)
{
    const train_config *o = src->c;
    char err[512];
    if (train_dataset_open(&src->ds, &o->dataset, in, in->packed, err, sizeof err))
        return train_err(s, "%s", err);
    src->have_ds = true;
    src->ops = &dataset_ops;
    if (o->dataset.epochs) { /* --epochs: the steps that many passes take */
        *steps = train_dataset_steps(&src->ds, o->dataset.epochs, src->K * src->G);
        if (*steps < 1)
            return train_err(s, "out of memory");
    }
    train_say(s, "note", "%s: %lld examples, %lld tokens (%lld scored), the longest %lld; %s%s",
              o->dataset.path, (long long)src->ds.d.n_ex, (long long)src->ds.d.n_tok,
              (long long)src->ds.d.scored, (long long)src->ds.d.longest,
              !in->packed ? "one example a row" : src->ds.pairs ? "pairs packed next-fit into row pairs, a document each" : "packed next-fit into rows",
              o->dataset.shuffle ? ", shuffled each pass" : ", in file order");
    /* DPO pairs and GRPO rows: the examples of each step's rows (of each document, packed
     * per document), for their reference */
    if (src->ds.per_doc) {
        if (!(src->doc_ex = malloc((size_t)(src->K * src->G * src->T) * sizeof *src->doc_ex)))
            return train_err(s, "out of memory");
    } else if ((src->ds.pairs || strcmp(src->ds.d.task, "grpo") == 0) &&
               !(src->row_ex = malloc((size_t)(src->K * src->G) * sizeof *src->row_ex))) {
        return train_err(s, "out of memory");
    }
    return 0;
}

static int open_shard(train_source *src, const train_sink *s)
{
    const train_config *o = src->c;
    const int64_t G = src->G, T = src->T;
    char err[512];
    if (sbpio_shard_open(o->data_path, &src->shard, err, sizeof err) != SBPIO_OK)
        return train_err(s, "%s", err);
    src->have_shard = true;
    src->ops = o->pack.pack ? &packed_ops : &shard_ops;
    if (src->shard.ntok < G * T + 1)
        return train_err(s, "%s holds %lld tokens, fewer than one batch of %s needs (batch %lld "
                         "x sequence length %lld + 1 = %lld)", o->data_path,
                         (long long)src->shard.ntok, o->step_path, (long long)G, (long long)T,
                         (long long)(G * T + 1));
    return 0;
}

static int open_npy(train_source *src, const sbp_step_info *bin, bool pairs, const train_sink *s)
{
    const train_config *o = src->c;
    src->ops = &npy_ops;
    if (load_tokens(o->ids_path, false, bin, o->step_path, src->K, pairs, src->ids, s) ||
        load_tokens(o->labels_path, true, bin, o->step_path, src->K, pairs, src->labels, s))
        return -1;
    size_t scored = 0;
    for (size_t i = 0; i < (size_t)(src->K * src->G * src->T); i++)
        scored += src->labels[i] != SBPRT_IGNORE_INDEX;
    if (scored == 0)
        return train_err(s, "%s: every label is -100: no position is scored, there is nothing to "
                         "train", o->labels_path);
    return 0;
}

/* A packed step's document ids, of the global batch as the ids and labels: --doc-ids read once,
 * or --pack's each step. */
int train_source_open_packed(train_source *src, const train_sink *s)
{
    const train_config *o = src->c;
    const size_t gtok = (size_t)(src->G * src->T);
    char err[512];
    if (!(src->doc_ids = malloc((size_t)src->K * gtok * sizeof *src->doc_ids)))
        return train_err(s, "out of memory");
    if (o->pack.doc_ids && train_pack_load_doc_ids(o->pack.doc_ids, src->K * src->G, src->T,
                                                   src->doc_ids, err, sizeof err))
        return train_err(s, "%s", err);
    if (o->pack.pack && src->have_shard &&
        !train_pack_shard_scores(&src->shard, (uint32_t)o->pack.eos))
        return train_err(s, "%s: every document is one token long (the shard is --eos %lld "
                         "tokens only): packed, no position is scored, there is nothing to "
                         "train", o->data_path, (long long)o->pack.eos);
    if (o->pack.pack && src->have_shard && !train_pack_shard_has(&src->shard, (uint32_t)o->pack.eos))
        train_say(s, "note", "%s holds no --eos %lld token: it is one document, cut into rows "
                  "of %lld tokens", o->data_path, (long long)o->pack.eos, (long long)src->T);
    return 0;
}

int train_source_open(train_source *src, const train_config *c, const sbp_step_info *in,
                      const sbp_step_info *bin, int64_t K, int64_t *steps, const train_sink *s)
{
    memset(src, 0, sizeof *src);
    src->c = c;
    src->K = K, src->B = in->batch, src->G = bin->batch, src->T = in->seq_len;
    const size_t gtok = (size_t)(src->G * src->T); /* the global tokens of one micro-batch */
    const bool pairs = in->objective && strcmp(in->objective, "dpo") == 0;
    src->ids = malloc((size_t)K * gtok * sizeof *src->ids);
    src->labels = malloc((size_t)K * gtok * sizeof *src->labels);
    if (!src->ids || !src->labels)
        return train_err(s, "out of memory");
    if (c->data_path && in->objective && (pairs || strcmp(in->objective, "grpo") == 0))
        return train_err(s, "--data: %s is a %s step, which trains on --input-ids and --labels "
                         "with its own inputs (see --help)", c->step_path, in->objective);
    int rc = c->dataset.path ? open_dataset(src, in, steps, s)
             : c->data_path  ? open_shard(src, s)
                             : open_npy(src, bin, pairs, s);
    char err[512];
    if (!rc && src->have_shard &&
        sbpio_shard_check_vocab(&src->shard, in->vocab, err, sizeof err) != SBPIO_OK)
        rc = train_err(s, "%s (%s was compiled for a vocabulary of %lld tokens)", err,
                       c->step_path, (long long)in->vocab);
    return rc;
}

void train_source_close(train_source *src)
{
    free(src->ids);
    free(src->labels);
    free(src->doc_ids);
    free(src->row_ex);
    free(src->doc_ex);
    if (src->have_shard)
        sbpio_shard_close(&src->shard);
    if (src->have_ds)
        train_dataset_close(&src->ds);
    memset(src, 0, sizeof *src);
}
