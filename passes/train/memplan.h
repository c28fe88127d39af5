/* memplan.h — buffer lifetimes and the memory plan of a training program (passes/train/plan.c).
 *
 * The training program (train.h) is a schedule: its blocks run in order, and a loop runs a
 * range of it several times. Linearised, every instruction gets a position (0, 1, ... in
 * execution order, a loop's body once); a loop is a range [first, last] of positions. Every
 * buffer operand of every instruction is an access with a role (read, written whole,
 * accumulated, partly written) taken from the ROLES column of train_kernels.def (checked at
 * build time).
 *
 * Liveness. A buffer's lifetime is a set of ranges of positions: a range starts at an access
 * and runs to the last access before the next whole write (MP_W), which starts a new range —
 * the value before it is dead (so a layer's activations, written in the forward and written
 * again by the checkpoint strategy's recompute, free their bytes in between). Loops: a range
 * whose first access in a loop's body is not a whole write (a read, an accumulation, a partial
 * write such as one chunk's rows of a full-sequence buffer), i.e. one that carries a value into
 * the body or from one iteration to the next, is live over the whole loop; a range that starts
 * with a whole write in the body is live from that write on (one iteration of per-chunk
 * scratch, or to its reads after the loop: the start of the body is free again in the next
 * iteration, since the write comes before any read). The loss sum is read after the last
 * block, so it lives to the end.
 *
 * The plan. Offsets in one arena, 64-byte aligned, by a heap simulation: buffers are placed one
 * at a time (several orders: by size, by start, by size x duration) each in the best-fitting gap
 * left by the already placed buffers whose lifetimes meet its own; the order giving the
 * smallest peak wins (with very many live-together pairs: one best-fit pass in start order
 * instead, see plan.c). The liveness lower bound is the most bytes live at any one position;
 * the plan's peak is at least that (on the fixtures: equal to it; on random schedules: within
 * 25%).
 *
 * Gradient zeroing. Backward kernels accumulate, so a gradient buffer must be zero before its
 * first contribution. The builder says "every gradient buffer of this region is zero here" with
 * a MEMSET_ZERO on a span buffer (train.h: tp_buf.span), which only made sense while a region
 * was contiguous. The planner replaces each such call by one MEMSET_ZERO per gradient buffer
 * just before its first access after that point (hoisted out of the loops that the span's zero
 * is outside of), and drops it when that access writes the whole buffer. A gradient buffer no
 * span covers is zeroed before its first access the same way, outside every loop. So a
 * gradient's lifetime starts at its first use, not at the start of its backward.
 *
 * Persistent things (parameters, their gradients, ids, labels, constants) live outside the
 * workspace and are not planned here; the report (codegen/report.c) adds them.
 *
 * Everything a plan allocates lives in the program's graph arena.
 */
#ifndef SBP_MEMPLAN_H
#define SBP_MEMPLAN_H

#include "train.h"

#define MEMPLAN_ALIGN 64 /* bytes: every offset and size (SBPRT_ALIGN) */

/* ---------------------------------------------------------------- operand roles */

typedef enum mp_role {
    MP_R = 1, /* read */
    MP_W = 2, /* written whole (=): the buffer's previous contents are dead */
    MP_A = 3, /* accumulated (+=): read, then written */
    MP_P = 4, /* part of it written (=), the rest kept: a use of the previous contents */
} mp_role;

/* The role row of kernel k (train_kernels.def's ROLES): one letter per buffer operand. 'r' 'w' 'a' 'p' as mp_role; the
 * argument-dependent ones: 'g' a GEMM's c (written when beta, argument #6, is 0, else
 * accumulated); 'c' copy_cols' dst (accumulated when argument #6 is set, else written whole when
 * the block is the whole buffer, else partly written); 'z' the destination of a byte count
 * (argument #0): written whole when the count covers the buffer, else partly. */
const char *memplan_kernel_roles(tp_kernel k);
/* The role of buffer operand `op` of `in`, whose buffer is buf_bytes bytes long. */
mp_role memplan_operand_role(const tp_inst *in, int op, size_t buf_bytes);

/* ---------------------------------------------------------------- abstract schedules */

typedef struct mp_loop {
    int first, last;       /* positions of the body, inclusive; loops nest or are disjoint */
} mp_loop;

typedef struct mp_access {
    int pos;               /* position of the instruction */
    int buf;               /* buffer index */
    mp_role role;
} mp_access;

typedef struct mp_schedule {
    int n_pos;
    int n_bufs;
    const size_t *bytes;   /* [n_bufs] planned size (aligned); 0: not in the workspace */
    const mp_access *acc;  /* [n_acc] in position order (an instruction's reads and writes
                            * share its position) */
    int n_acc;
    const mp_loop *loops;  /* [n_loops] */
    int n_loops;
    const bool *live_out;  /* [n_bufs] or NULL: read after the last position */
} mp_schedule;

typedef struct mp_interval {
    int first, last;       /* positions, inclusive; first = -1: never live */
} mp_interval;

/* A buffer's lifetime: the ranges of positions where its bytes hold a value that is still
 * needed. A whole write (MP_W) outside the loops that carry the value ends the previous range
 * (the checkpoint strategy's recompute writes again a buffer that the forward used: the bytes
 * are free in between). */
typedef struct mp_liveness {
    int n_bufs;
    int *start;            /* [n_bufs + 1] buffer b's ranges: range[start[b] .. start[b + 1]) */
    mp_interval *range;    /* [n_ranges] per buffer disjoint and ascending */
    int n_ranges;
    mp_interval *hull;     /* [n_bufs] first..last of all its ranges; first = -1: never live */
    int *iter_loop;        /* [n_bufs] when each range of the buffer lies inside one
                            * iteration of a loop (per-chunk scratch): the first range's loop;
                            * else -1 */
} mp_liveness;

/* Lifetimes of every buffer (loops applied), allocated in `arena`. Returns IR_OK, or IR_ERR on
 * a malformed schedule (loops that overlap without nesting, accesses out of order) or when out
 * of memory. */
int memplan_liveness(const mp_schedule *s, ir_arena *arena, mp_liveness *out);
/* Bytes live at each position (live: [n_pos], may be NULL); returns the most (the liveness
 * lower bound of any plan). */
size_t memplan_live_bytes(const mp_schedule *s, const mp_liveness *lv, size_t *live);
/* Whether buffers a and b have a position where both are live. */
bool memplan_live_together(const mp_liveness *lv, int a, int b);
/* How memplan_assign_offsets places the buffers (a zeroed struct, or NULL: the defaults). */
typedef struct mp_offset_options {
    /* Always take the start-order path (one best-fit pass in start order over each buffer's
     * hull, O(n log n)), which otherwise runs only when the buffers have more than about
     * 2^23 + 16n live-together pairs, i.e. on programs far larger than a unit test can check
     * pair by pair. Lets tests check that path on small schedules and compare its peak with
     * the eight-order plan. */
    bool start_order;
} mp_offset_options;

/* Offsets (multiples of MEMPLAN_ALIGN) such that two buffers whose intervals intersect never
 * share a byte; returns the arena size (the plan's peak). Buffers that are never live or of
 * size 0 get offset 0. o may be NULL (the defaults). */
size_t memplan_assign_offsets(int n, const size_t *bytes, const mp_liveness *lv, size_t *offset,
                              const mp_offset_options *o);
/* Runs the schedule (each loop body twice) over the arena given by offset[]: fails (IR_ERR, a
 * diagnostic naming the buffers through names[], which may be NULL) when an access reads a
 * buffer that is not written yet or whose bytes another buffer wrote since. */
int memplan_simulate(const mp_schedule *s, const size_t *offset, const char *const *names,
                     ir_diag *d);

/* ---------------------------------------------------------------- training programs */

typedef struct memplan {
    const sbp_train_program *p;
    int n_pos;
    int *pos_block, *pos_inst; /* [n_pos] the instruction at each position */
    int *block_first;          /* [n_blocks + 1] first position of each block */
    mp_schedule s;             /* the accesses to workspace buffers */
    size_t *bytes;             /* [n_bufs] aligned size of each workspace buffer, else 0 */
    mp_liveness lv;            /* lifetimes (lv.hull: first..last of each buffer) */
    size_t *live;              /* [n_pos] bytes live at each position */
    size_t lower_bound;        /* the most bytes live at one position */
    int lower_bound_pos;       /* (the first) position where that many are live */
    size_t peak;               /* the planned arena: max over buffers of offset + size */
} memplan;

/* requires: a built program (sbp_train_build's blocks). produces: gradient zeroing per buffer
 * (span zeroing replaced, see above), every workspace buffer's offset, p->workspace_bytes (the
 * planned peak, at least MEMPLAN_ALIGN). IR_ERR with a diagnostic when a buffer other than a
 * gradient is read before anything writes it (a builder bug). In builds without NDEBUG the plan
 * is then checked with memplan_simulate. */
int sbp_memplan(sbp_train_program *p, ir_diag *d);

/* The schedule, liveness and live-bytes curve of a program as it stands (normally after
 * sbp_memplan; peak is computed from the buffers' offsets), allocated in p's arena; NULL when
 * out of memory or the program's loops are malformed. */
memplan *memplan_analyze(const sbp_train_program *p);

/* The position's place in words ("backward_layer_0:12"), in p's arena. */
const char *memplan_pos_name(const memplan *m, int pos);

/* Checks a planned program: no two workspace buffers with intersecting intervals share a byte,
 * and memplan_simulate passes. IR_OK or IR_ERR with diagnostics. */
int memplan_verify(const sbp_train_program *p, ir_diag *d);

#endif
