/* sbptrain.h — the trainer as a C library: a compiled training step (codegen/sbp_step.h), the
 * model it was compiled from, and data, turned into optimizer steps, checkpoints and a trained
 * model. sbp-train (tools/sbp_train.c) is a command line over exactly this API; a user's own C
 * program drives it the same way:
 *
 *     train_config c;
 *     train_config_init(&c);
 *     c.step_path = "step.so"; c.model_path = "model.onnx"; c.data_path = "tokens.bin";
 *     c.steps = 100;
 *     train_run *r;
 *     if (train_config_check(&c, &sink) || train_run_open(&r, &c, NULL, &sink))
 *         ...;                                  // the reason went to the sink
 *     for (train_step_stats st; !train_run_done(r);)
 *         if (train_run_step(r, &st) || train_run_end_step(r, &st))
 *             break;                            // st.loss, st.lr, st.grad_norm, ...
 *     train_run_finish(r, &report);             // --save and friends; the memory figures
 *     train_run_close(r);
 *
 * The pieces, one concept per file (each with its own header):
 *   train_run.c       the run: open (the phases below), step, end_step, finish, close
 *   train_config.c    the options' defaults, their cross-checks and what ranks must agree on
 *   train_steplib.c   the step library: dlopen, its self-description, the runtime's functions
 *   train_model.c     the model's initializers against the step's parameters; weights and
 *                     gradients written out (ONNX copy, --dump-grads)
 *   train_source.c    the data sources behind one interface: an .npy batch, an llm.c token
 *                     shard, the shard packed into whole documents, an sbp-prepare dataset
 *   train_mem.c       the arena: parameters, gradients, AdamW's moments, the workspace, one
 *                     micro-batch; the device memory figures
 *   train_optim.c     the gradient norm and clipping, AdamW / SGD over the trained parameters
 *                     (this rank's ZeRO slices), the finite check of the update
 *   train_refs.c      a DPO / GRPO dataset's reference log-probs: computed before step 1 from
 *                     the initial weights, cached beside the checkpoints
 *   train_inputs.c    micro-batches and the DPO / GRPO inputs; train_sched.c the schedule;
 *   train_rewards.c   DPO's rewards per step (as TRL logs them), from the step's row logps;
 *   train_log.c       --log; train_ckpt.c checkpoints; train_eval.c held-out evaluation;
 *   train_pack.c      packed documents; train_dataset.c datasets; train_adapter.c LoRA;
 *   train_export.c    safetensors under PyTorch names; train_pretrained.c a model folder;
 *   train_outputs.c   every output checked before step 1; train_finite.c non-finite values;
 *   train_dist.c      data parallel under mpirun (MPI; NCCL for cuda steps)
 * Every function returns 0, or -1 after its error line(s) went to the sink (train_say.h).
 */
#ifndef SBP_TRAIN_H
#define SBP_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbp_step.h"
#include "train_adapter.h"
#include "train_ckpt.h"
#include "train_dataset.h"
#include "train_dist.h"
#include "train_eval.h"
#include "train_pack.h"
#include "train_pretrained.h"
#include "train_rewards.h"
#include "train_say.h"
#include "train_sched.h"

/* What a run does: sbp-train's command line, field for field (sbp-train --help says each). */
typedef struct train_config {
    const char *step_path;   /* STEP.so */
    const char *model_path;  /* --model */
    const char *ids_path;    /* --input-ids */
    const char *labels_path; /* --labels */
    const char *data_path;   /* --data */
    const char *dump_grads;  /* --dump-grads, or NULL */
    const char *save;        /* --save, or NULL */
    const char *save_safetensors; /* --save-safetensors, or NULL */
    int64_t steps;           /* --steps, >= 1 (set from --epochs when a dataset's passes ask) */
    bool steps_given;        /* --steps was given (it and --epochs exclude each other) */
    double lr;               /* --lr, >= 0 */
    double weight_decay;     /* --weight-decay, >= 0 */
    bool adamw;              /* --optimizer adamw (else sgd) */
    int64_t threads;         /* --threads, 0 = the runtime's default */
    size_t host_budget;      /* --host-budget: the host memory an offloading step's host
                              * workspace may take; 0 = what the machine has available */
    int64_t grad_accum;      /* --grad-accum K >= 1 */
    const char *ref_logps;   /* --ref-logps (DPO, GRPO), or NULL */
    const char *old_logps;   /* --old-logps (GRPO), or NULL */
    const char *advantages;  /* --advantages (GRPO), or NULL */
    train_sched_opts sched;  /* --lr-schedule, --warmup-steps, --min-lr, --clip-grad-norm, --log */
    train_ckpt_opts ckpt;    /* --checkpoint-dir, --checkpoint-every, --keep-checkpoints, --resume */
    train_pack_opts pack;    /* --pack, --eos, --doc-ids */
    train_adapter_opts adapter; /* --save-adapter, --merge-lora */
    train_eval_opts eval;    /* --eval-data, --eval-dataset, --eval-every, --eval-batches */
    int64_t zero;            /* --zero 0|1|2 */
    int64_t seq_parallel;    /* --seq-parallel N: must be the step's own N (0: not given; the
                              * step's is used) */
    train_dataset_opts dataset; /* --dataset, --epochs, --shuffle-seed */
    train_pretrained_opts pretrained; /* --save-pretrained, --tokenizer */
    const char *compute_logps; /* --compute-logps OUT.safetensors: log-probs only, no training */
    const char *ref_cache;   /* --ref-cache FILE: where a dataset's reference log-probs are kept
                              * (default: DIR/ref-logps.safetensors of the checkpoints) */
    const char *training_flag; /* the first option given that only training reads (a flag
                              * whose value is a default, e.g. --lr 1e-3, leaves no other trace
                              * in these fields), or NULL: --compute-logps refuses it */
} train_config;

/* The defaults: one step, lr 1e-3, AdamW, --grad-accum 1, nothing saved. */
void train_config_init(train_config *c);
/* The options against each other (one source of data, flags that need another, ...). */
int train_config_check(train_config *c, const train_sink *s);
/* Under mpirun: this rank's options and input files against rank 0's, before anything depends
 * on them (train_dist_agree). `leaving`: this rank only prints --help or --version. */
int train_config_agree(const train_config *c, train_dist *d, bool leaving, const train_sink *s);
/* Drops what only rank 0 writes (on the other ranks of a distributed run). */
void train_config_rank_outputs(train_config *c);

typedef struct train_run train_run;

/* Loads the step, the data and the model, checks every file against the step, allocates the
 * arena, copies the weights in, restores --resume, computes a dataset's reference log-probs
 * and opens --log: everything before step 1. `dist` is the launcher's ranks (train_dist.h), or
 * NULL for one process. *out is set whenever memory allowed, also on failure: close it. */
int train_run_open(train_run **out, const train_config *c, train_dist *dist,
                   const train_sink *s);
void train_run_close(train_run *r);

/* The step's self-description (validated). */
const sbp_step_info *train_run_info(const train_run *r);
/* The config the run follows (--epochs resolved into steps). */
const train_config *train_run_config(const train_run *r);
/* --compute-logps: the log-probs are written and there is nothing to train. */
bool train_run_logps_only(const train_run *r);
/* The next step to run (> 1 after --resume), and whether the run is over: past its last step,
 * or stopped by SIGINT / SIGTERM after a checkpoint. */
int64_t train_run_next_step(const train_run *r);
bool train_run_done(const train_run *r);

/* The parameter block [param_elems] as the step lays it out (train_run_info's table gives each
 * parameter's offset), in host memory: copied back first from a device. Valid until the next
 * step or close. */
int train_run_weights(train_run *r, const float **params);

/* One optimizer step's figures. */
typedef struct train_step_stats {
    int64_t step;        /* 1, 2, ... */
    double loss;         /* the whole batch's (all micro-batches, all ranks) */
    double tokens_per_s; /* the global batch's tokens over the step's time, measured over
                          * the newest steps that span 1 s (at most 64): a steady figure */
    double lr;           /* this step's learning rate (the schedule's) */
    double grad_norm;    /* before clipping */
    double eval_loss;    /* NaN unless an evaluation ran after this step */
    double aux_loss;     /* a Mixture-of-Experts step's load-balancing loss aux (transformers'
                          * aux_loss: loss includes router_aux_coef x aux), the mean over this
                          * rank's micro-batches; NaN for a dense model */
    train_rewards_stats rewards; /* DPO: the mean rewards of the step's pairs (train_rewards.h,
                                  * TRL's rewards/chosen, rejected, margins, accuracies);
                                  * NaN for other objectives */
} train_step_stats;

/* The next optimizer step: its batch, the step on every micro-batch, the sums over ranks, the
 * first step's --dump-grads, clipping and the update. */
int train_run_step(train_run *r, train_step_stats *st);
/* After the step's line: the evaluation when due ("out" line), --log, the checkpoint when due,
 * and a signal's stop. */
int train_run_end_step(train_run *r, train_step_stats *st);

/* The figures of a finished run. */
typedef struct train_report {
    bool host_visible;        /* a cpu step: memory is the process's */
    size_t planned_bytes;     /* the step's planned peak (parameters, gradients, workspace) */
    size_t opt_state_bytes;   /* AdamW's moments held by this rank (its ZeRO slice) */
    size_t host_bytes;        /* an offloading step's host workspace (sbpc --offload), or 0 */
    size_t opt_state_full;    /* the same without ZeRO */
    bool dev_known;           /* the device figures below are available */
    size_t dev_used;          /* the most in use seen after the arena, less what was before */
    size_t dev_peak, dev_total;
    int64_t launches;         /* the last step's device launches: kernels and cuBLAS calls, the
                               * update's too (sbprt_ctx_launches; 0 on the cpu), -1: not counted */
    bool data_parallel;       /* under mpirun (also one rank through the collectives) */
    int ranks, zero;          /* data parallel: ranks and ZeRO stage */
    int seq_parallel;         /* ranks per row under mpirun (sbpc --seq-parallel; 0: none) */
    int64_t row_tokens;       /* tokens of each row (all its ranks' together) */
    int64_t global_rows;      /* rows of one micro-batch over all ranks */
    int64_t docs, rows, seq_len; /* packed documents trained on (rows == 0: not packed) */
    double pairs_packed, pairs_full; /* attention's query-key pairs, packed and unpacked */
    bool stopped;             /* by a signal: the checkpoint is the output, nothing was saved */
} train_report;

/* The outputs of a finished run (--save, --save-safetensors, --save-pretrained, --save-adapter;
 * one "out" line each) and its figures. Nothing is written after a signal's stop. */
int train_run_finish(train_run *r, train_report *rep);

#endif
