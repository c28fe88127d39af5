/* train_refs.c — a dataset's reference log-probs (train_refs.h): the cache, the pass over the
 * examples, and each step's inputs from them. */
#include "train_refs.h"
#include "train_log.h" /* train_log_now: the monotonic clock */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* What a cache file says it is; a --compute-logps file says "compute-logps". */
#define CACHE_PURPOSE "ref-cache"

int train_refs_check_cache(const char *path, const char *role, bool strict, char *err,
                           size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : cli_errf(err, errlen, "%s: %s: %s", role, path,
                                              strerror(errno));
    sbpio_st_file *fh = NULL;
    char why[400];
    const char *what = NULL, *want = strict ? CACHE_PURPOSE : "sbp-logps";
    const bool st_ok = S_ISREG(st.st_mode) &&
                       sbpio_st_open_header(path, &fh, why, sizeof why) == SBPIO_OK;
    if (st_ok)
        what = sbpio_st_meta(fh, strict ? "purpose" : "format");
    const bool cache = what && strcmp(what, want) == 0;
    sbpio_st_close(fh);
    if (cache)
        return 0;
    char what_is[96];
    if (!S_ISREG(st.st_mode) || !st_ok)
        snprintf(what_is, sizeof what_is, "%s", !S_ISREG(st.st_mode) ? "not a regular file"
                                                                     : "not a safetensors file");
    else
        snprintf(what_is, sizeof what_is, "its __metadata__ has no \"%s\": \"%s\"",
                 strict ? "purpose" : "format", want);
    return cli_errf(err, errlen, "%s: %s is not a reference log-probs cache of sbp-train (%s), "
                    "and a file the run did not make as one is never replaced: remove it or "
                    "give another path", role, path, what_is);
}

int train_refs_alloc(train_refs *f, const train_dataset *ds, bool grpo, const train_sink *s)
{
    memset(f, 0, sizeof *f);
    f->grpo = grpo;
    f->ex = malloc((size_t)ds->d.n_ex * sizeof *f->ex + 1);
    if (grpo)
        f->tok = calloc((size_t)ds->d.n_tok + 1, sizeof *f->tok);
    return !f->ex || (grpo && !f->tok) ? train_err(s, "out of memory") : 0;
}

void train_refs_free(train_refs *f)
{
    free(f->ex);
    free(f->tok);
    free(f->old);
    memset(f, 0, sizeof *f);
}

/* The cache's values when its key is this run's and all are finite: 1 (used), 0 (not). */
static int cache_read(train_refs *f, const char *cache, const char *key, const train_dataset *ds,
                      const train_sink *s)
{
    sbpio_st_file *fh = NULL;
    const char *k = NULL;
    char why[400];
    const int64_t n = ds->d.n_ex;
    if (sbpio_st_open(cache, &fh, why, sizeof why) == SBPIO_OK &&
        (k = sbpio_st_meta(fh, "key")) && strcmp(k, key) == 0 &&
        sbpio_st_copy_f32(fh, "row_logps", f->ex, n, why, sizeof why) == SBPIO_OK &&
        (!f->grpo || sbpio_st_copy_f32(fh, "token_logps", f->tok, ds->d.n_tok, why,
                                       sizeof why) == SBPIO_OK)) {
        bool finite = true;
        for (int64_t i = 0; i < n; i++)
            finite = finite && isfinite(f->ex[i]);
        for (int64_t i = 0; f->grpo && i < ds->d.n_tok; i++)
            finite = finite && isfinite(f->tok[i]);
        sbpio_st_close(fh);
        if (finite) {
            train_say(s, "note", "reusing the reference log-probs of %s (this model and dataset)",
                      cache);
            return 1;
        }
    } else {
        sbpio_st_close(fh);
    }
    return 0; /* (the caller says why it computes them, or refuses to replace the file) */
}

/* A file of --compute-logps given as `flag` (--ref-logps, --old-logps): its row_logps into
 * ex [examples] and its token_logps into tok [dataset tokens] (either may be NULL: not read),
 * after checking that it is one, and of this dataset (its key's middle part is the dataset's
 * hash; the initial weights' and the model's parts are another model's, which is the point),
 * and that every value is finite. */
static int load_file(const char *flag, const char *path, const train_dataset *ds, float *ex,
                     float *tok, const train_sink *s)
{
    const size_t len = strlen(path);
    if (len >= 4 && strcmp(path + len - 4, ".npy") == 0)
        return train_err(s, "%s %s: with --dataset the log-probs are one per example of the "
                         "dataset (per token for GRPO), a file that sbp-train --compute-logps "
                         "OUT.safetensors writes, not an array of one batch's rows", flag, path);
    sbpio_st_file *fh = NULL;
    char why[700], want[20];
    if (sbpio_st_open(path, &fh, why, sizeof why) != SBPIO_OK)
        return train_err(s, "%s: %s", flag, why);
    const char *fmt = sbpio_st_meta(fh, "format"), *key = sbpio_st_meta(fh, "key");
    snprintf(want, sizeof want, "%016llx", (unsigned long long)ds->d.hash);
    int rc = 0;
    if (!fmt || strcmp(fmt, "sbp-logps") != 0)
        rc = train_err(s, "%s: %s is not a file of sbp-train --compute-logps (its __metadata__ "
                       "has no \"format\": \"sbp-logps\")", flag, path);
    else if (!key || strlen(key) != 50 || strncmp(key + 17, want, 16) != 0)
        rc = train_err(s, "%s: %s holds the log-probs of another dataset (its key is %s; this "
                       "dataset's hash is %s): compute them with sbp-train --compute-logps on "
                       "this one", flag, path, key ? key : "missing", want);
    else if ((ex && sbpio_st_copy_f32(fh, "row_logps", ex, ds->d.n_ex, why, sizeof why)) ||
             (tok && sbpio_st_copy_f32(fh, "token_logps", tok, ds->d.n_tok, why, sizeof why)))
        rc = train_err(s, "%s: %s%s", flag, why,
                       tok && !sbpio_st_find(fh, "token_logps")
                           ? " (a GRPO dataset's log-probs are per token: --compute-logps with "
                             "a grpo step writes them)" : "");
    sbpio_st_close(fh);
    for (int64_t i = 0; !rc && ex && i < ds->d.n_ex; i++)
        if (!isfinite(ex[i]))
            rc = train_err(s, "%s: %s: row_logps[%lld] is %g", flag, path, (long long)i,
                           (double)ex[i]);
    for (int64_t i = 0; !rc && tok && i < ds->d.n_tok; i++)
        if (!isfinite(tok[i]))
            rc = train_err(s, "%s: %s: token_logps[%lld] is %g", flag, path, (long long)i,
                           (double)tok[i]);
    return rc;
}

int train_refs_load_old(train_refs *f, const char *path, const train_dataset *ds,
                        const train_sink *s)
{
    if (!(f->old = calloc((size_t)ds->d.n_tok + 1, sizeof *f->old)))
        return train_err(s, "out of memory");
    if (load_file("--old-logps", path, ds, NULL, f->old, s))
        return -1;
    train_say(s, "note", "--old-logps: the token log-probs of %s (%lld examples)", path,
              (long long)ds->d.n_ex);
    return 0;
}

/* The reference batch that starts at example e: its end (exclusive), and place[x - e] the
 * first token r*T + t of each of its examples x. B examples, one a row; for a per-document
 * step, as many as fill B rows of T tokens next-fit in file order (each example its own
 * document, so its log-probs are the ones it has alone in a row). */
static int64_t batch_end(const train_dataset *ds, const sbp_step_info *in, int64_t e,
                         int64_t *place)
{
    const int64_t B = in->batch, T = in->seq_len, n = ds->d.n_ex, e0 = e;
    for (int64_t r = 0; r < B && e < n; r++)
        for (int64_t used = 0; e < n && used < T;) {
            const int64_t len = sbpio_dataset_len(&ds->d, e);
            if (used > 0 && (!in->per_document || used + len > T))
                break;
            place[e - e0] = r * T + used;
            used += len;
            e++;
        }
    return e;
}

/* Examples e .. end-1 through sbp_step_logps at their places (batch_end's; the rest of the
 * rows padding): row [B*T] (DPO per row: [B]) the step's output. */
static int logps_batch(train_refs *f, const train_steplib *L, const train_mem *m,
                       train_dataset *ds, int64_t e, int64_t end, int32_t *ids, int32_t *labels,
                       int32_t *docs, const int64_t *place, float *row, const train_sink *s)
{
    const train_rt *rt = &L->rt;
    const sbp_step_info *in = L->in;
    const int64_t B = in->batch, T = in->seq_len;
    /* a per-document step's row logps are per document: document k of row r at r*T + k */
    const int64_t w = in->per_document ? T : 1;
    const size_t per = f->grpo ? (size_t)(B * T) : (size_t)(B * w);
    char err[700], why[400];
    for (int64_t i = 0; i < B * T; i++) {
        ids[i] = (int32_t)ds->d.pad_id;
        labels[i] = SBPRT_IGNORE_INDEX;
        if (docs) /* a row's padding: a document id after its examples' (below) */
            docs[i] = (int32_t)T;
    }
    for (int64_t x = e, k = 0; x < end; x++) {
        const int64_t at = place[x - e], len = sbpio_dataset_len(&ds->d, x);
        k = x > e && at / T == place[x - e - 1] / T ? k + 1 : 0; /* document k of its row */
        if (train_dataset_row(ds, x, ds->tmp_ids, ds->tmp_labels, err, sizeof err))
            return train_err(s, "%s", err);
        bool scored = false;
        for (int64_t t = 0; t < len; t++)
            scored = scored || ds->tmp_labels[t] != SBPRT_IGNORE_INDEX;
        if (in->per_document && !scored) /* it would shift the documents after it */
            return train_err(s, "%s: %s: example %lld has no scored token; a per-document "
                             "step's documents are its rows' runs of scored tokens: drop the "
                             "example (sbp-prepare does)", ds->flag, sbpio_st_path(ds->d.f),
                             (long long)x);
        memcpy(ids + at, ds->tmp_ids, (size_t)len * sizeof *ids);
        memcpy(labels + at, ds->tmp_labels, (size_t)len * sizeof *labels);
        for (int64_t t = 0; docs && t < len; t++)
            docs[at + t] = (int32_t)k;
    }
    if (train_steplib_copy(L, m->d_ids, ids, (size_t)(B * T) * sizeof *ids,
                           SBPRT_COPY_HOST_TO_DEVICE, s) ||
        train_steplib_copy(L, m->d_labels, labels, (size_t)(B * T) * sizeof *labels,
                           SBPRT_COPY_HOST_TO_DEVICE, s) ||
        (docs && train_steplib_copy(L, m->d_doc_ids, docs, (size_t)(B * T) * sizeof *docs,
                                    SBPRT_COPY_HOST_TO_DEVICE, s)))
        return -1;
    sbp_step_args args = {.params = m->step_params, .input_ids = m->d_ids, .labels = m->d_labels,
                          .workspace = m->workspace, .doc_ids = docs ? m->d_doc_ids : NULL};
    int st = L->logps(rt->step_ctx, &args, f->grpo ? NULL : m->d_ref, f->grpo ? m->d_ref : NULL);
    if (!st)
        st = rt->sync(*rt->sync_ctx);
    if (st)
        return train_err(s, "the reference log-probs of examples %lld..%lld failed: %s%s",
                         (long long)e, (long long)(end - 1), rt->status_string(st),
                         train_steplib_why(L, rt->step_ctx, why, sizeof why));
    if (train_steplib_copy(L, row, m->d_ref, per * sizeof *row, SBPRT_COPY_DEVICE_TO_HOST,
                           s))
        return -1;
    for (int64_t x = e, k = 0; x < end; x++) {
        const int64_t at0 = place[x - e], rr = at0 / T;
        k = x > e && rr == place[x - e - 1] / T ? k + 1 : 0;
        float sum = 0;
        if (f->grpo) { /* the example's tokens, and their sum over the scored ones */
            const int64_t len = sbpio_dataset_len(&ds->d, x), at = ds->d.offsets[x];
            for (int64_t t = 0; t < len; t++) {
                f->tok[at + t] = labels[at0 + t] == SBPRT_IGNORE_INDEX ? 0 : row[at0 + t];
                sum += f->tok[at + t];
            }
        }
        const float v = f->grpo ? sum : row[rr * w + k]; /* (one a row: k = 0) */
        if (!isfinite(v))
            return train_err(s, "the reference log-prob of example %lld is %g", (long long)x,
                             (double)v);
        f->ex[x] = v;
    }
    return 0;
}

static int cache_write(train_refs *f, const train_config *c, const char *out, const char *key,
                       const train_dataset *ds, const train_sink *s)
{
    const int64_t n = ds->d.n_ex;
    int64_t shape[1] = {n}, tshape[1] = {ds->d.n_tok};
    char count[32], err[700];
    snprintf(count, sizeof count, "%lld", (long long)n);
    sbpio_kv meta[] = {{"format", "sbp-logps"}, {"key", key}, {"dataset", c->dataset.path},
                       {"model", c->model_path}, {"examples", count},
                       {"producer", "sbp-train"},
                       {"purpose", out == c->compute_logps ? "compute-logps" : CACHE_PURPOSE}};
    sbpio_st_tensor t[2] = {{.name = "row_logps", .dtype = SBPIO_DT_F32, .rank = 1,
                             .shape = shape, .data = f->ex},
                            {.name = "token_logps", .dtype = SBPIO_DT_F32, .rank = 1,
                             .shape = tshape, .data = f->tok}};
    if (sbpio_st_write(out, f->grpo ? 2 : 1, t, (int)(sizeof meta / sizeof meta[0]), meta, false,
                       err, sizeof err) != SBPIO_OK)
        return train_err(s, "%s: %s", c->compute_logps ? "--compute-logps"
                                                      : "the reference log-probs", err);
    if (c->compute_logps) {
        train_say(s, "out", "wrote the log-probs of %lld examples to %s", (long long)n,
                  c->compute_logps);
    }
    return 0;
}

/* The cache that the pass will write, when it did not match: a cache of another key is
 * replaced (said in a note), any other file refused before the pass. 0 or -1. */
static int cache_replaceable(const train_config *c, const char *cache, const train_sink *s)
{
    char why[700];
    if (train_refs_check_cache(cache, c->ref_cache ? "--ref-cache"
                                      : c->ckpt.dir ? "--checkpoint-dir" : "--resume",
                               true, why, sizeof why))
        return train_err(s, "%s", why);
    if (access(cache, F_OK) == 0)
        train_say(s, "note", "%s holds reference log-probs of another model, step or dataset (or "
                  "is damaged): computing them again", cache);
    return 0;
}

/* The pass over the dataset's examples, a batch at a time through the step's forward: batch k
 * on rank k mod size (one process: all), the others' values left 0 for the share. 0, or -1
 * with the reason said. */
static int pass_examples(train_refs *f, const train_steplib *L, const train_mem *m,
                         train_dataset *ds, const train_dist *d, const train_sink *s)
{
    const sbp_step_info *in = L->in;
    const int64_t B = in->batch, T = in->seq_len, n = ds->d.n_ex;
    int32_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    int32_t *labels = malloc((size_t)(B * T) * sizeof *labels);
    float *row = malloc((size_t)(B * T) * sizeof *row);
    /* a packed step's document ids (a per-document step: the examples packed, each its own
     * document; else one example a row, its document 0) */
    int32_t *docs = in->packed ? calloc((size_t)(B * T), sizeof *docs) : NULL;
    /* where each example of a batch starts (a per-document batch holds up to B*T of them) */
    int64_t *place = malloc((size_t)(in->per_document ? B * T : B) * sizeof *place);
    int rc = !ids || !labels || !row || !place || (in->packed && !docs)
                 ? train_err(s, "out of memory") : 0;
    memset(f->ex, 0, (size_t)n * sizeof *f->ex);
    if (f->grpo)
        memset(f->tok, 0, (size_t)ds->d.n_tok * sizeof *f->tok);
    const int ranks = d->on ? d->size : 1, me = d->on ? d->rank : 0;
    for (int64_t e = 0, k = 0; e < n && !rc; k++) {
        const int64_t end = batch_end(ds, in, e, place);
        if (k % ranks == me)
            rc = logps_batch(f, L, m, ds, e, end, ids, labels, docs, place, row, s);
        e = end;
    }
    free(ids);
    free(labels);
    free(row);
    free(docs);
    free(place);
    return rc;
}

int train_refs_compute(train_refs *f, const train_config *c, const train_steplib *L,
                       const train_mem *m, train_dataset *ds, const train_dist *d,
                       const train_sink *s)
{
    const sbp_step_info *in = L->in;
    const int64_t n = ds->d.n_ex;
    if (c->ref_logps) { /* another model's, from --compute-logps */
        if (load_file("--ref-logps", c->ref_logps, ds, f->ex, f->grpo ? f->tok : NULL, s))
            return -1;
        train_say(s, "note", "--ref-logps: the reference log-probs of %s (%lld examples)",
                  c->ref_logps, (long long)n);
        return 0;
    }
    /* the cache: kept beside the checkpoints (or in --ref-cache), valid for this model's
     * initial weights, this step's model and this dataset, and reused only then */
    char cache[4200] = "", key[128];
    const char *dir = c->ckpt.dir ? c->ckpt.dir : c->ckpt.resume;
    if (c->ref_cache)
        snprintf(cache, sizeof cache, "%s", c->ref_cache);
    else if (dir && !c->compute_logps)
        snprintf(cache, sizeof cache, "%s/ref-logps.safetensors", dir);
    const uint64_t h = sbpio_fnv1a(SBPIO_FNV_SEED, m->host_params,
                                   in->param_elems * sizeof(float)); /* the initial weights */
    snprintf(key, sizeof key, "%016llx-%016llx-%016llx", (unsigned long long)h,
             (unsigned long long)ds->d.hash, (unsigned long long)in->model_fingerprint);
    if (cache[0] && access(cache, F_OK) == 0 && cache_read(f, cache, key, ds, s)) {
        if (!c->compute_logps) /* (--compute-logps with a valid --ref-cache: copied out) */
            return 0;
        f->logps_only = true;
        return d->on && d->rank != 0 ? 0 : cache_write(f, c, c->compute_logps, key, ds, s);
    }
    if (cache[0] && cache_replaceable(c, cache, s))
        return -1;
    const double t0 = train_log_now();
    const int rc = pass_examples(f, L, m, ds, d, s);
    if (d->on && train_dist_any(d, rc != 0)) /* none waits in the share for a failed rank */
        return rc ? -1 : train_err(s, "another rank failed in the reference log-probs");
    if (rc)
        return -1;
    char err[512], over[48] = "";
    if (d->on && (train_dist_share_bits(d, (uint32_t *)(void *)f->ex, (size_t)n, err,
                                        sizeof err) ||
                  (f->grpo && train_dist_share_bits(d, (uint32_t *)(void *)f->tok,
                                                    (size_t)ds->d.n_tok, err, sizeof err))))
        return train_err(s, "%s", err);
    if (d->on)
        snprintf(over, sizeof over, " over %d ranks", d->size);
    train_say(s, "note", "reference log-probs of %lld examples computed in %.2f s%s (the "
              "model's initial weights, before step 1)", (long long)n, train_log_now() - t0,
              over);
    f->logps_only = c->compute_logps != NULL; /* on every rank: none goes on to train */
    const char *out = c->compute_logps ? c->compute_logps : cache[0] ? cache : NULL;
    if (!out || (d->on && d->rank != 0)) /* rank 0 writes what every rank computed */
        return 0;
    return cache_write(f, c, out, key, ds, s);
}

/* A packed per-document step's inputs: each document's reference log-prob (DPO) or advantage
 * (GRPO) at r*T + k, and GRPO's per-token values at each document's tokens (document ids are
 * the examples' places in the row, train_dataset.c). */
static void fill_docs(const train_refs *f, const train_source *src, train_inputs *ti)
{
    const train_dataset *ds = &src->ds;
    const int64_t N = src->K * src->G, T = src->T;
    for (int64_t i = 0; i < N * T; i++) {
        const int64_t e = src->doc_ex[i];
        if (!f->grpo)
            ti->ref[i] = e < 0 ? 0 : f->ex[e];
        else
            ti->adv[i] = e < 0 ? 0 : ds->d.advantages[e];
    }
    if (!f->grpo || (!ti->ref && !ti->old))
        return;
    for (int64_t i = 0; i < N; i++) {
        const int32_t *docs = src->doc_ids + i * T;
        int64_t start = 0;
        for (int64_t t = 0; t < T; t++) {
            if (t > 0 && docs[t] != docs[t - 1])
                start = t;
            const int64_t e = docs[t] >= 0 && docs[t] < T ? src->doc_ex[i * T + docs[t]] : -1;
            const int64_t at = e < 0 ? 0 : ds->d.offsets[e] + (t - start);
            if (ti->ref)
                ti->ref[i * T + t] = e < 0 ? 0 : f->tok[at];
            if (ti->old)
                ti->old[i * T + t] = e < 0 ? 0 : f->old[at];
        }
    }
}

void train_refs_fill(const train_refs *f, const train_source *src, train_inputs *ti)
{
    const train_dataset *ds = &src->ds;
    const int64_t N = src->K * src->G, T = src->T;
    if (src->doc_ex) {
        fill_docs(f, src, ti);
        return;
    }
    if (!f->grpo) {
        for (int64_t i = 0; i < N; i++)
            ti->ref[i] = f->ex[src->row_ex[i]];
        return;
    }
    for (int64_t i = 0; i < N; i++) {
        const int64_t e = src->row_ex[i], len = sbpio_dataset_len(&ds->d, e);
        ti->adv[i] = ds->d.advantages[e];
        for (int64_t t = 0; ti->ref && t < T; t++)
            ti->ref[i * T + t] = t < len ? f->tok[ds->d.offsets[e] + t] : 0;
        for (int64_t t = 0; ti->old && t < T; t++)
            ti->old[i * T + t] = t < len ? f->old[ds->d.offsets[e] + t] : 0;
    }
}
