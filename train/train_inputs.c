/* train_inputs.c — sbp-train's batch of K micro-batches and the DPO / GRPO inputs (see
 * train_inputs.h). Files are read whole (.npy through sbpio), checked, and kept on the host;
 * each micro-batch is then copied out in the step's row order.
 */
#include "cli.h"
#include "train_inputs.h"

#include "sbpio.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_text(char *buf, size_t n, int rank, const int64_t *dims)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dims[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* A float array of exactly `rank` dims (rank 1: [d0], rank 2: [d0, d1]) from a .npy file. */
static int read_floats(const char *flag, const char *path, int rank, int64_t d0, int64_t d1,
                       const char *what, float **out, char *err, size_t errlen)
{
    char e[512];
    sbpio_array a;
    if (sbpio_npy_read(path, &a, e, sizeof e) != SBPIO_OK)
        return cli_errf(err, errlen, "%s: %s", flag, e);
    int rc = 0;
    int64_t want[2] = {d0, d1};
    if (a.dtype != SBPIO_DT_F32 && a.dtype != SBPIO_DT_F64) {
        rc = cli_errf(err, errlen, "%s: %s must be float32 or float64", path, what);
    } else if (a.rank != rank || a.shape[0] != d0 || (rank == 2 && a.shape[1] != d1)) {
        char hs[128], ws[64];
        shape_text(hs, sizeof hs, a.rank, a.shape);
        shape_text(ws, sizeof ws, rank, want);
        rc = cli_errf(err, errlen, "%s: %s have shape %s, but the batch needs %s", path, what, hs,
                      ws);
    } else if (!(*out = malloc(sizeof(float) * (size_t)a.numel + 1))) {
        rc = cli_errf(err, errlen, "out of memory");
    } else {
        for (int64_t i = 0; i < a.numel; i++)
            (*out)[i] = a.dtype == SBPIO_DT_F32 ? ((const float *)a.data)[i]
                                                : (float)((const double *)a.data)[i];
    }
    sbpio_array_free(&a);
    return rc;
}

/* A per-document step's values are per document (W = T a row), and only a dataset lays its
 * documents out. */
static int per_document(train_inputs *ti, const sbp_step_info *in, const char *obj, char *err,
                        size_t errlen)
{
    ti->per_doc = (ti->dpo || ti->grpo) && in->per_document;
    ti->W = ti->per_doc ? in->seq_len : 1;
    if (ti->per_doc && !ti->self_ref)
        return cli_errf(err, errlen, "the step is per-document (sbpc --per-document): its "
                        "reference log-probs%s are one per document of its packed rows, which "
                        "sbp-train lays out from a dataset: train it with --dataset (files of "
                        "sbp-prepare --task %s)", ti->grpo ? " and advantages" : "", obj);
    return 0;
}

/* GRPO's inputs from files (no dataset): --advantages, one per row; --old-logps when given;
 * --ref-logps, one per label, when the step has a KL term (beta > 0). */
static int read_grpo_files(train_inputs *ti, const char *ref_path, const char *old_path,
                           const char *adv_path, const train_sink *note, char *err,
                           size_t errlen)
{
    const int64_t N = ti->N, T = ti->T;
    if (!adv_path)
        return cli_errf(err, errlen,
                        "the step's objective is grpo: give --advantages A.npy, one "
                                 "per row [%lld]", (long long)N);
    if (ti->beta > 0 && !ref_path)
        return cli_errf(err, errlen, "the step's objective is grpo with beta %g: give "
                                 "--ref-logps R.npy, the reference model's logp of each "
                                 "label [%lld,%lld] (or compile with --beta 0)",
                        ti->beta, (long long)N, (long long)T);
    if (ti->beta == 0 && ref_path && note)
        train_note(note, "--ref-logps is not used: the step's beta is 0 (no KL term)");
    if (read_floats("--advantages", adv_path, 1, N, 0, "advantages", &ti->adv, err, errlen) ||
        (old_path && read_floats("--old-logps", old_path, 2, N, T, "old logps", &ti->old, err,
                                 errlen)) ||
        (ti->beta > 0 && read_floats("--ref-logps", ref_path, 2, N, T, "reference logps",
                                     &ti->ref, err, errlen)))
        return -1;
    return 0;
}

/* One micro-batch's buffers, in the step's row order: ids and labels always; the objective's
 * values for the inputs the run has (DPO's reference is one per row, or per document). */
static int microbatch_buffers(train_inputs *ti, char *err, size_t errlen)
{
    const size_t bt = (size_t)(ti->B * ti->T), bw = (size_t)(ti->B * ti->W);
    ti->mb_ids = malloc(bt * sizeof *ti->mb_ids);
    ti->mb_labels = malloc(bt * sizeof *ti->mb_labels);
    if (ti->ref)
        ti->mb_ref = malloc((ti->dpo ? bw : bt) * sizeof(float));
    if (ti->old)
        ti->mb_old = malloc(bt * sizeof(float));
    if (ti->adv)
        ti->mb_adv = malloc(bw * sizeof(float));
    if (!ti->mb_ids || !ti->mb_labels || (ti->ref && !ti->mb_ref) || (ti->old && !ti->mb_old) ||
        (ti->adv && !ti->mb_adv))
        return cli_errf(err, errlen, "out of memory");
    return 0;
}

static int open_inputs(train_inputs *ti, const sbp_step_info *in, int64_t k,
                       const char *ref_path, const char *old_path, const char *adv_path,
                       bool self_ref, const train_sink *note, char *err, size_t errlen)
{
    memset(ti, 0, sizeof *ti);
    ti->self_ref = self_ref;
    ti->B = in->batch;
    ti->T = in->seq_len;
    ti->K = k;
    ti->N = k * in->batch;
    const char *obj = in->objective ? in->objective : "?";
    ti->dpo = strcmp(obj, "dpo") == 0;
    ti->grpo = strcmp(obj, "grpo") == 0;
    if (ti->dpo || ti->grpo) { /* fields appended to the info for these objectives only */
        ti->beta = in->beta;
        ti->grpo_token = ti->grpo && in->grpo_norm && strcmp(in->grpo_norm, "token") == 0;
    }
    ti->ref_path = ref_path;
    ti->old_path = old_path;
    ti->adv_path = adv_path;
    if (per_document(ti, in, obj, err, errlen))
        return -1;
    const int64_t N = ti->N, T = ti->T, W = ti->W;
    const char *extra = ref_path ? "--ref-logps" : old_path ? "--old-logps" : "--advantages";
    if (!ti->dpo && !ti->grpo) {
        if (ref_path || old_path || adv_path)
            return cli_errf(err, errlen, "%s is an input of DPO and GRPO steps, but the step's "
                                     "objective is %s", extra, obj);
    } else if (ti->dpo) {
        if (old_path || adv_path)
            return cli_errf(err, errlen,
                            "%s is an input of GRPO steps; the step's objective is dpo "
                                     "(it takes --ref-logps only)",
                            old_path ? "--old-logps" : "--advantages");
        if (!ref_path && !ti->self_ref)
            return cli_errf(err, errlen, "the step's objective is dpo: give --ref-logps R.npy, the "
                                     "reference model's logp of each row [%lld]", (long long)N);
        if (ti->self_ref && !(ti->ref = calloc((size_t)(N * W), sizeof *ti->ref)))
            return cli_errf(err, errlen, "out of memory");
        if (!ti->self_ref && read_floats("--ref-logps", ref_path, 1, N, 0, "reference logps",
                                         &ti->ref, err, errlen))
            return -1;
    } else if (ti->self_ref) { /* a dataset's advantages and the trainer's reference */
        ti->adv = calloc((size_t)(N * W), sizeof *ti->adv);
        if (ti->beta > 0)
            ti->ref = calloc((size_t)(N * T), sizeof *ti->ref);
        if (old_path) /* --old-logps FILE: the dataset's, from the file */
            ti->old = calloc((size_t)(N * T), sizeof *ti->old);
        if (!ti->adv || (ti->beta > 0 && !ti->ref) || (old_path && !ti->old))
            return cli_errf(err, errlen, "out of memory");
    } else if (read_grpo_files(ti, ref_path, old_path, adv_path, note, err, errlen)) {
        return -1;
    }
    return microbatch_buffers(ti, err, errlen);
}

int ti_open(train_inputs *ti, const sbp_step_info *in, int64_t k, const char *ref_path,
            const char *old_path, const char *adv_path, const train_sink *note,
            char *err, size_t errlen)
{
    return open_inputs(ti, in, k, ref_path, old_path, adv_path, false, note, err, errlen);
}

int ti_open_self_ref(train_inputs *ti, const sbp_step_info *in, int64_t k, bool old,
                     const train_sink *note, char *err, size_t errlen)
{
    return open_inputs(ti, in, k, NULL, old ? "" : NULL, NULL, true, note, err, errlen);
}

void ti_free(train_inputs *ti)
{
    free(ti->ref);
    free(ti->old);
    free(ti->adv);
    free(ti->mb_ids);
    free(ti->mb_labels);
    free(ti->mb_ref);
    free(ti->mb_old);
    free(ti->mb_adv);
    memset(ti, 0, sizeof *ti);
}

static const char *nonfinite(float x) { return isnan(x) ? "NaN" : x > 0 ? "inf" : "-inf"; }

int ti_check(const train_inputs *ti, const int32_t *labels, const char *labels_path, char *err,
             size_t errlen)
{
    const int64_t N = ti->N, T = ti->T;
    const float *rows = ti->dpo ? ti->ref : ti->adv;
    const char *rows_path = ti->dpo ? ti->ref_path : ti->adv_path;
    for (int64_t b = 0; rows && b < N * ti->W; b++)
        if (!isfinite(rows[b]))
            return cli_errf(err, errlen, "%s: %s[%lld] is %s", rows_path,
                            ti->dpo ? "ref_logps" : "advantages", (long long)b, nonfinite(rows[b]));
    const float *tok[2] = {ti->grpo ? ti->ref : NULL, ti->old};
    const char *tok_path[2] = {ti->ref_path, ti->old_path};
    const char *tok_name[2] = {"ref_logps", "old_logps"};
    for (int a = 0; a < 2; a++)
        for (int64_t i = 0; tok[a] && i < N * T; i++)
            if (labels[i] != -100 && !isfinite(tok[a][i]))
                return cli_errf(err, errlen, "%s: %s[%lld,%lld] is %s (a scored position)",
                                tok_path[a], tok_name[a], (long long)(i / T), (long long)(i % T),
                                nonfinite(tok[a][i]));
    if (ti->grpo && !ti->grpo_token)
        for (int64_t b = 0; b < N; b++) {
            int64_t n = 0;
            for (int64_t t = 0; t < T; t++)
                n += labels[b * T + t] != -100;
            if (n == 0)
                return cli_errf(err, errlen, "%s: row %lld has no scored position (every label is "
                                         "-100), but GRPO's sequence normalisation divides by "
                                         "each row's scored tokens: drop the row, or compile "
                                         "the step with sbpc --grpo-norm token",
                                labels_path, (long long)b);
        }
    return 0;
}

int64_t ti_docs(const int32_t *labels, const int32_t *doc_ids, int64_t T)
{
    int64_t n = 0;
    bool scored = false; /* the current run's */
    for (int64_t t = 0; t < T; t++) {
        if (t > 0 && doc_ids[t] != doc_ids[t - 1]) {
            n += scored;
            scored = false;
        }
        scored = scored || labels[t] != -100;
    }
    return n + scored;
}

double ti_denominator(const train_inputs *ti, const int32_t *labels, const int32_t *doc_ids)
{
    if (ti->per_doc && (ti->dpo || !ti->grpo_token)) { /* document pairs, or documents */
        double n = 0;
        const int64_t rows = ti->dpo ? ti->N / 2 : ti->N;
        for (int64_t b = 0; b < rows; b++)
            n += (double)ti_docs(labels + b * ti->T, doc_ids + b * ti->T, ti->T);
        return n;
    }
    if (ti->dpo)
        return (double)(ti->N / 2);
    if (ti->grpo && !ti->grpo_token)
        return (double)ti->N;
    double scored = 0;
    for (int64_t i = 0; i < ti->N * ti->T; i++)
        scored += labels[i] != -100;
    return scored;
}

void ti_row(train_inputs *ti, int64_t j, const int32_t *ids, const int32_t *labels, int64_t r)
{
    const int64_t T = ti->T;
    int32_t *mi = ti->mb_ids + j * T, *ml = ti->mb_labels + j * T;
    if (r < 0) { /* a valid id, nothing scored, zero extras */
        for (int64_t t = 0; t < T; t++) {
            mi[t] = 0;
            ml[t] = -100;
        }
    } else {
        memcpy(mi, ids + r * T, sizeof(int32_t) * (size_t)T);
        memcpy(ml, labels + r * T, sizeof(int32_t) * (size_t)T);
    }
    const int64_t W = ti->W; /* per-row values: 1, or T (per document) */
    if (ti->mb_ref && ti->dpo && r < 0)
        memset(ti->mb_ref + j * W, 0, sizeof(float) * (size_t)W);
    else if (ti->mb_ref && ti->dpo)
        memcpy(ti->mb_ref + j * W, ti->ref + r * W, sizeof(float) * (size_t)W);
    else if (ti->mb_ref && r < 0)
        memset(ti->mb_ref + j * T, 0, sizeof(float) * (size_t)T);
    else if (ti->mb_ref)
        memcpy(ti->mb_ref + j * T, ti->ref + r * T, sizeof(float) * (size_t)T);
    if (ti->mb_old && r < 0)
        memset(ti->mb_old + j * T, 0, sizeof(float) * (size_t)T);
    else if (ti->mb_old)
        memcpy(ti->mb_old + j * T, ti->old + r * T, sizeof(float) * (size_t)T);
    if (ti->mb_adv && r < 0)
        memset(ti->mb_adv + j * W, 0, sizeof(float) * (size_t)W);
    else if (ti->mb_adv)
        memcpy(ti->mb_adv + j * W, ti->adv + r * W, sizeof(float) * (size_t)W);
}

void ti_micro(train_inputs *ti, const int32_t *ids, const int32_t *labels, int64_t k)
{
    const int64_t B = ti->B, h = B / 2;
    for (int64_t j = 0; j < B; j++) /* the files' row for the micro-batch's row j */
        ti_row(ti, j, ids, labels,
               !ti->dpo ? k * B + j : j < h ? k * h + j : ti->N / 2 + k * h + (j - h));
}
