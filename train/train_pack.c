/* train_pack.c — packs a token stream into rows of whole documents (train_pack.h has the rule).
 *
 * Approach: a row is filled one document at a time from the cursor. Only the part of a document
 * that could still go in the row matters, so the scan for its EOS stops after the row's room:
 * a document found to end within it goes in whole; one that does not end within it is either
 * cut (the row is empty: a piece of T tokens) or left for the next row (the rest is padding).
 * Every row thus costs O(T) token reads whatever the documents' lengths, and a shard without
 * any EOS packs like the unpacked cursor (rows of T, labels the next tokens) but for the last
 * token of the stream, which ends the one document.
 */
#include "cli.h"
#include "train_pack.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PACK_IGNORE (-100) /* sbprt's ignore index: the label of an unscored position */

int train_pack_rows(const train_pack_src *src, uint32_t eos, int64_t T, int64_t rows,
                    train_pack_cursor *cur, int32_t *ids, int32_t *labels, int32_t *doc_ids,
                    char *err, size_t errlen)
{
    if (T < 1 || rows < 0 || src->ntok < 1)
        return cli_errf(err, errlen, "packing: bad sizes (T %" PRId64 ", %" PRId64 " rows, %"
                        PRId64 " tokens)", T, rows, src->ntok);
    if (cur->pos < 0 || cur->pos >= src->ntok)
        return cli_errf(err, errlen, "packing: position %" PRId64 " outside the stream's %"
                        PRId64 " tokens", cur->pos, src->ntok);
    const int64_t ntok = src->ntok;
    for (int64_t r = 0; r < rows; r++) {
        int32_t *row_ids = ids + r * T, *row_labels = labels + r * T, *row_docs = doc_ids + r * T;
        int64_t t = 0;  /* tokens placed in this row */
        int32_t d = 0;  /* the next document's id in this row */
        while (t < T) {
            const int64_t room = T - t, pos = cur->pos;
            /* the document from pos: does it end (EOS, or the stream's end) within room? */
            int64_t n = 0;
            bool ends = false;
            while (n < room && pos + n < ntok) {
                if (src->token(src->ctx, pos + n++) == eos) {
                    ends = true;
                    break;
                }
            }
            if (!ends && pos + n == ntok)
                ends = true;
            if (!ends && t > 0)
                break; /* longer than the rest of the row: it starts the next one */
            /* whole (ends), or a piece of T tokens of a longer document (row empty: n == T, and
             * pos + T < ntok, so the piece's last label is the document's next token) */
            for (int64_t i = 0; i < n; i++) {
                row_ids[t + i] = (int32_t)src->token(src->ctx, pos + i);
                row_docs[t + i] = d;
                row_labels[t + i] = i + 1 < n || !ends
                                        ? (int32_t)src->token(src->ctx, pos + i + 1)
                                        : PACK_IGNORE;
            }
            t += n;
            d++;
            cur->pos += n;
            if (cur->pos == ntok) { /* the stream is done: the next pass, maybe in this row */
                if (cur->epoch < 0 || cur->epoch == INT64_MAX)
                    return cli_errf(err, errlen, "packing: pass %" PRId64 " cannot be followed "
                                    "by another", cur->epoch);
                cur->pos = 0;
                cur->epoch++;
            }
        }
        for (; t < T; t++) { /* padding: a document of its own, never scored */
            row_ids[t] = (int32_t)eos;
            row_labels[t] = PACK_IGNORE;
            row_docs[t] = d;
        }
    }
    return 0;
}

static uint32_t shard_token(const void *ctx, int64_t i)
{
    return sbpio_shard_token(ctx, i);
}

int train_pack_shard(sbpio_shard *s, uint32_t eos, int64_t T, int64_t rows, int32_t *ids,
                     int32_t *labels, int32_t *doc_ids, char *err, size_t errlen)
{
    const train_pack_src src = {shard_token, s, s->ntok};
    train_pack_cursor cur = {s->pos, s->epoch};
    if (train_pack_rows(&src, eos, T, rows, &cur, ids, labels, doc_ids, err, errlen)) {
        char why[256];
        snprintf(why, sizeof why, "%s", err ? err : "");
        return cli_errf(err, errlen, "%s: %s", s->path, why);
    }
    s->pos = cur.pos;
    s->epoch = cur.epoch;
    return 0;
}

bool train_pack_shard_has(const sbpio_shard *s, uint32_t eos)
{
    for (int64_t i = 0; i < s->ntok; i++)
        if (sbpio_shard_token(s, i) == eos)
            return true;
    return false;
}

bool train_pack_shard_scores(const sbpio_shard *s, uint32_t eos)
{
    /* a token that is not EOS, with a token after it, continues its document: that next token
     * is its label; the stream's last token has no next token in its document */
    for (int64_t i = 0; i + 1 < s->ntok; i++)
        if (sbpio_shard_token(s, i) != eos)
            return true;
    return false;
}

int train_pack_load_doc_ids(const char *path, int64_t N, int64_t T, int32_t *out, char *err,
                            size_t errlen)
{
    sbpio_array a;
    if (sbpio_npy_read(path, &a, err, errlen) != SBPIO_OK)
        return -1;
    int rc = 0;
    if (a.dtype != SBPIO_DT_I32 && a.dtype != SBPIO_DT_I64) {
        rc = cli_errf(err, errlen, "%s: document ids must be int32 or int64", path);
    } else if (a.rank != 2 || a.shape[0] != N || a.shape[1] != T) {
        char have[128] = "[";
        size_t k = 1;
        for (int i = 0; i < a.rank && k < sizeof have; i++)
            k += (size_t)snprintf(have + k, sizeof have - k, "%s%" PRId64, i ? "," : "",
                                  a.shape[i]);
        if (k < sizeof have)
            snprintf(have + k, sizeof have - k, "]");
        rc = cli_errf(err, errlen, "%s: document ids have shape %s, but the input ids and labels "
                      "are [%" PRId64 ",%" PRId64 "]", path, have, N, T);
    } else {
        for (int64_t i = 0; i < N * T && rc == 0; i++) {
            int64_t v = a.dtype == SBPIO_DT_I32 ? ((const int32_t *)a.data)[i]
                                                : ((const int64_t *)a.data)[i];
            int64_t b = i / T, t = i % T;
            if (v < 0 || v > INT32_MAX)
                rc = cli_errf(err, errlen, "%s: doc_ids[%" PRId64 ",%" PRId64 "] = %" PRId64
                              " is not a document id (0 to %d)", path, b, t, v, INT32_MAX);
            else if (t > 0 && v < out[i - 1])
                rc = cli_errf(err, errlen, "%s: doc_ids[%" PRId64 ",%" PRId64 "] = %" PRId64
                              " is below doc_ids[%" PRId64 ",%" PRId64 "] = %" PRId32 ": the "
                              "ids must not decrease along a row (a document is one run of "
                              "tokens)", path, b, t, v, b, t - 1, out[i - 1]);
            else
                out[i] = (int32_t)v;
        }
    }
    sbpio_array_free(&a);
    return rc;
}

void train_pack_micro(const int32_t *doc_ids, int32_t *mb_doc_ids, int64_t N, int64_t B,
                      int64_t T, int64_t k, bool dpo)
{
    const int64_t h = B / 2;
    for (int64_t j = 0; j < B; j++) {
        int64_t r = !dpo ? k * B + j : j < h ? k * h + j : N / 2 + k * h + (j - h);
        for (int64_t t = 0; t < T; t++)
            mb_doc_ids[j * T + t] = doc_ids[r * T + t];
    }
}

/* ------------------------------------------------------------------ the command line */

void train_pack_opts_init(train_pack_opts *o)
{
    *o = (train_pack_opts){.pack = false, .eos = -1, .doc_ids = NULL};
}

const struct option train_pack_options[] = {
    {"pack", no_argument, NULL, TRAIN_OPT},
    {"eos", required_argument, NULL, TRAIN_OPT},
    {"doc-ids", required_argument, NULL, TRAIN_OPT},
    {0},
};

int train_pack_parse(train_pack_opts *o, cli *c, const char *v)
{
    const char *f = c->flag;
    if (!strcmp(f, "--pack")) {
        o->pack = true;
        return 0;
    }
    if (!strcmp(f, "--eos"))
        return cli_count(c, f, v, 0, INT32_MAX, &o->eos);
    if (!strcmp(f, "--doc-ids"))
        return cli_path(c, f, v, &o->doc_ids);
    return TRAIN_OPT_NOT_MINE;
}

const char *train_pack_usage(void)
{
    return "packed documents (a step compiled with sbpc --packed: each token carries its\n"
           "document id; a token attends only to its own document, positions restart at 0):\n"
           "  --pack                  with --data: fill each row with whole documents. The\n"
           "                          stream splits into documents after each --eos token (EOS\n"
           "                          ends its document; so does the end of the stream); rows\n"
           "                          take documents back to back in stream order; one that\n"
           "                          does not fit in the rest of a row starts the next row and\n"
           "                          the rest is padding (id EOS, label -100, a document id of\n"
           "                          its own), as torchtune's PackedDataset packs by default.\n"
           "                          A document longer than T starts a row and is cut into\n"
           "                          pieces of T tokens (and a shorter last piece), each piece\n"
           "                          its own document starting at position 0 (torchtune's\n"
           "                          positions of a long sample, index mod T). Labels: the\n"
           "                          next token of the same document; the last token of a\n"
           "                          document (its EOS) is not scored (-100), a cut piece's\n"
           "                          last token is (its document goes on). Document ids count\n"
           "                          0, 1, 2, ... along each row. At the stream's end packing\n"
           "                          goes on from its first token; checkpoints save the\n"
           "                          position, so a resumed run packs the same rows\n"
           "  --eos ID                the token id that ends a document (needed by --pack)\n"
           "  --doc-ids D.npy         with --input-ids and --labels: each token's document id,\n"
           "                          int32 or int64 [N,T], non-decreasing along each row\n";
}

int train_pack_check_opts(const train_pack_opts *o, bool data, bool arrays, char *err,
                          size_t errlen)
{
    if (o->pack && o->eos < 0)
        return cli_errf(err, errlen, "--pack needs --eos ID, the token that ends a document");
    if (o->eos >= 0 && !o->pack)
        return cli_errf(err, errlen, "--eos %" PRId64 " is only read with --pack (the documents "
                        "of --data)", o->eos);
    if (o->pack && !data)
        return cli_errf(err, errlen, "--pack packs the token stream of --data SHARD.bin%s",
                        arrays ? "; with --input-ids and --labels give each token's document "
                                 "id with --doc-ids D.npy" : "");
    if (o->doc_ids && !arrays)
        return cli_errf(err, errlen, "--doc-ids goes with --input-ids and --labels (with --data, "
                        "use --pack --eos ID)");
    return 0;
}

int train_pack_check_step(const train_pack_opts *o, const sbp_step_info *in,
                          const char *step_path, char *err, size_t errlen)
{
    const bool asked = o->pack || o->doc_ids;
    if (asked && !in->packed)
        return cli_errf(err, errlen, "%s: %s is not a packed step (it attends across the whole "
                        "row): compile with sbpc --packed", o->pack ? "--pack" : "--doc-ids",
                        step_path);
    if (!asked && in->packed)
        return cli_errf(err, errlen, "%s was compiled with sbpc --packed and needs each token's "
                        "document id: give --data SHARD.bin --pack --eos ID, or --doc-ids D.npy "
                        "with --input-ids and --labels", step_path);
    if (o->pack && o->eos >= in->vocab)
        return cli_errf(err, errlen, "--eos %" PRId64 " is not a token id: %s was compiled for a "
                        "vocabulary of %" PRId64 " tokens (ids 0 to %" PRId64 ")", o->eos,
                        step_path, in->vocab, in->vocab - 1);
    return 0;
}

void train_pack_identity(const train_pack_opts *o, const int32_t *doc_ids, size_t n, char *buf,
                         size_t len)
{
    if (o->pack) {
        snprintf(buf, len, "eos %" PRId64, o->eos);
    } else if (o->doc_ids && doc_ids) {
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, as the checkpoints' other hashes */
        const unsigned char *p = (const unsigned char *)doc_ids;
        for (size_t i = 0; i < n * sizeof *doc_ids; i++)
            h = (h ^ p[i]) * 0x100000001b3ull;
        snprintf(buf, len, "doc-ids %016" PRIx64, h);
    } else {
        snprintf(buf, len, "none");
    }
}

void train_pack_attention_work(const int32_t *doc_ids, int64_t rows, int64_t T, double *packed,
                               double *full, int64_t *n_docs)
{
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *d = doc_ids + r * T;
        int64_t start = 0;
        for (int64_t t = 1; t <= T; t++)
            if (t == T || d[t] != d[start]) {
                double L = (double)(t - start);
                *packed += L * (L + 1) / 2;
                (*n_docs)++;
                start = t;
            }
        *full += (double)T * (double)(T + 1) / 2;
    }
}
