/* train_dist.h — data-parallel training for sbp-train under mpirun.
 *
 * `mpirun -np N sbp-train STEP.so ...` runs N ranks of the same compiled step (a cpu step: MPI
 * collectives work on host memory). Every rank reads the whole input files (or the same
 * --data batches), so every rank knows the whole batch; each one runs the step on its own rows
 * and the gradients are summed once per optimizer step, after all micro-batches:
 *
 * Rows. The files hold K micro-batches (--grad-accum K) of G global rows each. The step must be
 * compiled for B = ceil(G / N) rows (DPO: 2 * ceil(G/2 / N), whole pairs). In micro-batch k,
 * rank r takes global rows k*G + r*B .. k*G + r*B + B - 1; rows past G are padding (labels -100,
 * ids 0, advantages 0, nothing scored). DPO keeps pairs whole: global pair (row i, row K*G/2 + i)
 * of the files; in micro-batch k, rank r takes pairs k*G/2 + r*B/2 + j (j < B/2). With --data,
 * G = N*B: each micro-batch reads N*B rows from the shard (the same cursor on every rank) and
 * rank r keeps rows r*B .. r*B + B - 1, so N ranks train as one process on N*B rows would.
 *
 * Exactness. The denominator (scored tokens, GRPO rows, DPO pairs: ti_denominator) is the global
 * batch's, which every rank computes itself; each rank's loss and gradients are then its share
 * of the global mean, and their sums (MPI_Allreduce) are one process's values up to the order
 * of the additions. A padded DPO pair has logp 0 on both sides, so the step counts -log σ(0) =
 * ln 2 for it (with no gradient): that is subtracted from the rank's loss before the sum.
 *
 * ZeRO (--zero 1|2). The gradient block (grad_elems floats) is split into N contiguous slices;
 * rank r keeps AdamW's m and v for slice r only and updates the parameter elements whose
 * gradients lie in it (a slice may cut a parameter tensor: the update is elementwise, so each
 * tensor's part in the slice is updated on its own), then the updated values travel through the
 * gradient block (no longer needed after the update) in an MPI_Allgatherv and are copied back to
 * every parameter. --zero 2 also sums the gradients with MPI_Reduce_scatter (each rank receives
 * its slice only); the gradient norm for clipping is the sum of the slices' squared sums. The
 * step still writes a whole gradient block, so ZeRO 2 saves communication, not gradient memory.
 *
 * Checkpoints: rank 0 alone writes them, and a checkpoint holds the whole moments whatever
 * --zero (so resuming with another --zero is allowed). Under ZeRO no rank holds the whole
 * moments: when a checkpoint is due (a decision every rank makes alike, from the options and
 * the ranks' combined signal), each other rank sends its slices to rank 0, which writes them
 * into the file as they arrive, one slice at a time (train_dist_fill_state, through sbpio's
 * filled tensors); on --resume every rank reads its own slice of the file. Nothing moves in a
 * step without a checkpoint. The number of ranks is part of the run's identity ("ranks"):
 * another N is refused.
 *
 * Output: rank 0 prints; the other ranks print errors only, named "sbp-train: rank R". A rank
 * that fails calls MPI_Abort, which ends every rank (never a hang in a collective).
 *
 * Built only with MPI (SBP_WITH_MPI, set by CMake when find_package(MPI) finds it); without it
 * train_dist_init refuses to run under a launcher that started more than one rank.
 *
 * cuda steps (SBP_WITH_NCCL, when CMake also finds the CUDA toolkit and NCCL): each rank takes
 * the GPU of its rank on the node (it sets CUDA_VISIBLE_DEVICES before anything touches CUDA: the
 * local rank's entry of the list given, else the local rank itself), and the gradients are summed
 * in device memory by ncclAllReduce (NCCL's communicator set up over MPI); the loss, the
 * denominator and the rows are the host's as for cpu steps. ZeRO on the GPUs: NCCL has no
 * allgatherv / reducescatterv for slices of unequal sizes, so --zero 2's reduce-scatter is one
 * ncclReduce per rank (root r receives the sum of slice r, in place) and the parameters'
 * all-gather one ncclBroadcast per rank (root r sends its updated slice), each set inside one
 * ncclGroupStart / ncclGroupEnd; the slice copies between the parameter and gradient blocks are
 * device-to-device. Checkpoints under ZeRO move the moments through the host: each other rank
 * copies its slices to host memory and sends them; rank 0 copies its own from the device piece
 * by piece as the file is written. This path is built and
 * linked where NCCL is found but has not run on a GPU yet (tests/gpu/run.sh runs it there).
 *
 * One rank: a launcher's single rank normally runs as a plain process (no collective at all).
 * SBP_TRAIN_DIST_ONE_RANK=1 under a launcher (mpirun -np 1) makes it a data-parallel run of one
 * rank instead, so that the collectives' paths run on one machine with one device: MPI's on a
 * cpu step, NCCL's on a cuda step (tests/gpu/run.sh compares those losses with a plain run's).
 *
 * Agreement. Nothing above works unless every rank runs the same step on the same files with
 * the same options: a rank with another --steps leaves the others waiting in a collective after
 * it ends, another --zero makes the ranks call different collectives, another --data file makes
 * each rank train on rows of a different batch (exit 0, losses no single process gives). So
 * before anything depends on them, rank 0 broadcasts the run's digest (train_dist_digest: one
 * field per option that must agree, each a printable value and a 64-bit hash of the whole
 * value; a file's hash is of its size and bytes, FNV-1a-style, its path only printed) and
 * every rank compares it with its own field by field (train_dist_agree). The collectives'
 * sizes never depend on the digests (rank 0's size goes first), so a difference cannot hang
 * them; the lowest rank that differs names the first field that does, and the others wait for
 * its MPI_Abort.
 *
 * Other launchers: torchrun and similar set RANK / WORLD_SIZE but start no MPI job, so the
 * processes could not reach each other; WORLD_SIZE > 1 without an MPI launcher's environment is
 * refused (each process would train alone on the whole batch), naming mpirun.
 *
 * Signals: SIGINT / SIGTERM stop a run after its step's checkpoint (train_ckpt.h). Rank 0 writes
 * checkpoints, so a signal that reaches another rank only is handed to rank 0 after the step
 * (train_dist_max of the ranks' pending signals), which then stops as if it had received it,
 * and every rank stops with it.
 */
#ifndef SBP_TRAIN_DIST_H
#define SBP_TRAIN_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbp_step.h"
#include "train_inputs.h"
#include "train_sched.h"

typedef struct train_dist {
    bool on;            /* more than one rank, MPI initialised */
    bool mpi_inited;    /* MPI_Init was called (also for a launcher's single rank) */
    int rank, size;     /* this rank, N */
    int zero;           /* --zero 0|1|2 */
    int64_t B, G;       /* the step's rows; the global rows of one micro-batch */
    size_t grad_elems;  /* the gradient block's floats */
    size_t lo, hi;      /* this rank's slice of the gradient block [lo, hi) (ZeRO; else all) */
    int *counts, *displs; /* [size] every rank's slice, for the collectives */
    bool state_sliced;  /* ZeRO with AdamW and checkpoints: the moments go to rank 0 by slice
                         * when a checkpoint is due */
    const float *state_m, *state_v; /* this rank's moment slices [hi - lo] (backend memory) */
    float *recv;        /* rank 0: [the largest other slice] the slice being written, else NULL */
    int recv_rank, recv_which; /* whose slice recv holds (-1: none) and which moment (0 m, 1 v) */
    char prog[48];      /* "sbp-train: rank R", or "sbp-train" */
    int local_rank;     /* the rank among those on this node (cuda steps: its GPU) */
    void *nccl;         /* ncclComm_t once train_dist_nccl_start ran (cuda steps), else NULL */
    float *host_slice;  /* cuda steps under ZeRO with checkpoints, ranks but 0: [2 * (hi - lo)]
                         * this rank's moments on the host, to send (else NULL) */
    /* Sequence parallelism (a step compiled with sbpc --seq-parallel N): world rank w is
     * sequence rank w % N of data group w / N. Rows are the data groups' (groups, group play
     * the part size, rank play in plain data parallelism); within a group each rank holds
     * T/N consecutive tokens of every row, and the step exchanges heads over the group's
     * communicator. Without it sp = 1, groups = size, group = rank. */
    int sp, sp_rank;    /* N, and this rank's place in its group (which tokens it holds) */
    int groups, group;  /* D = size / N data groups, and this rank's */
    void *sp_mpi;       /* the group's MPI_Comm (malloc'd), or NULL */
    void *sp_nccl;      /* cuda steps: the group's ncclComm_t, or NULL */
} train_dist;

/* Before the command line: when launched by mpirun (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
 * PMIX_RANK in the environment) initialises MPI and learns the rank and size; a plain run
 * never touches MPI. Returns -1 with err when the launcher started several ranks of a build
 * without MPI, or when WORLD_SIZE > 1 says another launcher (torchrun) started this process. */
int train_dist_init(train_dist *d, int *argc, char ***argv, char *err, size_t errlen);
/* Ends MPI normally (rc 0) or aborts every rank (rc != 0). */
void train_dist_end(train_dist *d, int rc);
/* The --zero option's usage text (ends in a newline). */
const char *train_dist_usage(void);

/* Sequence parallelism: the step's N (its info->seq_parallel) against --seq-parallel (0: not
 * given) and the launch (size a multiple of N; N > 1 needs mpirun), then the groups and the
 * group's MPI communicator. Every run calls it (N = 1 sets groups = size). Collective. */
int train_dist_seq_start(train_dist *d, int step_n, int flag_n, char *err, size_t errlen);
/* The group's NCCL communicator, for a cuda step (after train_dist_nccl_start). */
int train_dist_seq_nccl(train_dist *d, char *err, size_t errlen);
/* The communicator a sequence-parallel step's context carries (runtime/sbprt.h, sbprt_comm):
 * MPI_Alltoall over the group for a cpu step, NCCL's sends and receives for a cuda one. */
void train_dist_seq_comm(train_dist *d, bool cuda, sbprt_comm *c);
/* Sums x[0..n) over the ranks of this rank's group (a step's partial sums of its tokens). */
int train_dist_seq_sum(const train_dist *d, double *x, int n, char *err, size_t errlen);

/* The global rows G of one micro-batch and the check of the step's B against them: `rows_all`
 * is the files' row count (K*G), or -1 for --data (G = N*B). */
int train_dist_plan_rows(train_dist *d, const sbp_step_info *in, int64_t rows_all, int64_t k,
                         bool dpo, char *err, size_t errlen);
/* The slices of the gradient block (ZeRO) and the optimizer state's floats on this rank. */
int train_dist_plan_slices(train_dist *d, const sbp_step_info *in, char *err, size_t errlen);
size_t train_dist_state_elems(const train_dist *d);

/* This rank's micro-batch k of the global batch (ti: the global batch's inputs, ids and labels
 * [K*G*T]) into ti->mb_*, in the step's row order; returns the padded DPO pairs. */
int64_t train_dist_micro(const train_dist *d, train_inputs *ti, const int32_t *ids,
                         const int32_t *labels, int64_t k);
/* The same rows' document ids (a packed step): out [B*T] from the global batch's doc_ids
 * [K*G*T]; a padding row is one document (id 0), as its labels score nothing. */
void train_dist_micro_docs(const train_dist *d, const train_inputs *ti, const int32_t *doc_ids,
                           int32_t *out, int64_t k);

/* After the K micro-batches: the loss summed over the ranks and the gradients summed (ZeRO 2:
 * this rank's slice only, unless `full`). Returns 0 or -1 with err. */
int train_dist_reduce(train_dist *d, float *grads, double *loss, bool full, char *err,
                      size_t errlen);
/* x[0 .. n) summed over the ranks, in place (host memory; DPO's reward sums). 0, or -1 with
 * err. */
int train_dist_sum(const train_dist *d, double *x, int n, char *err, size_t errlen);
/* Every rank's x[n] bitwise OR-ed into every rank's: where each element was written by one
 * rank and left 0 by all others, every rank gets exactly that rank's bits (floats as well,
 * -0.0 included, which a floating-point sum would not promise). */
int train_dist_share_bits(const train_dist *d, uint32_t *x, size_t n, char *err, size_t errlen);
/* The part [*from, *from + *n) of parameter p (elements) this rank updates; 0 when none. */
bool train_dist_owned(const train_dist *d, const sbp_step_param *p, size_t *from, size_t *n);
/* The gradient norm (and clipping, when max_norm > 0) over this rank's slices, summed over the
 * ranks (ZeRO 1/2); train_clip_grads's contract. */
int train_dist_clip(const train_dist *d, const train_grad_rt *rt, const sbp_step_info *in,
                    float *grads, double max_norm, double *norm, double *coef);
/* After the sliced update: every rank's updated parameters to every rank (the gradient block
 * is the transfer buffer). */
int train_dist_gather_params(train_dist *d, const sbp_step_info *in, float *params,
                             float *grads, char *err, size_t errlen);
/* ZeRO with checkpoints, rank 0 (sbpio's fill for the checkpoint's moments, through train_ckpt):
 * elements [first, first + n) of the whole moment `which` (0: m, 1: v) into host memory dst, from
 * this rank's slice or from the slice its owner sends (train_dist_send_state). Called in order,
 * m then v, from element 0; each other rank's slice is received once into d->recv. */
int train_dist_fill_state(void *d, int which, size_t first, float *dst, size_t n, char *err,
                          size_t errlen);
/* ZeRO with checkpoints, every rank but 0, after a step whose checkpoint is due: this rank's m
 * slice, then its v slice, to rank 0. */
int train_dist_send_state(train_dist *d, char *err, size_t errlen);
/* Tests only: SBP_TEST_FAIL_RANK=R makes rank R fail at optimizer step 2. */
bool train_dist_injected_failure(const train_dist *d, int64_t s);
/* cuda steps: true when this build sums device memory with NCCL; train_dist_nccl_start makes the
 * communicator (after the step's runtime context exists, on this rank's GPU). */
bool train_dist_have_nccl(void);
int train_dist_nccl_start(train_dist *d, char *err, size_t errlen);
/* The run's identity that every rank must share (see Agreement above). Fixed-size, so that it
 * travels as bytes; a field's value may be cut short for printing, its hash never is. */
enum { TRAIN_DIST_FIELDS = 64, TRAIN_DIST_NAME = 32, TRAIN_DIST_VALUE = 224 };
typedef struct train_dist_field {
    char name[TRAIN_DIST_NAME];   /* "--steps", "the step library" */
    char value[TRAIN_DIST_VALUE]; /* "5", "PATH (N bytes, content H)", "not given" */
    uint64_t hash;                /* FNV-1a of the whole value; a file's of its size and bytes */
    int32_t file;                 /* 1: compared by content (the path is only printed) */
    int32_t pad;                  /* zero: the bytes travel as they are */
} train_dist_field;
typedef struct train_dist_digest {
    int32_t n;                    /* fields in use */
    int32_t overflow;             /* more were added than fit (a programming error) */
    train_dist_field f[TRAIN_DIST_FIELDS];
} train_dist_digest;

/* An empty digest (every byte zero); its first field is this sbp-train's version. */
void train_dist_digest_init(train_dist_digest *g);
/* One field each: an integer, a real (printed so that it reads back exactly), a string or NULL
 * ("not given"), and a file by content (NULL: "not given"; one that cannot be read is its
 * error's text, for its reader to report later). */
void train_dist_digest_int(train_dist_digest *g, const char *name, int64_t v);
void train_dist_digest_real(train_dist_digest *g, const char *name, double v);
void train_dist_digest_str(train_dist_digest *g, const char *name, const char *s);
void train_dist_digest_file(train_dist_digest *g, const char *name, const char *path);
/* Every rank's digest against rank 0's, before anything that depends on the options (a
 * collective included). 0 when all agree (or not distributed). Otherwise -1 on the lowest rank
 * that differs, err = "NAME is X here but Y on rank 0: ..." (the caller prints it and aborts
 * the job, train_dist_end); the other ranks do not return: they wait for that abort. */
int train_dist_agree(train_dist *d, const train_dist_digest *g, char *err, size_t errlen);

/* Waits for every rank (rank 0 prepares shared folders before the others look at them). */
void train_dist_barrier(const train_dist *d);
/* Every rank stops when one of them was asked to (a signal): MAX over the ranks. */
bool train_dist_any(const train_dist *d, bool mine);
/* The largest of the ranks' values (a pending signal's number, 0 when none). */
int train_dist_max(const train_dist *d, int mine);

#endif
