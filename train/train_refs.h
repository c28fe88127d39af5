/* train_refs.h — the reference log-probs of a DPO or GRPO dataset, computed by the trainer
 * itself from the model's initial weights (the reference model) before step 1, with the step's
 * log-probability entry point (sbp_step_logps): B examples a call in file order (padding rows
 * score nothing), in the training workspace (the step's own forward, no gradient), so no memory
 * is added to the run's peak. Every rank computes all of them (the values one process gets).
 *
 * DPO: each example's summed logp; GRPO: each scored token's (0 where not scored) and their
 * sum. The values are kept in a cache — DIR/ref-logps.safetensors beside the checkpoints, or
 * --ref-cache FILE — keyed by hashes of the initial weights, the dataset and the step's model,
 * and reused only when the key matches and every value is finite. --compute-logps OUT writes
 * them there instead, and the run ends.
 */
#ifndef SBP_TRAIN_REFS_H
#define SBP_TRAIN_REFS_H

#include "sbptrain.h"
#include "train_inputs.h"
#include "train_mem.h"
#include "train_source.h"
#include "train_steplib.h"

typedef struct train_refs {
    float *ex;       /* [examples] each example's logp (DPO) or its scored tokens' sum (GRPO) */
    float *tok;      /* GRPO: [dataset tokens] each token's, 0 where not scored; else NULL */
    bool grpo;
    bool logps_only; /* --compute-logps wrote them: nothing to train */
} train_refs;

/* Room for the dataset's values (grpo: per token too). */
int train_refs_alloc(train_refs *f, const train_dataset *ds, bool grpo, const train_sink *s);
/* Read from the cache, or computed (and written to the cache or --compute-logps). */
int train_refs_compute(train_refs *f, const train_config *c, const train_steplib *L,
                       const train_mem *m, train_dataset *ds, const train_dist *d,
                       const train_sink *s);
/* The step's inputs from its rows' examples: DPO's reference logp per row; GRPO's advantage
 * per row and reference logp per token. */
void train_refs_fill(const train_refs *f, const train_source *src, train_inputs *ti);
void train_refs_free(train_refs *f);

#endif
