/* train_sched.h — sbp-train's learning-rate schedule and gradient clipping.
 *
 * The schedules are transformers' (optimization.py), so that a run here and a Hugging Face
 * Trainer run with the same flags take the same learning rate at every step. Optimizer step s
 * (1-based, as sbp-train numbers them) of N (--steps) uses lr * f(s - 1), W = --warmup-steps,
 * r = --min-lr / --lr (0 without --min-lr):
 *   warmup (c < W):  f(c) = c / max(1, W)                   (every schedule)
 *   constant:        f(c) = 1                               get_constant_schedule_with_warmup
 *   linear:          f(c) = max(0, (N - c) / max(1, N - W)) * (1 - r) + r
 *                                                           get_linear_schedule_with_warmup
 *   cosine:          f(c) = max(0, (0.5 (1 + cos(pi p))) * (1 - r) + r), p = (c - W) / max(1, N - W)
 *                                                   get_cosine_with_min_lr_schedule_with_warmup
 * With r = 0 the cosine is get_cosine_schedule_with_warmup's (num_cycles 0.5). transformers has
 * no linear schedule with a floor: --min-lr is applied to it the way the cosine one applies it
 * (the decay factor mapped from [0, 1] onto [r, 1]), so the two floors mean the same thing.
 *
 * Clipping is torch.nn.utils.clip_grad_norm_ (norm_type 2, foreach or not): the global L2 norm
 * over every trained parameter's gradient, accumulated in double, and when --clip-grad-norm F is
 * given every gradient is multiplied by min(1, F / (norm + 1e-6)). The norm is measured through
 * the runtime of the step's backend (sbprt_grad_sq_norm: on the device for a cuda step), and the
 * scaling with sbprt_scale in place, so the gradients never leave the backend's memory.
 */
#ifndef SBP_TRAIN_SCHED_H
#define SBP_TRAIN_SCHED_H

#include <stdbool.h>
#include "train_opt.h"
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "sbp_step.h"
#include "sbprt.h"

enum { TRAIN_SCHED_CONSTANT, TRAIN_SCHED_LINEAR, TRAIN_SCHED_COSINE };

/* The schedule, clipping and log flags (train_config, sbptrain.h, holds one of these). */
typedef struct train_sched_opts {
    int kind;             /* --lr-schedule: TRAIN_SCHED_*, default constant */
    int64_t warmup;       /* --warmup-steps W >= 0 (default 0) */
    double min_lr;        /* --min-lr, >= 0 (default 0) */
    bool min_lr_set;      /* --min-lr was given */
    double clip;          /* --clip-grad-norm F > 0, or 0: no clipping */
    const char *log_path; /* --log FILE.jsonl, or NULL */
} train_sched_opts;

/* The options (train_opt.h): --lr-schedule, --warmup-steps, --min-lr, --clip-grad-norm, --log.
 * The parser takes the option cli last returned, with value v: 0, -1 after the checker's
 * message, or TRAIN_OPT_NOT_MINE. */
extern const struct option train_sched_options[];
int train_sched_parse(train_sched_opts *t, cli *c, const char *v);
/* Checks the options against each other and --lr: 0, or -1 with a message in err. */
int train_sched_check(const train_sched_opts *t, double lr, char *err, size_t errlen);
/* The usage text of the options (ends in a newline). */
const char *train_sched_usage(void);

/* The learning rate of optimizer step s (1-based) of a run of `total` steps. */
double train_sched_lr(const train_sched_opts *t, double lr, int64_t s, int64_t total);
/* clip_grad_norm_'s coefficient for a gradient of norm `norm`: min(1, max / (norm + 1e-6)). */
double train_clip_coef(double max_norm, double norm);

/* The runtime entry points the norm and the clipping go through, with their context (sbp-train
 * takes each from the step's runtime when the step exports it: see its `runtime`). */
typedef struct train_grad_rt {
    int (*sq_norm)(sbprt_ctx *, double *, const float *, size_t); /* sbprt_grad_sq_norm */
    sbprt_ctx *sq_ctx;
    int (*scale)(sbprt_ctx *, float *, const float *, size_t, float); /* sbprt_scale */
    sbprt_ctx *scale_ctx;
    /* optional: the multi-tensor forms (same contexts) and the spans of every trainable
     * parameter with storage, whole (train_optim's update list); with all four set the norm
     * takes one synchronisation and the clipping one launch */
    int (*sq_norm_multi)(sbprt_ctx *, double *, const float *, const sbprt_span *, int);
    int (*scale_multi)(sbprt_ctx *, float *, const sbprt_span *, int, float);
    const sbprt_span *spans;
    int nspans;
} train_grad_rt;

/* The L2 norm of the gradients of every trainable parameter with storage (grads: the step's
 * gradient block in backend memory), and, when max_norm > 0 and the coefficient is below 1,
 * the gradients scaled by it. *norm, *coef (1 when nothing was scaled). A runtime status. */
int train_clip_grads(const train_grad_rt *rt, const sbp_step_info *in, float *grads,
                     double max_norm, double *norm, double *coef);

#endif
