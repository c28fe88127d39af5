/* train_ckpt.h — sbp-train's checkpoints and resume.
 *
 * A checkpoint is one safetensors file DIR/step-NNNNNNNN.safetensors (N = the optimizer steps
 * done; exactly 8 digits, zero-padded, and past 99999999 N's own digits: any other name, such
 * as step-5.safetensors, is not a checkpoint, never read and never pruned), written by sbpio's
 * atomic writer: a temporary beside it, fsync, rename, then an fsync of the directory. The
 * previous checkpoint is never touched before the new one is complete, so a crash, kill -9 or
 * full disk in the middle of a write leaves it as the newest complete one; the oldest are
 * removed only after a write succeeded, keeping --keep-checkpoints K.
 *   tensors:  "params" F32 [param_elems]: the parameter block as the step lays it out;
 *             "adamw.m", "adamw.v" F32 [grad_elems]: AdamW's moments (absent for SGD), laid out
 *             as the gradient block (the trained parameters only).
 *   metadata: the step count (AdamW's bias correction uses it too), the data cursor (--data:
 *             the shard position and pass; --input-ids: the step is the cursor), the schedule
 *             flags of the run (--lr, --lr-schedule, ...: recorded, a change is only a note), and
 *             the identity of the run: the step's parameter table (names, shapes, offsets, ties,
 *             trainable), the ranks (mpirun -np) and the ranks per row (sbpc --seq-parallel), B, T
 *             (the whole rows), V, objective, optimizer, --grad-accum, a hash of the model's
 *             initial weights and of the training data, and its packing into documents
 *             ("packing"; a packed run's cursor is the shard position too, train_pack.h). On
 *             resume the identity must match field by field, else the run is refused with one
 *             line naming the field: resuming into another model, step or optimizer would
 *             silently be a different run. Version 2 added "packing"; a version-1 checkpoint
 *             (from before packing) still loads, as an unpacked run's.
 * Nothing non-finite is written: the weights (after the copy back from a device), m and v (as
 * they arrive, under ZeRO) must be finite and v >= 0, else the write fails naming the tensor
 * and leaves no file (the previous checkpoint stays the newest).
 * Nothing written depends on the time, the process or the path, so two runs that reach the same
 * step write byte-identical checkpoints (the tests compare them with cmp).
 *
 * Resume (--resume DIR) takes the newest step-*.safetensors that opens and validates; a broken
 * newer one is skipped with a note. Its values are then held to what a run writes, each failure
 * one line naming the file and the key or tensor, before step 1: every integer of the metadata
 * whole and in range (step as in the name, adamw_step = step, data_pos inside the shard,
 * data_epoch >= 0 and far from overflowing, threads >= 1, ...), the schedule's numbers finite,
 * and the parameters and moments finite with v >= 0 (under ZeRO, the slice this rank reads).
 * Temporaries left by a killed writer (".step-...tmp.PID.N") are removed when their process is
 * gone.
 *
 * Signals: with checkpoints on, SIGINT and SIGTERM (unless ignored) set a flag; the run writes a
 * checkpoint at the end of the current step and exits 0. ir/files.c's temporary registry is
 * installed first and its handler kept as the "previous" one: a second signal restores it and
 * re-raises, so a signal that kills the run in the middle of a write still removes the temporary.
 *
 * Functions return 0, or -1 with one line in err; notes go through the caller's `note`.
 */
#ifndef SBP_TRAIN_CKPT_H
#define SBP_TRAIN_CKPT_H

#include <stdbool.h>
#include "train_opt.h"
#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "sbp_step.h"
#include "train_say.h"
#include "sbpio.h"
#include "train_dataset.h"
#include "sbprt.h"
#include "train_sched.h"

/* The command line (train_config, sbptrain.h, holds one of these). */
typedef struct train_ckpt_opts {
    const char *dir;    /* --checkpoint-dir DIR, or NULL (then --resume's DIR, if any) */
    int64_t every;      /* --checkpoint-every N; 0: only at the end of the run and on a signal */
    int64_t keep;       /* --keep-checkpoints K >= 1 (default 2) */
    const char *resume; /* --resume DIR, or NULL */
} train_ckpt_opts;

/* The options (train_opt.h): --checkpoint-dir, --checkpoint-every, --keep-checkpoints,
 * --resume; the parser answers 0, -1 after cli's message, or TRAIN_OPT_NOT_MINE. */
extern const struct option train_ckpt_options[];
int train_ckpt_parse(train_ckpt_opts *o, cli *c, const char *v);
/* The usage text of the options (ends in a newline). */
const char *train_ckpt_usage(void);

/* What a checkpoint is taken of: the run's step, options and memory (filled by sbp-train after
 * its arena is allocated and the model's weights are in host_params). */
typedef struct train_ckpt_run {
    const sbp_step_info *in;
    const char *step_path;     /* for messages */
    bool adamw;                /* else sgd: no optimizer state */
    int64_t grad_accum;        /* --grad-accum */
    int64_t total_steps;       /* --steps */
    double lr, weight_decay;   /* --lr, --weight-decay */
    const train_sched_opts *sched; /* --lr-schedule and friends, or NULL */
    bool dump_grads;           /* --dump-grads given: only meaningful from step 1 */
    sbpio_shard *shard;        /* --data, or NULL (--input-ids: the step is the cursor) */
    train_dataset *dataset;    /* --dataset, or NULL: its cursor (pass, example) is kept as
                                * data_epoch / data_pos, and its identity is the file's hash
                                * with the shuffle and the packing */
    const int32_t *ids, *labels; /* [ntok_all] --input-ids / --labels, hashed as the data's id */
    const char *packing;       /* how the data is packed, part of the run's identity:
                                * "eos ID" (--pack), "doc-ids HASH" (--doc-ids); NULL: "none".
                                * Copied by train_ckpt_start. */
    size_t ntok_all;
    size_t pbytes;             /* param_elems floats */
    size_t gbytes;             /* grad_elems floats: AdamW's m and v each */
    float *d_params, *d_m, *d_v; /* backend memory [param_elems], [grad_elems] x 2 (adamw) */
    float *host_params;        /* host [param_elems]: the model's initial weights at start;
                                * the same as d_params when host_visible */
    bool host_visible;         /* the backend's memory is the host's */
    /* ZeRO: d_m, d_v hold only elements [state_lo, state_lo + state_n) of the
     * moments; a resume reads that slice of the checkpoint's, and a checkpoint's whole moments
     * come from state_fill (rank 0's train_dist_fill_state: called in order, m then v, for
     * consecutive element ranges). state_fill NULL: d_m, d_v are the whole moments. */
    size_t state_lo, state_n;
    int (*state_fill)(void *arg, int which, size_t first, float *dst, size_t n, char *err,
                      size_t errlen);
    void *state_arg;
    int (*copy)(sbprt_ctx *, void *, const void *, size_t, int); /* sbprt_memcpy */
    sbprt_ctx *copy_ctx;
    const train_sink *note; /* where its notes go (train_say.h) */
    int ranks;                 /* mpirun's ranks (0 or 1: one process), part of the
                                * identity ("ranks"; a checkpoint without it: 1) */
    int seq_parallel;          /* ranks per row (sbpc --seq-parallel N; 0 or 1: whole rows),
                                * part of the identity ("seq_parallel"; absent: 1) */
    int threads;               /* a cpu step's threads (0: another target, or unknown); kept as
                                * "threads", and a resume with another count is told that it is
                                * exact but not bit for bit the uninterrupted run */
} train_ckpt_run;

/* The state of one run (train_run.c's run holds one). Zero-initialised = checkpoints off. */
typedef struct train_ckpt {
    const train_ckpt_opts *o;
    const char *dir;         /* where checkpoints go (o->dir or o->resume), or NULL: off */
    train_ckpt_run r;        /* set by train_ckpt_start */
    sbpio_st_file *from;     /* the checkpoint resumed from, until restored */
    char *from_path;         /* its path (malloc'd) */
    int64_t start;           /* optimizer steps already done (0: from the model) */
    uint64_t model_hash;     /* FNV-1a of the model's initial parameter block */
    uint64_t data_hash;      /* FNV-1a of --input-ids and --labels, or of the shard's tokens */
    float *host_m, *host_v;  /* host copies for a device backend (malloc'd), else NULL */
    int64_t last_written;    /* step of the newest checkpoint this run wrote, 0 if none */
    bool stopped;            /* a signal stopped the run (after its checkpoint) */
    char packing[64];        /* r.packing's copy ("none" when not packed) */
} train_ckpt;

/* Before any work (run_load): checks the options, creates DIR (one level) and proves it
 * writable by creating and removing a file, removes dead writers' temporaries, installs the
 * signal handlers, and with --resume opens the newest complete checkpoint. */
int train_ckpt_prepare(train_ckpt *c, const train_ckpt_opts *o, const train_sink *note, char *err,
                       size_t errlen);
/* After the arena holds the model's weights and zeroed moments (run_allocate): records the run,
 * hashes the initial weights and, when resuming, checks the identity and overwrites the
 * parameters, moments and data cursor with the checkpoint's. */
int train_ckpt_start(train_ckpt *c, const train_ckpt_run *r, char *err, size_t errlen);
/* The first optimizer step to run: 1, or the checkpoint's step + 1. */
int64_t train_ckpt_first_step(const train_ckpt *c);
/* After optimizer step s: writes a checkpoint when s is a multiple of --checkpoint-every, the
 * last step, or sig (the SIGINT/SIGTERM this run acts on, train_ckpt_stop_signal or the ranks'
 * combined one) is set; then c->stopped is set and the loop must end. */
int train_ckpt_after_step(train_ckpt *c, int64_t s, int sig, char *err, size_t errlen);
/* Whether a checkpoint is due after step s of `total` given the stop signal sig (0: none); every
 * rank of a data-parallel run decides alike from the ranks' combined signal. False when
 * checkpoints are off. */
bool train_ckpt_due(const train_ckpt_opts *o, int64_t s, int64_t total, int sig);
void train_ckpt_free(train_ckpt *c);
/* The SIGINT / SIGTERM this process received (0: none), and a signal another rank
 * received, acted on here as if it had arrived here (nothing when one already did). */
int train_ckpt_stop_signal(void);
void train_ckpt_request_stop(int sig);

#endif
