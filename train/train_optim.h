/* train_optim.h — one optimizer update over the trained parameters, in the step's memory: the
 * gradient norm (over the ranks' slices under ZeRO), clipped to --clip-grad-norm when asked,
 * then AdamW (as torch.optim.AdamW: betas 0.9 / 0.999, eps 1e-8, decoupled weight decay) or
 * SGD (no momentum, L2 weight decay) on each trained parameter, or on this rank's slice of it
 * under ZeRO, whose updated slices are then gathered by every rank. An update that makes a
 * weight non-finite (a huge --lr or --weight-decay) stops the run at this step, naming the
 * tensor: the next loss would only say NaN, and a last step's update has no next loss.
 */
#ifndef SBP_TRAIN_OPTIM_H
#define SBP_TRAIN_OPTIM_H

#include "sbptrain.h"
#include "train_mem.h"
#include "train_steplib.h"

typedef struct train_optim {
    bool adamw;          /* else sgd */
    double weight_decay;
    double clip;         /* --clip-grad-norm, 0: none */
} train_optim;

/* Step s's update at learning rate lr; *gnorm: the gradient norm before clipping. */
int train_optim_update(const train_optim *o, const train_steplib *L, train_mem *m, train_dist *d,
                       int64_t s, double lr, double *gnorm, const train_sink *sink);

#endif
