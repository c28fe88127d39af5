/* train_inputs.h — the batch of one optimizer step in sbp-train: K micro-batches of the step's
 * B rows (--grad-accum K), the DPO / GRPO inputs (--ref-logps, --old-logps, --advantages),
 * their checks, and the denominator that makes K accumulated steps equal one step on the
 * whole batch (codegen/sbp_step.h, "Objectives").
 *
 * The files hold N = K * B rows. Micro-batch k takes rows k*B .. k*B + B - 1, except for DPO,
 * whose pairs are (row i, row N/2 + i) of the files: micro-batch k takes the chosen rows
 * k*B/2 .. k*B/2 + B/2 - 1 and their rejected partners, so that each of its own pairs (row j,
 * row B/2 + j) is one of the files' pairs. Every function that can fail writes a message
 * (without the program's prefix) into err and returns -1.
 */
#ifndef SBP_TRAIN_INPUTS_H
#define SBP_TRAIN_INPUTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbp_step.h"
#include "train_say.h"

typedef struct train_inputs {
    int64_t B, T, K, N;        /* the step's batch and sequence length; micro-batches; N = K*B */
    bool dpo, grpo;            /* the step's objective */
    bool grpo_token;           /* GRPO's token normalisation (else sequence) */
    double beta;               /* the step's beta (DPO / GRPO) */
    const char *ref_path, *old_path, *adv_path; /* the files given, or NULL */
    bool self_ref;             /* ref / adv are filled by the caller (ti_open_self_ref) */
    bool per_doc;              /* a per-document step (sbpc --per-document): DPO's ref and
                                * GRPO's adv hold one value per document, W = T a row */
    int64_t W;                 /* per-row values a row: 1, or T per document (row r's
                                * document k at r*T + k) */
    float *ref;                /* DPO [N*W]; GRPO [N*T] (NULL when beta == 0); else NULL */
    float *old;                /* GRPO [N*T], NULL: on-policy */
    float *adv;                /* GRPO [N*W] */
    int32_t *mb_ids, *mb_labels; /* [B*T] one micro-batch, in the step's row order */
    float *mb_ref, *mb_old, *mb_adv; /* [B*W] or [B*T], [B*T], [B*W] (NULL when not used) */
} train_inputs;

/* Reads and checks the objective's files against the step (in) for K micro-batches: which
 * flags the objective takes and needs, dtypes (float32 or float64), shapes ([N], [N,T]);
 * notes go to stderr through `note` (e.g. --ref-logps ignored with beta 0). */
int ti_open(train_inputs *ti, const sbp_step_info *in, int64_t k, const char *ref_path,
            const char *old_path, const char *adv_path, const train_sink *note,
            char *err, size_t errlen);
/* DPO / GRPO on a dataset: the reference logps are per example (the trainer's own, computed
 * before step 1 from the model's initial weights, or a --compute-logps file) and GRPO's
 * advantages the dataset's, so ref (DPO [N], GRPO [N*T] when beta > 0), adv (GRPO [N]) and,
 * when `old` (GRPO's --old-logps FILE, per example too), old [N*T] are allocated here and
 * filled by the caller each step; without `old` GRPO's old logps are on-policy. */
int ti_open_self_ref(train_inputs *ti, const sbp_step_info *in, int64_t k, bool old,
                     const train_sink *note, char *err, size_t errlen);
void ti_free(train_inputs *ti);

/* Checks the values against the labels [N*T]: every per-row value and every per-token value at
 * a scored position finite; GRPO with the sequence normalisation: every row scored. */
int ti_check(const train_inputs *ti, const int32_t *labels, const char *labels_path, char *err,
             size_t errlen);

/* The whole batch's denominator (sbp_step_args.denominator) from its labels [N*T]: scored
 * positions (SFT, graph-loss, GRPO token), rows (GRPO sequence) or pairs (DPO); per document,
 * from doc_ids [N*T] too: documents (GRPO sequence) or document pairs (DPO). */
double ti_denominator(const train_inputs *ti, const int32_t *labels, const int32_t *doc_ids);

/* The documents of one row of T tokens as a per-document step counts them: its runs of equal
 * document ids that hold a scored label. */
int64_t ti_docs(const int32_t *labels, const int32_t *doc_ids, int64_t T);

/* Row j of mb_* from row r of the whole batch's ids and labels [N*T] and the inputs; r < 0: an
 * unscored padding row (id 0, labels -100, zero reference / old logps and advantage). */
void ti_row(train_inputs *ti, int64_t j, const int32_t *ids, const int32_t *labels, int64_t r);

/* Fills mb_* with micro-batch k of the whole batch's ids and labels [N*T] and the inputs. */
void ti_micro(train_inputs *ti, const int32_t *ids, const int32_t *labels, int64_t k);

#endif
