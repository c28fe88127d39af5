/* train_mem.h — the run's memory on the step's backend: one arena (the step's runtime's
 * sbprt_arena_alloc) holding, at SBPRT_ALIGN-aligned offsets,
 *   params [param_elems] f32 | grads [grad_elems] f32 | AdamW m, v [this rank's slice] f32 |
 *   workspace [max(training, evaluation) bytes] | ids, labels [B*T] i32 |
 *   ref [B*T] f32 (DPO uses B of them), old [B*T] f32, adv [B] f32 (DPO / GRPO, when used) |
 *   doc_ids [B*T] i32 (packed steps)
 * and the host views of the parameter and gradient blocks (the arena itself on the CPU, copies
 * for a device). On a device the memory in use is sampled after every step, so the end report
 * can set the planned bytes against what was used; an arena that does not fit gets the
 * --memory-budget that would.
 */
#ifndef SBP_TRAIN_MEM_H
#define SBP_TRAIN_MEM_H

#include "train_steplib.h"

typedef struct train_mem_need {
    size_t ws_bytes;         /* the workspace (evaluation shares the training one) */
    size_t state_elems;      /* each AdamW moment's elements on this rank (0: sgd) */
    bool ref;                /* a reference logp input */
    bool old, adv, doc_ids;  /* GRPO's old logps [B*T] and advantages [B]; packed doc ids */
    bool adamw;              /* for the advice when it does not fit */
    size_t host_budget;      /* an offloading step's host workspace must fit (0: the machine's
                              * available memory) */
} train_mem_need;

typedef struct train_mem {
    char *arena;
    size_t bytes;             /* the arena's */
    size_t pbytes, gbytes;    /* the parameter block's and the gradient block's */
    size_t mbytes;            /* each AdamW moment's on this rank (its ZeRO slice) */
    float *d_params;          /* [param_elems] the trainer's parameters (host_state: the fp32
                               * masters, in host memory) */
    float *d_grads, *d_m, *d_v; /* [grad_elems]; m, v: [state elems] (adamw); host_state: in
                               * host memory */
    /* what sbp_step_run gets: d_params and d_grads, or with host_state the device's parameter
     * block (the step's layout: L->step_in) and gradient block */
    float *step_params, *step_grads;
    size_t step_pbytes;       /* the step's parameter block */
    float *staging;           /* host_state: [step_pbytes] the block as uploaded */
    bool host_state;          /* d_params, d_grads, d_m, d_v, staging are host memory (ours) */
    bool grads_host;          /* host_state and the step writes its gradients into host memory
                               * (sbp_step_info.grads_on_host): step_grads is d_grads, from the
                               * runtime's sbprt_host_alloc, and the arena holds none */
    char *workspace;
    int32_t *d_ids, *d_labels; /* [B*T] each */
    float *d_ref, *d_old, *d_adv;
    int32_t *d_doc_ids;       /* [B*T], or NULL: not a packed step */
    float *host_params, *host_grads; /* [param_elems], [grad_elems] host views of the blocks */
    void *host_ws;            /* [host_bytes] an offloading step's host workspace, or NULL */
    bool own_host;            /* malloc'd (not the arena itself) */
    /* device memory: in use before the arena, the device's total, the most in use seen after */
    bool dev_mem;
    size_t dev_before, dev_total, dev_peak;
} train_mem;

int train_mem_alloc(train_mem *m, const train_steplib *L, const train_mem_need *need,
                    const train_sink *s);
/* The device's memory in use, kept when it is the most seen. */
void train_mem_sample(train_mem *m, const train_steplib *L);
/* m and v to zero (through a zeroed host buffer: backend-neutral). */
int train_mem_zero_state(train_mem *m, const train_steplib *L, const train_sink *s);
/* A failed step's note when the runtime's scratch did not fit next to the arena. */
void train_mem_step_nomem(const train_mem *m, const train_steplib *L, const train_sink *s);
void train_mem_free(train_mem *m, const train_steplib *L);
/* The trainer's parameters to the step: with host_state the masters stored into the step's
 * block (its bf16 weights rounded as sbp_step_param_store does) and copied to the device; on a
 * device step the host copy to the device; nothing on a cpu step. */
int train_mem_upload(train_mem *m, const train_steplib *L, const train_sink *s);
/* host_state: the step's gradient block into the host's d_grads (else, or when the step
 * streams them there itself, nothing). */
int train_mem_fetch_grads(train_mem *m, const train_steplib *L, const train_sink *s);

#endif
