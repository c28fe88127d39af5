/* train_refs.h — the reference log-probs of a DPO or GRPO dataset, computed by the trainer
 * itself from the model's initial weights (the reference model) before step 1, with the step's
 * log-probability entry point (sbp_step_logps): B examples a call in file order (padding rows
 * score nothing), in the training workspace (the step's own forward, no gradient), so no memory
 * is added to the run's peak. Under mpirun the batches are dealt out to the ranks in turn (batch
 * k to rank k mod size), and every rank then holds them all: each batch is one process's batch,
 * so the values, and the cache, are bitwise one process's.
 *
 * DPO: each example's summed logp; GRPO: each scored token's (0 where not scored) and their
 * sum. The values are kept in a cache — DIR/ref-logps.safetensors beside the checkpoints, or
 * --ref-cache FILE — keyed by hashes of the initial weights, the dataset and the step's model,
 * and reused only when the key matches and every value is finite. A cache says what it is in
 * its metadata ("purpose": "ref-cache"); a file there without that identity (a weights file,
 * notes, a --compute-logps output) is never replaced: the run is refused before the pass.
 * --compute-logps OUT writes them there instead, and the run ends.
 *
 * A file of that format (--compute-logps of any model: a reference that is not the starting
 * point) is also read instead: --ref-logps FILE, and for GRPO --old-logps FILE (the sampling
 * policy's token logps). It must be of this very dataset (the dataset's hash in its key);
 * the model's part of the key is not compared, since another model is the point.
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
    float *old;      /* GRPO with --old-logps FILE: [dataset tokens] its token logps; else NULL */
    bool grpo;
    bool logps_only; /* --compute-logps wrote them: nothing to train */
} train_refs;

/* Whether the cache path may be written: 0 when nothing is there or it is a cache (of any
 * key); -1 with a message naming `role` when it is anything else. strict: a cache is a file
 * whose metadata says so ("purpose"); else any file of sbp-train's log-probs format passes
 * (the cheap check before any work, which a matching cache of any age passes: reusing one
 * replaces nothing). */
int train_refs_check_cache(const char *path, const char *role, bool strict, char *err,
                           size_t errlen);
/* Room for the dataset's values (grpo: per token too). */
int train_refs_alloc(train_refs *f, const train_dataset *ds, bool grpo, const train_sink *s);
/* Read from --ref-logps FILE or the cache, or computed (and written to the cache or
 * --compute-logps); then, for GRPO, --old-logps FILE's when given. */
int train_refs_compute(train_refs *f, const train_config *c, const train_steplib *L,
                       const train_mem *m, train_dataset *ds, const train_dist *d,
                       const train_sink *s);
/* GRPO with --old-logps FILE: the sampling policy's token logps of the dataset, from FILE. */
int train_refs_load_old(train_refs *f, const char *path, const train_dataset *ds,
                        const train_sink *s);
/* The step's inputs from its rows' examples: DPO's reference logp per row; GRPO's advantage
 * per row, reference logp per token and, with --old-logps, the old logp per token. */
void train_refs_fill(const train_refs *f, const train_source *src, train_inputs *ti);
void train_refs_free(train_refs *f);

#endif
