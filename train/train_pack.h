/* train_pack.h — packed documents for sbp-train: rows of whole documents, each token
 * with its document id, for a step compiled with sbpc --packed (codegen/sbp_step.h: doc_ids).
 *
 * The packing rule (sbp-train --data SHARD --pack --eos ID; tests/train/pack_ref.py is an
 * independent implementation of it):
 *   - The token stream splits into documents at EOS: the EOS token ends its document and belongs
 *     to it. The end of the stream also ends a document (one without EOS).
 *   - Rows of T tokens are filled greedily in stream order with whole documents back to back.
 *     A document that does not fit in the rest of the row starts the next row, and the rest of
 *     this row is padding: id EOS, label -100, a document id of its own (one past the row's
 *     last document). Documents are never reordered. This is torchtune's PackedDataset with
 *     its default split_across_pack=False (a sample that does not fit moves whole to the next
 *     pack, the rest is padded): padding costs some compute, where filling the row with the
 *     document's beginning (split_across_pack=True) would cut every document that crosses a
 *     row's end and train its rest without its context.
 *   - A document longer than T (torchtune refuses one by default; Hugging Face's
 *     DataCollatorWithFlattening expects the tokenizer to have truncated it) starts a row of
 *     its own and is cut into pieces of T tokens (each a whole row) and a last, shorter piece
 *     that starts the next row like any other document. Each piece is a document of its own
 *     for the step: it attends only within the piece, and its positions start at 0 (as
 *     torchtune numbers a long sample's positions, index mod T).
 *   - Labels: each token's label is the next token of its document. The last token of a
 *     document (its EOS) has label -100: it would predict the first token of the next one (as
 *     DataCollatorWithFlattening masks the first label of each sequence). The
 *     last token of a piece that is not the document's end keeps its label (the next token of
 *     the same document, which begins the next piece), as unpacked training scores a row's last
 *     token.
 *   - Document ids count 0, 1, 2, ... along each row (non-decreasing), padding included.
 *   - At the end of the stream the packing goes on from its first token (the next pass, epoch
 *     + 1), in the same row if it has room.
 * The cursor (the stream position of the next row's first token, and the pass) is all the state
 * between rows: a row's content depends only on where it starts, so a run resumed at a saved
 * cursor packs exactly the rows the uninterrupted run would have.
 *
 * Functions that can fail write a message (without the program's prefix) into err and return -1.
 */
#ifndef SBP_TRAIN_PACK_H
#define SBP_TRAIN_PACK_H

#include <stdbool.h>
#include "train_opt.h"
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "sbp_step.h"
#include "sbpio.h"

/* The command line (train_config, sbptrain.h, holds one of these). */
typedef struct train_pack_opts {
    bool pack;             /* --pack: pack --data's stream into documents */
    int64_t eos;           /* --eos ID, or -1 when not given */
    const char *doc_ids;   /* --doc-ids D.npy (with --input-ids / --labels), or NULL */
} train_pack_opts;

/* The options (train_opt.h): --pack (no value), --eos, --doc-ids; the parser answers 0, -1
 * after cli's message, or TRAIN_OPT_NOT_MINE. Call train_pack_opts_init before the parse. */
extern const struct option train_pack_options[];
void train_pack_opts_init(train_pack_opts *o);
int train_pack_parse(train_pack_opts *o, cli *c, const char *v);
/* The usage text of the options, with the packing rule (ends in a newline). */
const char *train_pack_usage(void);
/* After the parse: the options against each other and the data flags (--data, --input-ids). */
int train_pack_check_opts(const train_pack_opts *o, bool data, bool arrays, char *err,
                          size_t errlen);
/* Once the step is known: --pack / --doc-ids need a packed step (info->packed), a packed step
 * needs one of them, and --eos must be a token of its vocabulary. */
int train_pack_check_step(const train_pack_opts *o, const sbp_step_info *in,
                          const char *step_path, char *err, size_t errlen);
/* The packing of a run, for the checkpoints' identity: "none", "eos ID" or "doc-ids HASH" (a
 * hash of the [n] document ids). */
void train_pack_identity(const train_pack_opts *o, const int32_t *doc_ids, size_t n, char *buf,
                         size_t len);

/* A token stream read through a function, so that a shard (uint16 or uint32 tokens) and a test's
 * plain array are read alike without copying. */
typedef struct train_pack_src {
    uint32_t (*token)(const void *ctx, int64_t i); /* token i, 0 <= i < ntok */
    const void *ctx;
    int64_t ntok;                                  /* >= 1 */
} train_pack_src;

typedef struct train_pack_cursor {
    int64_t pos;   /* stream position of the next row's first token, 0 <= pos < ntok */
    int64_t epoch; /* passes over the stream completed */
} train_pack_cursor;

/* Packs `rows` rows of T tokens from the cursor on (see the rule above) into ids, labels and
 * doc_ids [rows*T] each, and advances the cursor. Fails only on arguments outside their ranges
 * (T < 1, an empty stream, a cursor outside it). */
int train_pack_rows(const train_pack_src *src, uint32_t eos, int64_t T, int64_t rows,
                    train_pack_cursor *cur, int32_t *ids, int32_t *labels, int32_t *doc_ids,
                    char *err, size_t errlen);

/* The same over an open shard, whose pos and epoch are the cursor (so checkpoints save and
 * restore it as they do an unpacked run's). The tokens must be < 2^31 (sbp-train checks them
 * against the vocabulary first). */
int train_pack_shard(sbpio_shard *s, uint32_t eos, int64_t T, int64_t rows, int32_t *ids,
                     int32_t *labels, int32_t *doc_ids, char *err, size_t errlen);

/* Whether token `eos` occurs in the shard (a shard without it is one long document: a note). */
bool train_pack_shard_has(const sbpio_shard *s, uint32_t eos);
/* Whether packing the shard can score any token: not when every document is one token long
 * (the shard is EOS tokens only, but for its last token), as each document's last label is
 * -100. */
bool train_pack_shard_scores(const sbpio_shard *s, uint32_t eos);

/* --doc-ids D.npy: reads document ids [N,T] (int32 or int64) into out [N*T], checking the shape
 * and that each row is non-decreasing and within int32. */
int train_pack_load_doc_ids(const char *path, int64_t N, int64_t T, int32_t *out, char *err,
                            size_t errlen);

/* The document ids of micro-batch k (of B rows) out of all N rows, in the row order of
 * train_inputs.c's ti_micro: rows k*B .. k*B+B-1, or for DPO (dpo true) the chosen rows k*B/2 ..
 * and their rejected partners N/2 + k*B/2 ... */
void train_pack_micro(const int32_t *doc_ids, int32_t *mb_doc_ids, int64_t N, int64_t B,
                      int64_t T, int64_t k, bool dpo);

/* The attention work of packed rows, accumulated: for rows [rows*T] of document ids, each
 * document of L tokens adds L(L+1)/2 query-key pairs to *packed (block-diagonal causal) and
 * each row T(T+1)/2 to *full (causal over the row, unpacked); *n_docs counts the documents. */
void train_pack_attention_work(const int32_t *doc_ids, int64_t rows, int64_t T, double *packed,
                               double *full, int64_t *n_docs);

#endif
