/* train_dist.c — sbp-train's data parallelism over MPI (train_dist.h says what is
 * split and why the sums are exact). All collectives are Open MPI's on host memory, in place
 * where MPI allows it, so a rank holds no second copy of the gradient block; a cuda step's
 * gradients and parameters are NCCL's, on the device (SBP_WITH_NCCL). Without MPI
 * (SBP_WITH_MPI undefined) only the single-rank paths remain: the slices are the whole block
 * and every collective is the identity. The ranks' agreement on the run (train_dist_agree)
 * comes first of all, before any collective whose shape depends on the options.
 */
#include "cli.h"
#include "files.h"
#include "train_dist.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef SBP_WITH_MPI
#include <mpi.h>
#endif
#ifdef SBP_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#ifdef SBP_WITH_MPI
static int mpi_fail(char *err, size_t errlen, const char *what, int code);
#endif

/* The launcher's own count of ranks, or NULL when not launched by one. Open MPI's mpirun sets
 * OMPI_COMM_WORLD_SIZE; PMI/PMIx launchers (srun, hydra) set PMI_SIZE or PMIX_RANK. */
static const char *launcher_size(void)
{
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (!s)
        s = getenv("PMI_SIZE");
    if (!s && getenv("PMIX_RANK"))
        s = "?";
    return s;
}

const char *train_dist_usage(void)
{
    return "data parallel (mpirun -np N sbp-train ...; the step compiled for ceil(G/N) rows\n"
           "of the G rows of each micro-batch; rank 0 prints and writes):\n"
           "  --zero 0|1|2            0: every rank keeps the whole optimizer state (default);\n"
           "                          1: AdamW's m and v split over the ranks; 2: the\n"
           "                          gradients reduce-scattered too\n"
           "sequence parallel (a step compiled with sbpc --seq-parallel N; mpirun -np D*N:\n"
           "D data groups of N ranks, each rank T/N tokens of every row of its group):\n"
           "  --seq-parallel N        the step's N, checked (by default the step's own)\n"
           "  (SBP_TRAIN_DIST_ONE_RANK=1 with mpirun -np 1: one rank through the collectives,\n"
           "  NCCL's for a cuda step; WORLD_SIZE > 1 without mpirun is refused)\n";
}

int train_dist_init(train_dist *d, int *argc, char ***argv, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->size = d->groups = d->sp = 1;
    snprintf(d->prog, sizeof d->prog, "sbp-train");
    const char *n = launcher_size();
    if (!n) {
        /* torchrun (and torch.distributed's other launchers) start N processes with RANK and
         * WORLD_SIZE but no MPI job: MPI_Init would make N worlds of one rank each, every one
         * training alone on the whole batch. Refused rather than done N times over. */
        const char *ws = getenv("WORLD_SIZE");
        if (ws && strtol(ws, NULL, 10) > 1)
            return cli_errf(err, errlen,
                            "WORLD_SIZE=%s is set (a torchrun-style launcher), but no MPI launcher "
                            "started this process: sbp-train's ranks are an MPI job's, and "
                            "alone each process would train on the whole batch; launch it with "
                            "mpirun -np %s sbp-train ... (or srun with PMI/PMIx)", ws, ws);
        return 0; /* a plain run: MPI is never touched */
    }
#ifdef SBP_WITH_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        return cli_errf(err, errlen, "MPI_Init failed (launched with %s ranks)", n);
    d->mpi_inited = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d->size);
    /* errors of collectives come back as codes; a rank that fails then aborts the job */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* SBP_TRAIN_DIST_ONE_RANK=1 (train_dist.h): one rank still runs the collectives' paths */
    const char *one = getenv("SBP_TRAIN_DIST_ONE_RANK");
    d->on = d->size > 1 || (one && strcmp(one, "1") == 0);
    if (d->on)
        snprintf(d->prog, sizeof d->prog, "sbp-train: rank %d", d->rank);
    /* the rank on this node: its GPU for a cuda step, chosen before anything touches CUDA
     * (the driver reads CUDA_VISIBLE_DEVICES once, at its initialisation) */
    MPI_Comm node;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL,
                            &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &d->local_rank);
        MPI_Comm_free(&node);
    }
#ifdef SBP_WITH_NCCL
    if (d->on) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        char pick[64] = "";
        if (vis && *vis) { /* the local rank's entry of the list, cyclically */
            int n = 1;
            for (const char *p = vis; *p; p++)
                n += *p == ',';
            const char *p = vis;
            for (int i = d->local_rank % n; i > 0; i--)
                p = strchr(p, ',') + 1;
            size_t len = strcspn(p, ",");
            snprintf(pick, sizeof pick, "%.*s", (int)(len < sizeof pick ? len : sizeof pick - 1),
                     p);
        } else {
            snprintf(pick, sizeof pick, "%d", d->local_rank);
        }
        setenv("CUDA_VISIBLE_DEVICES", pick, 1);
    }
#endif
    return 0;
#else
    (void)argc;
    (void)argv;
    if (strcmp(n, "1") == 0)
        return 0; /* one rank: the same as a plain run */
    return cli_errf(err, errlen,
                    "started by an MPI launcher (%s ranks), but this sbp-train was built without "
                    "MPI: each rank would train alone on the whole batch; install Open MPI "
                    "(openmpi-bin, libopenmpi-dev) and rebuild, or run sbp-train without "
                    "mpirun", n);
#endif
}

bool train_dist_have_nccl(void)
{
#ifdef SBP_WITH_NCCL
    return true;
#else
    return false;
#endif
}

int train_dist_nccl_start(train_dist *d, char *err, size_t errlen)
{
#ifdef SBP_WITH_NCCL
    ncclUniqueId id;
    ncclResult_t nr = ncclSuccess;
    if (d->rank == 0)
        nr = ncclGetUniqueId(&id);
    int ok = nr == ncclSuccess; /* every rank learns whether rank 0 has an id */
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok)
        return cli_errf(err, errlen, "NCCL: rank 0 could not make a unique id: %s",
                        ncclGetErrorString(nr));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t comm;
    if ((nr = ncclCommInitRank(&comm, d->size, id, d->rank)) != ncclSuccess)
        return cli_errf(err, errlen, "NCCL: ncclCommInitRank failed on GPU %s: %s",
                        getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "?",
                        ncclGetErrorString(nr));
    d->nccl = comm;
    return 0;
#else
    (void)d;
    return cli_errf(err, errlen, "this sbp-train was built without NCCL: cuda steps do not run "
                    "under mpirun (build where the CUDA toolkit's NCCL is found)");
#endif
}

/* ------------------------------------------------------------------ sequence parallelism */

int train_dist_seq_start(train_dist *d, int step_n, int flag_n, char *err, size_t errlen)
{
    d->sp = 1;
    d->sp_rank = 0;
    d->groups = d->size;
    d->group = d->rank;
    if (flag_n > 0 && step_n < 1)
        return cli_errf(err, errlen, "--seq-parallel %d, but the step is not sequence-parallel: "
                        "compile it with sbpc --seq-parallel %d", flag_n, flag_n);
    if (flag_n > 0 && flag_n != step_n)
        return cli_errf(err, errlen, "--seq-parallel %d, but the step was compiled for %d "
                        "ranks per row (sbpc --seq-parallel %d): recompile it, or drop the "
                        "flag", flag_n, step_n, step_n);
    if (step_n < 1 || (step_n == 1 && !d->on))
        return 0; /* ordinary, or one rank alone: its exchanges are local copies */
    if (!d->on || d->size < step_n)
        return cli_errf(err, errlen, "the step was compiled for %d ranks per row (sbpc "
                        "--seq-parallel %d): run it as mpirun -np %d sbp-train ... (or a "
                        "multiple of %d: data groups of %d)", step_n, step_n, step_n, step_n,
                        step_n);
    if (d->size % step_n)
        return cli_errf(err, errlen, "mpirun -np %d: the step was compiled for %d ranks per row "
                        "(sbpc --seq-parallel %d), and %d ranks are not whole groups of %d: use "
                        "-np %d or %d", d->size, step_n, step_n, d->size, step_n,
                        d->size / step_n * step_n > 0 ? d->size / step_n * step_n : step_n,
                        (d->size / step_n + 1) * step_n);
#ifdef SBP_WITH_MPI
    d->sp = step_n;
    d->sp_rank = d->rank % step_n;
    d->groups = d->size / step_n;
    d->group = d->rank / step_n;
    MPI_Comm *c = malloc(sizeof *c);
    if (!c)
        return cli_errf(err, errlen, "out of memory");
    int st = MPI_Comm_split(MPI_COMM_WORLD, d->group, d->sp_rank, c);
    if (st != MPI_SUCCESS) {
        free(c);
        return mpi_fail(err, errlen, "MPI_Comm_split into the sequence groups", st);
    }
    MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
    d->sp_mpi = c;
    return 0;
#else
    return cli_errf(err, errlen, "built without MPI");
#endif
}

#ifdef SBP_WITH_MPI
/* MPI_Alltoall of `bytes` per rank, which may pass MPI's int counts: below 2^20 bytes plain
 * MPI_BYTEs; a multiple of 2^20, that many contiguous 2^20-byte units; otherwise one struct type
 * of the units and the rest, whose extent is the whole block (so block i sits at i * bytes). */
static int seq_mpi_alltoall(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    (void)stream;
    const train_dist *d = user;
    MPI_Comm comm = *(MPI_Comm *)d->sp_mpi;
    const size_t unit = (size_t)1 << 20, big = bytes / unit, rest = bytes % unit;
    if (big > (size_t)0x7fffffff)
        return 1;
    if (big && !rest) {
        MPI_Datatype t;
        if (MPI_Type_contiguous((int)unit, MPI_BYTE, &t) != MPI_SUCCESS ||
            MPI_Type_commit(&t) != MPI_SUCCESS)
            return 1;
        int st = MPI_Alltoall(send, (int)big, t, recv, (int)big, t, comm);
        MPI_Type_free(&t);
        return st != MPI_SUCCESS;
    }
    if (!big)
        return MPI_Alltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm) !=
               MPI_SUCCESS;
    /* a size that is neither: one type of the whole block */
    MPI_Datatype t;
    if (bytes > (size_t)0x7fffffff * unit)
        return 1;
    MPI_Datatype u;
    if (MPI_Type_contiguous((int)unit, MPI_BYTE, &u) != MPI_SUCCESS)
        return 1;
    int blens[2] = {(int)big, (int)rest};
    MPI_Aint disp[2] = {0, (MPI_Aint)(big * unit)};
    MPI_Datatype types[2] = {u, MPI_BYTE};
    int st = MPI_Type_create_struct(2, blens, disp, types, &t);
    MPI_Type_free(&u);
    if (st != MPI_SUCCESS || MPI_Type_commit(&t) != MPI_SUCCESS)
        return 1;
    st = MPI_Alltoall(send, 1, t, recv, 1, t, comm);
    MPI_Type_free(&t);
    return st != MPI_SUCCESS;
}
#endif

#ifdef SBP_WITH_NCCL
/* ncclSend / ncclRecv of one block to and from every rank of the group, queued on the step's
 * stream (stream_ordered): NCCL has no all-to-all of its own. */
static int seq_nccl_alltoall(void *user, const void *send, void *recv, size_t bytes, void *stream)
{
    const train_dist *d = user;
    ncclComm_t comm = (ncclComm_t)d->sp_nccl;
    cudaStream_t st = (cudaStream_t)stream;
    if (ncclGroupStart() != ncclSuccess)
        return 1;
    int bad = 0;
    for (int r = 0; r < d->sp && !bad; r++) {
        bad |= ncclSend((const char *)send + (size_t)r * bytes, bytes, ncclChar, r, comm, st) !=
               ncclSuccess;
        bad |= ncclRecv((char *)recv + (size_t)r * bytes, bytes, ncclChar, r, comm, st) !=
               ncclSuccess;
    }
    return (ncclGroupEnd() != ncclSuccess) | bad;
}
#endif

int train_dist_seq_nccl(train_dist *d, char *err, size_t errlen)
{
    if (!d->sp_mpi)
        return 0;
#ifdef SBP_WITH_NCCL
    ncclComm_t c;
    ncclResult_t nr = ncclCommSplit((ncclComm_t)d->nccl, d->group, d->sp_rank, &c, NULL);
    if (nr != ncclSuccess)
        return cli_errf(err, errlen, "NCCL: ncclCommSplit into the sequence groups failed: %s",
                        ncclGetErrorString(nr));
    d->sp_nccl = c;
    return 0;
#else
    return cli_errf(err, errlen, "this sbp-train was built without NCCL");
#endif
}

void train_dist_seq_comm(train_dist *d, bool cuda, sbprt_comm *c)
{
    memset(c, 0, sizeof *c);
    c->rank = d->sp_rank;
    c->size = d->sp;
    c->user = d;
#ifdef SBP_WITH_NCCL
    if (cuda && d->sp_nccl) {
        c->alltoall = seq_nccl_alltoall;
        c->stream_ordered = 1;
        return;
    }
#endif
    (void)cuda;
#ifdef SBP_WITH_MPI
    c->alltoall = seq_mpi_alltoall;
#endif
}

int train_dist_seq_sum(const train_dist *d, double *x, int n, char *err, size_t errlen)
{
    if (!d->sp_mpi)
        return 0;
#ifdef SBP_WITH_MPI
    int st = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, *(MPI_Comm *)d->sp_mpi);
    return st == MPI_SUCCESS ? 0 : mpi_fail(err, errlen, "MPI_Allreduce over the group", st);
#else
    (void)x, (void)n;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

void train_dist_end(train_dist *d, int rc)
{
#ifdef SBP_WITH_NCCL
    if (d->sp_nccl && rc == 0)
        ncclCommDestroy((ncclComm_t)d->sp_nccl);
    d->sp_nccl = NULL;
    if (d->nccl && rc == 0)
        ncclCommDestroy((ncclComm_t)d->nccl);
    d->nccl = NULL;
#endif
#ifdef SBP_WITH_MPI
    if (d->sp_mpi && rc == 0)
        MPI_Comm_free((MPI_Comm *)d->sp_mpi);
#endif
    free(d->sp_mpi);
    d->sp_mpi = NULL;
    free(d->counts);
    free(d->displs);
    free(d->recv);
    free(d->host_slice);
    d->host_slice = d->recv = NULL;
    d->counts = d->displs = NULL;
#ifdef SBP_WITH_MPI
    if (d->mpi_inited) {
        if (rc && d->size > 1) {
            fprintf(stderr, "%s: aborting the job (every rank)\n", d->prog);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, rc); /* never returns */
        }
        MPI_Finalize();
    }
#else
    (void)rc;
#endif
    d->mpi_inited = d->on = false;
}

int train_dist_plan_rows(train_dist *d, const sbp_step_info *in, int64_t rows_all, int64_t k,
                         bool dpo, char *err, size_t errlen)
{
    /* the data groups share the rows (each group's N sequence ranks hold the same rows) */
    const int64_t N = d->groups, B = in->batch;
    d->B = B;
    if (rows_all < 0) { /* --data: each micro-batch is N*B rows of the shard */
        d->G = N * B;
        return 0;
    }
    if (rows_all % k != 0)
        return cli_errf(err, errlen,
                        "the input files hold %lld rows, not a multiple of --grad-accum "
                        "%lld", (long long)rows_all, (long long)k);
    const int64_t G = d->G = rows_all / k;
    if (dpo && G % 2 != 0) /* a micro-batch's pairs are whole in the files' pairing too */
        return cli_errf(err, errlen,
                        "the global batch has %lld rows per micro-batch, an odd number: "
                        "the step's objective is dpo, whose micro-batches hold whole pairs",
                        (long long)G);
    /* DPO: whole pairs per rank, so B is twice the pairs of one rank */
    const int64_t want = dpo ? 2 * ((G / 2 + N - 1) / N) : (G + N - 1) / N;
    if (B != want)
        return cli_errf(err, errlen, "the global batch has %lld rows per micro-batch (%lld rows%s) "
                        "over %lld ranks, which needs a step compiled for %lld rows per rank%s, "
                        "but the step was compiled for batch %lld: recompile it with sbpc --batch "
                        "%lld",
                        (long long)G, (long long)rows_all,
                        k > 1 ? " / --grad-accum" : "", (long long)N, (long long)want,
                        dpo ? " (2 x ceil(pairs / ranks): DPO pairs stay on one rank)"
                        : " (ceil(rows / ranks))",
                        (long long)B, (long long)want);
    return 0;
}

int train_dist_plan_slices(train_dist *d, const sbp_step_info *in, char *err, size_t errlen)
{
    const size_t E = d->grad_elems = in->grad_elems;
    const int N = d->size;
    d->lo = 0;
    d->hi = E;
    if (!d->on)
        return 0;
    if (E > (size_t)0x7fffffff)
        return cli_errf(err, errlen, "the gradient block holds %zu floats, more than MPI's int "
                        "counts reach", E);
    d->counts = calloc((size_t)N, sizeof *d->counts);
    d->displs = calloc((size_t)N, sizeof *d->displs);
    if (!d->counts || !d->displs)
        return cli_errf(err, errlen, "out of memory");
    for (int r = 0; r < N; r++) { /* contiguous, sizes differing by at most one */
        size_t a = E * (size_t)r / (size_t)N, b = E * (size_t)(r + 1) / (size_t)N;
        d->displs[r] = (int)a;
        d->counts[r] = (int)(b - a);
    }
    if (d->zero > 0) {
        d->lo = (size_t)d->displs[d->rank];
        d->hi = d->lo + (size_t)d->counts[d->rank];
    }
    return 0;
}

size_t train_dist_state_elems(const train_dist *d) { return d->hi - d->lo; }

/* The global batch's row that this rank's (data group's) row j of micro-batch k holds, or -1:
 * padding. */
static int64_t global_row(const train_dist *d, const train_inputs *ti, int64_t j, int64_t k)
{
    const int64_t B = d->B, G = d->G, h = B / 2, P = G / 2, r = d->group;
    if (!ti->dpo)
        return r * B + j < G ? k * G + r * B + j : -1;
    const int64_t q = r * h + (j < h ? j : j - h); /* the pair in micro-batch k */
    if (q >= P)
        return -1;
    return j < h ? k * P + q : ti->N / 2 + k * P + q;
}

int64_t train_dist_micro(const train_dist *d, train_inputs *ti, const int32_t *ids,
                         const int32_t *labels, int64_t k)
{
    int64_t pad_pairs = 0;
    for (int64_t j = 0; j < d->B; j++) {
        const int64_t g = global_row(d, ti, j, k);
        pad_pairs += ti->dpo && !ti->per_doc && g < 0 && j < d->B / 2; /* (per document: a
                                                  * padding row holds no document) */
        ti_row(ti, j, ids, labels, g);
    }
    return pad_pairs;
}

void train_dist_micro_docs(const train_dist *d, const train_inputs *ti, const int32_t *doc_ids,
                           int32_t *out, int64_t k)
{
    const int64_t T = ti->T;
    for (int64_t j = 0; j < d->B; j++) {
        const int64_t g = global_row(d, ti, j, k);
        if (g < 0)
            memset(out + j * T, 0, (size_t)T * sizeof *out);
        else
            memcpy(out + j * T, doc_ids + g * T, (size_t)T * sizeof *out);
    }
}

#ifdef SBP_WITH_MPI
static int mpi_fail(char *err, size_t errlen, const char *what, int code)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int n = 0;
    MPI_Error_string(code, s, &n);
    return cli_errf(err, errlen, "%s failed: %s", what, s);
}
#endif

#ifdef SBP_WITH_NCCL
/* Waits for the legacy default stream, where the NCCL calls and copies below go (the runtime's
 * stream is a blocking one, so it is ordered with them), and turns a failure into err. */
static int nccl_done(ncclResult_t nr, const char *what, char *err, size_t errlen)
{
    cudaError_t ce = nr == ncclSuccess ? cudaStreamSynchronize(NULL) : cudaSuccess;
    if (nr != ncclSuccess || ce != cudaSuccess)
        return cli_errf(err, errlen, "%s failed: %s", what,
                        nr != ncclSuccess ? ncclGetErrorString(nr) : cudaGetErrorString(ce));
    return 0;
}

/* The gradients summed on the GPUs: all of them (ncclAllReduce), or with `slice` (ZeRO 2) each
 * rank's slice to that rank only: NCCL has no reduce-scatter of unequal counts, so one
 * ncclReduce per rank, root r receiving slice r in place, grouped so that they run as one. */
static int nccl_reduce(train_dist *d, float *grads, bool slice, char *err, size_t errlen)
{
    ncclComm_t comm = (ncclComm_t)d->nccl;
    if (!slice)
        return nccl_done(ncclAllReduce(grads, grads, d->grad_elems, ncclFloat, ncclSum, comm,
                                       NULL),
                         "ncclAllReduce of the gradients", err, errlen);
    ncclResult_t nr = ncclGroupStart();
    if (nr != ncclSuccess)
        return nccl_done(nr, "ncclGroupStart", err, errlen);
    for (int r = 0; r < d->size && nr == ncclSuccess; r++)
        nr = ncclReduce(grads + d->displs[r], grads + d->displs[r], (size_t)d->counts[r],
                        ncclFloat, ncclSum, r, comm, NULL);
    ncclResult_t ne = ncclGroupEnd(); /* closes the group, also after a failed call */
    return nccl_done(nr != ncclSuccess ? nr : ne, "ncclReduce of the gradients' slices", err,
                     errlen);
}

/* ZeRO's all-gather on the GPUs: one ncclBroadcast per rank (root r sends slice r of the
 * gradient block, where the caller put its updated parameters), grouped. */
static int nccl_gather(train_dist *d, float *grads, char *err, size_t errlen)
{
    ncclComm_t comm = (ncclComm_t)d->nccl;
    ncclResult_t nr = ncclGroupStart();
    if (nr != ncclSuccess)
        return nccl_done(nr, "ncclGroupStart", err, errlen);
    for (int r = 0; r < d->size && nr == ncclSuccess; r++)
        nr = ncclBroadcast(grads + d->displs[r], grads + d->displs[r], (size_t)d->counts[r],
                           ncclFloat, r, comm, NULL);
    ncclResult_t ne = ncclGroupEnd();
    return nccl_done(nr != ncclSuccess ? nr : ne, "ncclBroadcast of the updated parameters", err,
                     errlen);
}
#endif

/* n floats from src to dst, both host memory or (d->nccl: a cuda step) both device memory */
static int copy_floats(const train_dist *d, float *dst, const float *src, size_t n)
{
#ifdef SBP_WITH_NCCL
    if (d->nccl) {
        cudaError_t ce = cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice,
                                         NULL);
        return ce == cudaSuccess ? 0 : -1;
    }
#else
    (void)d;
#endif
    memcpy(dst, src, n * sizeof(float));
    return 0;
}

int train_dist_reduce(train_dist *d, float *grads, double *loss, bool full, char *err,
                      size_t errlen)
{
    if (!d->on)
        return 0;
#ifdef SBP_WITH_MPI
    int st = MPI_Allreduce(MPI_IN_PLACE, loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    if (st != MPI_SUCCESS)
        return mpi_fail(err, errlen, "MPI_Allreduce of the loss", st);
#ifdef SBP_WITH_NCCL
    if (d->nccl) /* device memory: the step's sbp_step_run has synchronised its kernels */
        return nccl_reduce(d, grads, d->zero >= 2 && !full, err, errlen);
#endif
    if (d->zero >= 2 && !full) {
        /* in place, the sum of this rank's slice lands at the block's start */
        st = MPI_Reduce_scatter(MPI_IN_PLACE, grads, d->counts, MPI_FLOAT, MPI_SUM,
                                MPI_COMM_WORLD);
        if (st != MPI_SUCCESS)
            return mpi_fail(err, errlen, "MPI_Reduce_scatter of the gradients", st);
        memmove(grads + d->lo, grads, (d->hi - d->lo) * sizeof(float));
        return 0;
    }
    st = MPI_Allreduce(MPI_IN_PLACE, grads, (int)d->grad_elems, MPI_FLOAT, MPI_SUM,
                       MPI_COMM_WORLD);
    if (st != MPI_SUCCESS)
        return mpi_fail(err, errlen, "MPI_Allreduce of the gradients", st);
    return 0;
#else
    (void)grads, (void)loss, (void)full;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

int train_dist_sum(const train_dist *d, double *x, int n, char *err, size_t errlen)
{
    if (!d->on)
        return 0;
#ifdef SBP_WITH_MPI
    int st = MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return st == MPI_SUCCESS ? 0 : mpi_fail(err, errlen, "MPI_Allreduce of the rewards", st);
#else
    (void)x, (void)n;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

int train_dist_share_bits(const train_dist *d, uint32_t *x, size_t n, char *err, size_t errlen)
{
    if (!d->on)
        return 0;
#ifdef SBP_WITH_MPI
    const size_t most = (size_t)1 << 30; /* MPI's counts are int */
    for (size_t at = 0; at < n; at += most) {
        const size_t k = n - at < most ? n - at : most;
        int st = MPI_Allreduce(MPI_IN_PLACE, x + at, (int)k, MPI_UINT32_T, MPI_BOR,
                               MPI_COMM_WORLD);
        if (st != MPI_SUCCESS)
            return mpi_fail(err, errlen, "MPI_Allreduce of the ranks' shares", st);
    }
    return 0;
#else
    (void)x, (void)n;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

bool train_dist_owned(const train_dist *d, const sbp_step_param *p, size_t *from, size_t *n)
{
    const size_t g = p->grad_offset, e = g + p->numel;
    const size_t a = g > d->lo ? g : d->lo, b = e < d->hi ? e : d->hi;
    if (a >= b)
        return false;
    *from = a - g;
    *n = b - a;
    return true;
}

int train_dist_clip(const train_dist *d, const train_grad_rt *rt, const sbp_step_info *in,
                    float *grads, double max_norm, double *norm, double *coef)
{
    double sq = 0;
    int st;
    size_t a, n;
    *coef = 1.0;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 || !train_dist_owned(d, p, &a, &n))
            continue;
        if ((st = rt->sq_norm(rt->sq_ctx, &sq, grads + p->grad_offset + a, n)))
            return st;
    }
#ifdef SBP_WITH_MPI
    if (d->on && MPI_Allreduce(MPI_IN_PLACE, &sq, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) !=
                     MPI_SUCCESS)
        return SBPRT_ERR_BACKEND; /* the sum over the ranks failed */
#endif
    *norm = sqrt(sq);
    if (max_norm <= 0)
        return SBPRT_OK;
    const double k = train_clip_coef(max_norm, *norm);
    if (!(k < 1.0))
        return SBPRT_OK;
    *coef = k;
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 || !train_dist_owned(d, p, &a, &n))
            continue;
        float *x = grads + p->grad_offset + a;
        if ((st = rt->scale(rt->scale_ctx, x, x, n, (float)k)))
            return st;
    }
    return SBPRT_OK;
}

int train_dist_gather_params(train_dist *d, const sbp_step_info *in, float *params,
                             float *grads, char *err, size_t errlen)
{
    if (!d->on || d->zero == 0)
        return 0;
#ifdef SBP_WITH_MPI
    size_t a, n;
    int bad = 0;
    for (int i = 0; i < in->n_params; i++) { /* mine, in the gradient block's layout */
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0 || !train_dist_owned(d, p, &a, &n))
            continue;
        bad |= copy_floats(d, grads + p->grad_offset + a, params + p->offset + a, n);
    }
    if (bad)
        return cli_errf(err, errlen, "copying the updated parameters on the device failed");
#ifdef SBP_WITH_NCCL
    if (d->nccl) {
        if (nccl_gather(d, grads, err, errlen))
            return -1;
    } else
#endif
    {
        int st = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, grads, d->counts, d->displs,
                                MPI_FLOAT, MPI_COMM_WORLD);
        if (st != MPI_SUCCESS)
            return mpi_fail(err, errlen, "MPI_Allgatherv of the updated parameters", st);
    }
    for (int i = 0; i < in->n_params; i++) { /* everyone's, back into the parameter block */
        const sbp_step_param *p = &in->params[i];
        if (p->tied_to >= 0 || !p->trainable || p->numel == 0)
            continue;
        bad |= copy_floats(d, params + p->offset, grads + p->grad_offset, p->numel);
    }
#ifdef SBP_WITH_NCCL
    if (d->nccl && !bad)
        bad = cudaStreamSynchronize(NULL) != cudaSuccess;
#endif
    if (bad)
        return cli_errf(err, errlen, "copying the gathered parameters on the device failed");
    return 0;
#else
    (void)in, (void)params, (void)grads;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

enum { TAG_STATE = 1400 }; /* + which: a rank's m slice, then its v slice, for a checkpoint */

int train_dist_fill_state(void *arg, int which, size_t first, float *dst, size_t n, char *err,
                          size_t errlen)
{
    train_dist *d = arg;
#ifdef SBP_WITH_MPI
    if (first == 0 && which == 0)
        d->recv_rank = -1; /* a new checkpoint */
    const float *own = which ? d->state_v : d->state_m;
    while (n > 0) {
        int k = 0; /* the rank whose slice holds element `first` (slices ascend by rank) */
        while (k + 1 < d->size && first >= (size_t)d->displs[k] + (size_t)d->counts[k])
            k++;
        const size_t lo = (size_t)d->displs[k], hi = lo + (size_t)d->counts[k];
        if (first < lo || first >= hi)
            return cli_errf(err, errlen, "moment element %zu is in no rank's slice", first);
        const size_t len = hi - first < n ? hi - first : n;
        if (k == d->rank) {
#ifdef SBP_WITH_NCCL
            if (d->nccl) {
                cudaError_t ce = cudaMemcpy(dst, own + (first - lo), len * sizeof(float),
                                            cudaMemcpyDeviceToHost);
                if (ce != cudaSuccess)
                    return cli_errf(err, errlen, "copying the AdamW moments to the host failed: "
                                    "%s", cudaGetErrorString(ce));
            } else
#endif
                memcpy(dst, own + (first - lo), len * sizeof(float));
        } else {
            if (d->recv_rank != k || d->recv_which != which) {
                if (!d->recv) {
                    size_t most = 1;
                    for (int r = 0; r < d->size; r++)
                        if (r != d->rank && (size_t)d->counts[r] > most)
                            most = (size_t)d->counts[r];
                    if (!(d->recv = malloc(most * sizeof(float))))
                        return cli_errf(err, errlen, "out of memory");
                }
                int st = MPI_Recv(d->recv, d->counts[k], MPI_FLOAT, k, TAG_STATE + which,
                                  MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (st != MPI_SUCCESS)
                    return mpi_fail(err, errlen, "MPI_Recv of a rank's AdamW moments", st);
                d->recv_rank = k;
                d->recv_which = which;
            }
            memcpy(dst, d->recv + (first - lo), len * sizeof(float));
        }
        first += len;
        dst += len;
        n -= len;
    }
    return 0;
#else
    (void)d, (void)which, (void)first, (void)dst, (void)n;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

int train_dist_send_state(train_dist *d, char *err, size_t errlen)
{
#ifdef SBP_WITH_MPI
    const size_t n = d->hi - d->lo;
    const float *src[2] = {d->state_m, d->state_v};
#ifdef SBP_WITH_NCCL
    if (d->nccl) { /* MPI reads host memory: this rank's slices through a host copy */
        if (!d->host_slice && !(d->host_slice = malloc(2 * n * sizeof(float) + 1)))
            return cli_errf(err, errlen, "out of memory");
        for (int i = 0; i < 2; i++) {
            cudaError_t ce = cudaMemcpy(d->host_slice + i * n, src[i], n * sizeof(float),
                                        cudaMemcpyDeviceToHost);
            if (ce != cudaSuccess)
                return cli_errf(err, errlen, "copying the AdamW moments to the host failed: %s",
                                cudaGetErrorString(ce));
            src[i] = d->host_slice + i * n;
        }
    }
#endif
    for (int i = 0; i < 2; i++) {
        int st = MPI_Send(src[i], (int)n, MPI_FLOAT, 0, TAG_STATE + i, MPI_COMM_WORLD);
        if (st != MPI_SUCCESS)
            return mpi_fail(err, errlen, "MPI_Send of the AdamW moments", st);
    }
    return 0;
#else
    (void)d;
    return cli_errf(err, errlen, "built without MPI");
#endif
}

/* The tests' way to make one rank fail in the middle of a run (never set in real use): the
 * other ranks are then waiting in a collective, and the job must still end. */
bool train_dist_injected_failure(const train_dist *d, int64_t s)
{
    const char *v = getenv("SBP_TEST_FAIL_RANK");
    return d->on && s == 2 && v && atoi(v) == d->rank;
}

/* ------------------------------------------------------------------ agreement */

/* FNV-1a, 64 bits, as the checkpoints' identities: it tells files apart, it is no defence
 * against anyone crafting a collision. */
#define DIGEST_FNV_SEED 0xcbf29ce484222325ULL
#define DIGEST_FNV_PRIME 0x100000001b3ULL
static uint64_t digest_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * DIGEST_FNV_PRIME;
    return h;
}

/* A file's bytes: FNV-1a's step on 64-bit words in four independent lanes (a shift folds each
 * lane's high bits down, which a multiply alone never does), about six times byte-wise FNV-1a's
 * speed, so that a model or a shard of gigabytes costs about a second per 3 GB; `lane` carries
 * the lanes from one piece to the next (pieces but the last are whole 32-byte blocks). Words
 * are read in this machine's byte order: ranks of another order differ, and cannot sum floats
 * with these anyway. */
static void digest_blocks(uint64_t lane[4], const unsigned char *b, size_t n)
{
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * (size_t)k, 8);
            lane[k] = (lane[k] ^ w) * DIGEST_FNV_PRIME;
            lane[k] ^= lane[k] >> 29;
        }
}

/* The next free field, or NULL (and the digest marked) when all are taken. */
static train_dist_field *digest_add(train_dist_digest *g, const char *name, bool file)
{
    if (g->n >= TRAIN_DIST_FIELDS) {
        g->overflow = 1;
        return NULL;
    }
    train_dist_field *f = &g->f[g->n++];
    snprintf(f->name, sizeof f->name, "%s", name);
    f->file = file;
    return f;
}

static void digest_value(train_dist_digest *g, const char *name, const char *v)
{
    train_dist_field *f = digest_add(g, name, false);
    if (!f)
        return;
    snprintf(f->value, sizeof f->value, "%s", v);
    f->hash = digest_fnv(DIGEST_FNV_SEED, v, strlen(v) + 1);
}

void train_dist_digest_init(train_dist_digest *g)
{
    memset(g, 0, sizeof *g);
    digest_value(g, "the sbp-train version", SBP_VERSION);
}

void train_dist_digest_int(train_dist_digest *g, const char *name, int64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%" PRId64, v);
    digest_value(g, name, b);
}

void train_dist_digest_real(train_dist_digest *g, const char *name, double v)
{
    char b[40];
    for (int prec = 6; prec <= 17; prec++) { /* the shortest text that reads back as v */
        snprintf(b, sizeof b, "%.*g", prec, v);
        if (strtod(b, NULL) == v)
            break;
    }
    digest_value(g, name, b);
}

void train_dist_digest_str(train_dist_digest *g, const char *name, const char *s)
{
    digest_value(g, name, s ? s : "not given");
}

void train_dist_digest_file(train_dist_digest *g, const char *name, const char *path)
{
    if (!path) {
        train_dist_digest_str(g, name, NULL);
        return;
    }
    train_dist_field *f = digest_add(g, name, true);
    if (!f)
        return;
    char why[512];
    struct stat st;
    int fd = sbp_file_open_input(path, &st, why, sizeof why);
    if (fd >= 0 && !S_ISREG(st.st_mode)) {
        snprintf(why, sizeof why, "%s: %s, not a regular file", path, sbp_file_kind(st.st_mode));
        close(fd);
        fd = -1;
    }
    if (fd < 0) { /* the same failure on every rank agrees; its reader reports it */
        snprintf(f->value, sizeof f->value, "unreadable (%.200s)", why);
        const char *what = strstr(why, ": ") ? strstr(why, ": ") + 2 : why; /* not the path */
        f->hash = digest_fnv(DIGEST_FNV_SEED ^ 1, what, strlen(what));
        return;
    }
    static unsigned char buf[1 << 20];
    uint64_t size = (uint64_t)st.st_size, got = 0;
    uint64_t lane[4] = {DIGEST_FNV_SEED, DIGEST_FNV_SEED ^ 1, DIGEST_FNV_SEED ^ 2,
                        DIGEST_FNV_SEED ^ 3};
    size_t fill = 0; /* bytes in buf: a piece is hashed once buf is full, or at the end */
    ssize_t k;
    while ((k = read(fd, buf + fill, sizeof buf - fill)) != 0) {
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            break; /* k < 0 and errno say why, below */
        got += (uint64_t)k;
        if ((fill += (size_t)k) == sizeof buf) {
            digest_blocks(lane, buf, fill);
            fill = 0;
        }
    }
    const int read_errno = k < 0 ? errno : 0;
    digest_blocks(lane, buf, fill);
    uint64_t h = digest_fnv(digest_fnv(DIGEST_FNV_SEED, &size, sizeof size), lane, sizeof lane);
    h = digest_fnv(h, buf + fill / 32 * 32, fill % 32); /* the last bytes, past whole blocks */
    close(fd);
    f->hash = h;
    if (read_errno || got != size) { /* a read error, or changed while read: matches nothing */
        f->hash = ~h;
        snprintf(f->value, sizeof f->value, "%.150s (%" PRIu64 " bytes, %s)", path, size,
                 read_errno ? strerror(read_errno) : "it changed size while read");
        return;
    }
    snprintf(f->value, sizeof f->value, "%.150s (%" PRIu64 " bytes, content %016" PRIx64 ")", path,
             size, h);
}

int train_dist_agree(train_dist *d, const train_dist_digest *g, char *err, size_t errlen)
{
    if (g->overflow) /* the same on every rank: each one stops alike */
        return cli_errf(err, errlen, "the options' digest holds more than %d fields "
                        "(TRAIN_DIST_FIELDS)", TRAIN_DIST_FIELDS);
    if (!d->on)
        return 0;
#ifdef SBP_WITH_MPI
    /* rank 0's size first, so that the bytes' broadcast has one count on every rank even when
     * another build (another layout) runs on some */
    int64_t bytes = (int64_t)sizeof *g;
    if (MPI_Bcast(&bytes, 1, MPI_INT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS || bytes < 0 ||
        bytes > (1 << 24))
        return cli_errf(err, errlen, "broadcasting the options' digest failed");
    unsigned char *raw = d->rank == 0 ? (unsigned char *)(uintptr_t)g : malloc((size_t)bytes + 1);
    if (!raw)
        return cli_errf(err, errlen, "out of memory");
    int st = MPI_Bcast(raw, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    /* my verdict: 0 agree; else the message, kept until the ranks know who reports */
    char mine[1024] = "";
    if (st != MPI_SUCCESS) {
        mpi_fail(mine, sizeof mine, "MPI_Bcast of the options' digest", st);
    } else if (d->rank != 0 && bytes != (int64_t)sizeof *g) {
        snprintf(mine, sizeof mine, "rank 0 runs another sbp-train build (its options' digest "
                 "is %" PRId64 " bytes, here %zu): every rank must run the same sbp-train",
                 bytes, sizeof *g);
    } else if (d->rank != 0) {
        const train_dist_digest *z = (const train_dist_digest *)raw;
        const int zn = z->n < 0 || z->n > TRAIN_DIST_FIELDS ? TRAIN_DIST_FIELDS : z->n;
        for (int i = 0; i < g->n || i < zn; i++) {
            const train_dist_field *a = &g->f[i], *b = &z->f[i];
            if (i >= g->n || i >= zn || strncmp(a->name, b->name, sizeof a->name) != 0) {
                snprintf(mine, sizeof mine, "rank 0 runs another sbp-train build (its option "
                         "%d is %.*s, here %.*s): every rank must run the same sbp-train", i,
                         TRAIN_DIST_NAME, i < zn ? b->name : "none", TRAIN_DIST_NAME,
                         i < g->n ? a->name : "none");
                break;
            }
            if (a->hash != b->hash || a->file != b->file) {
                snprintf(mine, sizeof mine, "%.*s is %.*s here but %.*s on rank 0: every rank "
                         "must %s", TRAIN_DIST_NAME, a->name, TRAIN_DIST_VALUE, a->value,
                         TRAIN_DIST_VALUE, b->value,
                         a->file ? "read the same files (compared by size and content)"
                                 : "be started with the same options");
                break;
            }
        }
    }
    if (d->rank != 0)
        free(raw);
    /* the lowest rank that differs reports: one line for the job, however many differ */
    int first = mine[0] ? d->rank : d->size;
    st = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (st != MPI_SUCCESS)
        return mine[0] ? cli_errf(err, errlen, "%s", mine)
                       : mpi_fail(err, errlen, "MPI_Allreduce of the options' verdicts", st);
    if (first == d->size)
        return 0;
    if (first == d->rank)
        return cli_errf(err, errlen, "%s", mine);
    /* Another rank reports and aborts the job, which ends this rank here. Aborting from here
     * too could end the job before that rank's line is out; a barrier it never enters waits. */
    MPI_Barrier(MPI_COMM_WORLD);
    return cli_errf(err, errlen, "rank %d was started with other options or files than rank 0",
                    first);
#else
    (void)err, (void)errlen;
    return 0;
#endif
}

void train_dist_barrier(const train_dist *d)
{
#ifdef SBP_WITH_MPI
    if (d->on)
        MPI_Barrier(MPI_COMM_WORLD);
#else
    (void)d;
#endif
}

int train_dist_max(const train_dist *d, int mine)
{
    int x = mine;
#ifdef SBP_WITH_MPI
    if (d->on)
        MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
#else
    (void)d;
#endif
    return x;
}

bool train_dist_any(const train_dist *d, bool mine) { return train_dist_max(d, mine) != 0; }
