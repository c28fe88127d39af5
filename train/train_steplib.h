/* train_steplib.h — a compiled training step as the trainer holds it: the dlopen'd library, its
 * entry points, its self-description (checked before any use) and the runtime functions the
 * trainer calls on the step's memory.
 *
 * A step links libsbprt in, so two copies of the runtime may be at hand: the step's and the
 * one linked into the trainer. A context is only ever passed to functions of the copy that
 * made it: when the step exports sbprt_ctx_create, `step_ctx` is made by the step's copy and
 * every function the step also exports is taken from it; functions it does not export (a
 * static link keeps only what the step calls, typically not the optimizers) come from the
 * trainer's copy with a context of their own, `own_ctx`. Both copies then share memory, so
 * that is only allowed when the step's backend is the trainer's (the CPU).
 *
 * Before dlopen the file is checked as an ELF image (a truncated .so would otherwise be SIGBUS
 * in the loader), and the step's table (dims, parameters, offsets, ties, storage, gradient
 * slices) for consistency: nothing later trusts it unchecked.
 */
#ifndef SBP_TRAIN_STEPLIB_H
#define SBP_TRAIN_STEPLIB_H

#include <stdbool.h>
#include <stddef.h>

#include "sbp_step.h"
#include "sbprt.h"
#include "train_say.h"

typedef int (*train_step_fn)(sbprt_ctx *, const sbp_step_args *);

/* The runtime functions the trainer calls, each with the context it must be given. */
typedef struct train_rt {
    const char *(*status_string)(int);
    const char *(*backend_name)(void);
    int (*ctx_create)(sbprt_ctx **, int);
    void (*ctx_destroy)(sbprt_ctx *);
    int (*sync)(sbprt_ctx *);
    int (*arena_alloc)(sbprt_ctx *, void **, size_t);
    void (*arena_free)(sbprt_ctx *, void *);
    /* the host workspace of an offloading step (page-locked: the step's runtime's pair when it
     * exports it, else ours), with arena_ctx's context */
    int (*host_alloc)(sbprt_ctx *, void **, size_t);
    void (*host_free)(sbprt_ctx *, void *);
    int (*copy)(sbprt_ctx *, void *, const void *, size_t, int);
    int (*sgd_update)(sbprt_ctx *, float *, const float *, size_t, double, double);
    int (*adamw_update)(sbprt_ctx *, float *, float *, float *, const float *, size_t, double,
                        double, double, double, double, int);
    /* the gradient norm and clipping (train_sched.h) */
    int (*grad_sq_norm)(sbprt_ctx *, double *, const float *, size_t);
    int (*scale)(sbprt_ctx *, float *, const float *, size_t, float);
    /* the multi-tensor forms (sbprt.h), each with the context of its per-tensor function
     * above, from the same copy; NULL when that copy lacks it (a step built before they
     * existed): the trainer then loops over the per-tensor function */
    int (*grad_sq_norm_multi)(sbprt_ctx *, double *, const float *, const sbprt_span *, int);
    int (*scale_multi)(sbprt_ctx *, float *, const sbprt_span *, int, float);
    int (*sgd_update_multi)(sbprt_ctx *, float *, const float *, const sbprt_span *, int, double,
                            double);
    int (*adamw_update_multi)(sbprt_ctx *, float *, float *, float *, const float *,
                              const sbprt_span *, int, double, double, double, double, double,
                              int);
    /* the step's copy's sbprt_ctx_launches, or NULL (not exported; the CPU launches nothing) */
    unsigned long long (*ctx_launches)(const sbprt_ctx *);
    /* the step's copy when it made the context (else ours): diagnostics and memory figures */
    const char *(*last_error)(const sbprt_ctx *);
    int (*device_memory)(sbprt_ctx *, size_t *, size_t *);
    int (*ctx_nthreads)(const sbprt_ctx *); /* the step's copy, ours, or NULL (not exported) */
    /* the step's sbp_step_init / sbp_step_release (codegen/sbp_step.h), or NULL (older steps) */
    int (*step_init)(sbprt_ctx *);
    void (*step_release)(sbprt_ctx *);
    /* which context each group of functions takes: &step_ctx or &own_ctx */
    sbprt_ctx **sync_ctx, **arena_ctx, **copy_ctx, **sgd_ctx, **adamw_ctx;
    sbprt_ctx **norm_ctx, **scale_ctx;
    sbprt_ctx *step_ctx;     /* made by ctx_create; the one sbp_step_run gets */
    sbprt_ctx *own_ctx;      /* made by the trainer's runtime, or NULL when not needed */
    bool ctx_from_step;      /* ctx_create/ctx_destroy are the step's */
    const char *own_missing; /* a function the step does not export, or NULL */
} train_rt;

/* Calls runtime function fn with the context it belongs with. */
#define TRAIN_RT(rt, fn, ctxf, ...) ((rt).fn(*(rt).ctxf, __VA_ARGS__))

typedef struct train_steplib {
    const char *path;        /* as given (for messages) */
    void *lib;               /* never closed: see train_steplib_stop */
    train_step_fn run;       /* sbp_step_run */
    train_step_fn eval;      /* sbp_step_eval, looked up by train_steplib_want_eval */
    /* sbp_step_logps, looked up by train_steplib_want_logps */
    int (*logps)(sbprt_ctx *, const sbp_step_args *, float *, float *);
    const sbp_step_info *in; /* its self-description, validated; with host_state, the trainer's
                              * view of it: the same, but the parameter table's offsets and
                              * param_elems describe the fp32 master block (host_info) */
    train_rt rt;
    bool host_visible;       /* the backend's memory is the host's (cpu) */
    /* sbpc --offload optimizer: the trainer keeps the fp32 masters, the gradients' copy and the
     * optimizer state in host memory and updates them with its own (CPU) runtime, and after
     * each update stores the masters into the step's parameter block (step_in's layout, its
     * GEMM weights bf16) on the device */
    bool host_state;
    const sbp_step_info *step_in; /* the step's own self-description (in, without host_state) */
    sbp_step_info host_info; /* host_state: *in */
    sbp_step_param *host_params_tab; /* [n_params] host_info.params (malloc'd) */
    /* sbpc --seq-parallel N: every data path reads whole rows, so `in` is the trainer's view
     * with seq_len the rows' whole length N * tl; the step itself takes tl of each row's
     * tokens (step_in->seq_len), which the caller cuts out of the whole rows */
    int sp;                  /* N (1 for an ordinary step too: see step_in->seq_parallel) */
    int64_t sp_tl;           /* the step's own seq_len, tl */
    sbp_step_info sp_info;   /* sp > 1: *in */
    int (*set_comm)(sbprt_ctx *, const sbprt_comm *); /* the step's sbprt_ctx_set_comm */
} train_steplib;

/* Checks the file, dlopens it, checks its ABI version and table, and picks the runtime's
 * functions. */
int train_steplib_open(train_steplib *L, const char *path, const train_sink *s);
/* Creates the contexts (the step's, and ours where a function comes from our runtime). */
int train_steplib_start(train_steplib *L, int nthreads, const train_sink *s);
/* The step's release of its device copies and the contexts; the library stays mapped. */
void train_steplib_stop(train_steplib *L);

/* sbp_step_eval for --eval-data / --eval-dataset (`flag`), or an error saying why there is none. */
int train_steplib_want_eval(train_steplib *L, const char *flag, const train_sink *s);
/* sbp_step_logps for a dataset's reference log-probs, or an error saying why there is none. */
int train_steplib_want_logps(train_steplib *L, const train_sink *s);

/* Host <-> step memory (SBPRT_COPY_HOST_TO_DEVICE / _DEVICE_TO_HOST); an error line names the
 * backend and the runtime's diagnostic. */
int train_steplib_copy(const train_steplib *L, void *dst, const void *src, size_t n, int dir,
                       const train_sink *s);
/* " (<the runtime's diagnostic>)" for a failure on ctx, or "" when it recorded none. */
const char *train_steplib_why(const train_steplib *L, sbprt_ctx *ctx, char *buf, size_t n);
/* The CPU threads a cpu step's reductions are split over (what makes its results bit for bit
 * reproducible only at the same count), or 0 for another target or when the step does not say. */
int train_steplib_threads(const train_steplib *L, int64_t asked);

#endif
