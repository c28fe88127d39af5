/* train_source.h — where each optimizer step's batch comes from, behind one interface.
 *
 * A source fills, for step s, the K micro-batches of G rows (G: the global rows of a
 * micro-batch, B with one rank; under mpirun every rank reads the global batch and keeps its own
 * rows): ids and labels [K*G*T], the document ids [K*G*T] of a packed step, and for a dataset
 * with reference log-probs the example each row holds. The kinds:
 *   npy      --input-ids X.npy --labels Y.npy: one batch, read and checked once (dtype, shape,
 *            range, pairs for DPO, something scored), the same every step; --doc-ids for a
 *            packed step;
 *   shard    --data SHARD.bin, an llm.c token shard: each micro-batch the next G*T+1 tokens,
 *            labels the next tokens; starts over (a note) when exhausted;
 *   packed   --data --pack --eos ID: rows of whole documents (train_pack.h), the same cursor;
 *   dataset  --dataset FILE from sbp-prepare (train_dataset.h): one example a row or packed
 *            next-fit, DPO pairs or GRPO rows, shuffled each pass when asked.
 * Checkpoints keep the cursor of the shard or the dataset (train_ckpt.h reads them here).
 */
#ifndef SBP_TRAIN_SOURCE_H
#define SBP_TRAIN_SOURCE_H

#include "sbptrain.h"
#include "sbpio.h"

typedef struct train_source train_source;

typedef struct train_source_ops {
    const char *name;
    /* step s's batch into the source's buffers */
    int (*next)(train_source *src, int64_t s, const train_sink *sink);
} train_source_ops;

struct train_source {
    const train_source_ops *ops;
    const train_config *c;
    int64_t K, B, G, T;      /* micro-batches, rows per rank, global rows, sequence length */
    int32_t *ids, *labels;   /* [K*G*T] the step's batch */
    int32_t *doc_ids;        /* [K*G*T] packed steps (packed from --data, or --doc-ids), or NULL */
    int64_t *row_ex;         /* [K*G] the example of each row (a DPO / GRPO dataset), or NULL */
    int64_t *doc_ex;         /* [K*G*T] a packed per-document DPO / GRPO dataset's: document k
                              * of row r's example at r*T + k (-1: none), or NULL */
    sbpio_shard shard;       /* --data */
    bool have_shard;
    train_dataset ds;        /* --dataset */
    bool have_ds;
    int64_t epoch0;          /* the shard's pass when the run began (its notes start after it) */
    /* what packing saves of attention, measured on the global batch's rows
     * (train_pack_attention_work) */
    double pairs_packed, pairs_full;
    int64_t n_docs, n_rows;
};

/* Opens the source the config names for a step of description `bin` (batch G: the global
 * batch) and in (the rank's own, batch B). A dataset's --epochs sets *steps. */
int train_source_open(train_source *src, const train_config *c, const sbp_step_info *in,
                      const sbp_step_info *bin, int64_t K, int64_t *steps, const train_sink *s);
/* Step s's batch (and the packing figures). */
/* A packed step's document ids (--doc-ids, or room for --pack's), checked after the run's other
 * inputs. */
int train_source_open_packed(train_source *src, const train_sink *s);
int train_source_next(train_source *src, int64_t s, const train_sink *sink);
void train_source_close(train_source *src);

#endif
