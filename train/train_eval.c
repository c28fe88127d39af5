/* train_eval.c — held-out evaluation's options and data for sbp-train (see train_eval.h).
 *
 * The batches are the --data batches of the held-out shard from its first token: llm.c's
 * loader (B*T+1 tokens, advancing by B*T) or, for a packed run, train_pack_shard's rows of
 * whole documents. Counting how many whole batches a shard holds is arithmetic for the first
 * and a dry run of the packer for the second (it reads tokens only: cheap next to one forward).
 */
#include "train_eval.h"
#include "train_pack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *train_eval_usage(void)
{
    return "Evaluation on held-out text (a step with sbp_step_eval: sbpc's default for sft):\n"
           "  --eval-data SHARD.bin   an llm.c token shard of held-out text; after the steps\n"
           "                          below, the step's forward-only entry point (its own\n"
           "                          memory plan, no gradients) runs on its first K batches\n"
           "                          (the same K each time; cut as --data cuts, or packed as\n"
           "                          --pack packs) and prints 'eval step N loss X ppl Y':\n"
           "                          the mean cross-entropy over their scored tokens and\n"
           "                          exp of it; --log records it as eval_loss\n"
           "  --eval-every N          evaluate after every N-th optimizer step (and after the\n"
           "                          last); default: after the last step only\n"
           "  --eval-batches K        batches per evaluation (default: every whole batch of\n"
           "                          the shard or dataset)\n"
           "  --eval-dataset FILE     instead of --eval-data: a dataset of sbp-prepare's, its\n"
           "                          examples in file order laid into rows as --dataset lays\n"
           "                          them (one a row; next-fit for a packed step)\n";
}

const struct option train_eval_options[] = {
    {"eval-data", required_argument, NULL, TRAIN_OPT},
    {"eval-every", required_argument, NULL, TRAIN_OPT},
    {"eval-batches", required_argument, NULL, TRAIN_OPT},
    {0},
};

int train_eval_parse(train_eval_opts *o, cli *c, const char *v)
{
    const char *f = c->flag;
    if (!strcmp(f, "--eval-data"))
        return cli_path(c, f, v, &o->data);
    if (!strcmp(f, "--eval-every"))
        return cli_count(c, f, v, 1, (int64_t)1 << 30, &o->every);
    if (!strcmp(f, "--eval-batches"))
        return cli_count(c, f, v, 1, (int64_t)1 << 30, &o->batches);
    return TRAIN_OPT_NOT_MINE;
}

int train_eval_check_opts(const train_eval_opts *o, char *err, size_t errlen)
{
    if (o->data && o->dataset) {
        snprintf(err, errlen, "give --eval-data or --eval-dataset, not both");
        return -1;
    }
    if (!o->data && !o->dataset && (o->every || o->batches)) {
        snprintf(err, errlen, "%s needs --eval-data SHARD.bin or --eval-dataset FILE (the "
                 "held-out data)", o->every ? "--eval-every" : "--eval-batches");
        return -1;
    }
    return 0;
}

bool train_eval_due(const train_eval_opts *o, int64_t s, int64_t steps)
{
    return (o->data || o->dataset) && (s == steps || (o->every > 0 && s % o->every == 0));
}

/* The next batch at the shard's (or dataset's) cursor into ids / labels / doc_ids. */
static int next_into(train_eval *e, int32_t *ids, int32_t *labels, int32_t *doc_ids, char *err,
                     size_t errlen)
{
    if (e->is_ds)
        return train_dataset_next(&e->ds, e->B, ids, labels, doc_ids, NULL, err, errlen);
    if (e->pack)
        return train_pack_shard(&e->shard, e->eos, e->T, e->B, ids, labels, doc_ids, err,
                                errlen);
    return sbpio_shard_next_batch(&e->shard, (int)e->B, (int)e->T, ids, labels, err, errlen) ==
                   SBPIO_OK
               ? 0
               : -1;
}

/* Whole batches before the shard wraps. */
static int64_t count_batches(train_eval *e, char *err, size_t errlen)
{
    if (!e->pack)
        return (e->shard.ntok - 1) / (e->B * e->T);
    int64_t n = 0;
    while (e->shard.epoch == 0) {
        if (next_into(e, e->ids, e->labels, e->doc_ids, err, errlen))
            return -1;
        n += e->shard.epoch == 0 || e->shard.pos == 0; /* ended exactly at the end: whole */
    }
    train_eval_rewind(e);
    return n;
}

int train_eval_open(train_eval *e, const train_eval_opts *o, int64_t B, int64_t T, int64_t V,
                    bool pack, uint32_t eos, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    char why[400];
    if (sbpio_shard_open(o->data, &e->shard, why, sizeof why) != SBPIO_OK) {
        snprintf(err, errlen, "--eval-data: %s", why);
        return -1;
    }
    e->open = true;
    e->pack = pack;
    e->eos = eos;
    e->B = B;
    e->T = T;
    if (sbpio_shard_check_vocab(&e->shard, V, why, sizeof why) != SBPIO_OK) {
        snprintf(err, errlen, "--eval-data: %s", why);
        return -1;
    }
    if (e->shard.ntok < B * T + 1) {
        snprintf(err, errlen,
                 "--eval-data %s holds %lld tokens, fewer than one batch needs (batch %lld x "
                 "sequence length %lld + 1)",
                 o->data, (long long)e->shard.ntok, (long long)B, (long long)T);
        return -1;
    }
    size_t n = (size_t)(B * T);
    e->ids = malloc(n * sizeof *e->ids);
    e->labels = malloc(n * sizeof *e->labels);
    e->doc_ids = pack ? malloc(n * sizeof *e->doc_ids) : NULL;
    if (!e->ids || !e->labels || (pack && !e->doc_ids)) {
        snprintf(err, errlen, "out of memory for the evaluation batch");
        return -1;
    }
    int64_t have = count_batches(e, why, sizeof why);
    if (have < 0) {
        snprintf(err, errlen, "--eval-data: %s", why);
        return -1;
    }
    if (have < 1) {
        snprintf(err, errlen, "--eval-data %s holds no whole batch of %lld packed rows of %lld "
                 "tokens", o->data, (long long)B, (long long)T);
        return -1;
    }
    if (o->batches > have) {
        snprintf(err, errlen,
                 "--eval-batches %lld: --eval-data %s holds %lld whole batch%s of %lld x %lld "
                 "tokens",
                 (long long)o->batches, o->data, (long long)have, have == 1 ? "" : "es",
                 (long long)B, (long long)T);
        return -1;
    }
    e->K = o->batches ? o->batches : have;
    return 0;
}

int train_eval_open_dataset(train_eval *e, const train_eval_opts *o, const sbp_step_info *in,
                            char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    const train_dataset_opts dso = {.path = o->dataset, .flag = "--eval-dataset"};
    char why[700];
    if (train_dataset_open(&e->ds, &dso, in, in->packed, err, errlen))
        return -1;
    e->is_ds = true;
    e->B = in->batch;
    e->T = in->seq_len;
    size_t n = (size_t)(e->B * e->T);
    e->ids = malloc(n * sizeof *e->ids);
    e->labels = malloc(n * sizeof *e->labels);
    e->doc_ids = malloc(n * sizeof *e->doc_ids);
    if (!e->ids || !e->labels || !e->doc_ids) {
        snprintf(err, errlen, "out of memory for the evaluation batch");
        return -1;
    }
    /* whole batches before the file's end: a dry pass through its examples. A batch is whole
     * when it ends in the first pass or exactly at its end; one that wrapped around (into the
     * next pass, or past it when the file holds fewer examples than its rows) would score
     * examples twice. */
    int64_t have = 0;
    while (e->ds.epoch == 0) {
        if (next_into(e, e->ids, e->labels, e->doc_ids, why, sizeof why)) {
            snprintf(err, errlen, "--eval-dataset: %s", why);
            return -1;
        }
        have += e->ds.epoch == 0 || (e->ds.epoch == 1 && e->ds.pos == 0);
    }
    train_eval_rewind(e);
    if (have < 1) {
        snprintf(err, errlen, "--eval-dataset %s holds %lld examples, too few for one batch of "
                 "%lld rows of %lld tokens", o->dataset, (long long)e->ds.d.n_ex,
                 (long long)e->B, (long long)e->T);
        return -1;
    }
    if (o->batches > have) {
        snprintf(err, errlen, "--eval-batches %lld: --eval-dataset %s holds %lld whole batch%s "
                 "of %lld rows", (long long)o->batches, o->dataset, (long long)have,
                 have == 1 ? "" : "es", (long long)e->B);
        return -1;
    }
    e->K = o->batches ? o->batches : have;
    return 0;
}

void train_eval_rewind(train_eval *e)
{
    if (e->is_ds) {
        (void)train_dataset_seek(&e->ds, 0, 0, NULL, 0);
        return;
    }
    e->shard.pos = 0;
    e->shard.epoch = 0;
}

int train_eval_next(train_eval *e, char *err, size_t errlen)
{
    return next_into(e, e->ids, e->labels, e->doc_ids, err, errlen);
}

int64_t train_eval_scored(const train_eval *e)
{
    int64_t n = 0;
    for (int64_t i = 0; i < e->B * e->T; i++)
        n += e->labels[i] != -100;
    return n;
}

void train_eval_close(train_eval *e)
{
    if (e->open)
        sbpio_shard_close(&e->shard);
    if (e->is_ds)
        train_dataset_close(&e->ds);
    free(e->ids);
    free(e->labels);
    free(e->doc_ids);
    memset(e, 0, sizeof *e);
}
