/* test_memplan.c — the memory planner (passes/train/plan.c) and the memory report
 * (codegen/report.c).
 *
 * Real plans: every fixture family (GPT-2, Llama, Qwen3 bound to B=2, T=64; Llama with its loss
 * in the graph) under every strategy (store, checkpoint, stream with automatic chunks, stream
 * with small chunks whose loops run several iterations and a tail) is built through the library
 * as sbpc does, and its plan must
 *   (a) never give two buffers that are live together a common byte (brute force over every
 *       pair, here and in memplan_verify), and survive memplan_simulate (the schedule run with
 *       every loop body twice: each read sees the value last written to that buffer);
 *   (b) be tight: workspace <= 1.1 x the liveness lower bound (the most bytes live at once);
 *   (c) leave no region-wide (span) zeroing behind: each gradient is made whole (zeroed or
 *       written) before its first contribution.
 * The compiled steps themselves run with exactly workspace_bytes of garbage in tests/e2e.
 *
 * Hand-made schedules pin the loop rules down: an accumulator inside a loop is never shared
 * with a within-iteration temporary; a value written in a loop and read after it does not
 * block the start of the body; a partial write is a use; malformed loops are refused; random
 * schedules with loops always give plans that pass the simulation. A hand-made program with a
 * chunk loop checks the zeroing rewrite (a hoisted accumulator zero, a per-iteration zero, the
 * loop's bounds moved). Last, the report's text carries the figures and the plot is
 * well-formed SVG.
 *
 * The start-order path of the offsets (memplan.h: mp_offset_options.start_order; otherwise
 * taken only past about 2^23 + 16n live-together pairs) is checked the same way on 200 random
 * schedules and on every fixture plan, its peak within a stated factor of the eight orders';
 * `test_memplan scale` (ctest memplan.scale) plans a 200000-buffer chain by both paths and
 * checks that a forward-backward chain past the pair budget takes the start-order path unforced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "flow.h"
#include "ir.h"
#include "memplan.h"
#include "passes.h"
#include "train.h"

static void print_diag(const ir_diag *d)
{
    for (int i = 0; i < d->n; i++)
        print_message("  %s\n", d->entries[i].msg);
}

/* ------------------------------------------------------------------ the kernel table */

/* The ARGS column of train_kernels.def says which calls read the step's arguments: the emitter
 * passes `args` to a block by it (a wrong 1 leaves args unused in the emitted C, which -Werror
 * catches only where a test emits that kernel; a wrong 0 would hide a use). It must agree with
 * the template: 1 exactly when the CALL names `args` as an identifier. */
static void test_args_column(void **state)
{
    (void)state;
    int n = 0;
    for (int k = 0; k < TP_K_COUNT; k++) {
        const char *call = tp_kernel_table[k].call;
        bool names = false;
        for (const char *c = strstr(call, "args"); c && !names; c = strstr(c + 1, "args"))
            names = (c == call || !(isalnum((unsigned char)c[-1]) || c[-1] == '_')) &&
                    !(isalnum((unsigned char)c[4]) || c[4] == '_');
        if (names != tp_kernel_table[k].reads_args)
            print_message("kernel %s: ARGS %d, but its call %s args\n", tp_kernel_table[k].name,
                          tp_kernel_table[k].reads_args, names ? "reads" : "does not read");
        assert_true(names == tp_kernel_table[k].reads_args);
        n += names;
    }
    assert_true(n > 0); /* GRPO_LOSS and the host steps at least */
}

static void test_roles_table(void **state)
{
    (void)state;
    for (int k = 0; k < TP_K_COUNT; k++) {
        const char *r = memplan_kernel_roles((tp_kernel)k);
        if (!r || (int)strlen(r) != tp_kernel_table[k].n_buf)
            print_message("kernel %s: no ROLES of %d letters in passes/train/train_kernels.def\n",
                          tp_kernel_table[k].name, tp_kernel_table[k].n_buf);
        assert_non_null(r);
        assert_int_equal((int)strlen(r), tp_kernel_table[k].n_buf);
        for (const char *c = r; *c; c++)
            assert_non_null(strchr("rwapgcz", *c));
        /* outputs first: the first operand of every kernel is written in some way, but for
         * OFFLOAD_WAIT, whose one operand is the buffer of the transfer it waits for: a use
         * that keeps the buffer live to the wait (and GRAD_WAIT, its gradients' form) */
        assert_true(r[0] != 'r' || k == TP_K_OFFLOAD_WAIT || k == TP_K_GRAD_WAIT);
    }
    /* argument-dependent rows */
    tp_inst in = {.k = TP_K_GEMM};
    in.arg[6] = (tp_arg){.kind = TP_ARG_FLOAT, .f = 0};
    assert_int_equal(memplan_operand_role(&in, 0, 64), MP_W);
    in.arg[6].f = 1;
    assert_int_equal(memplan_operand_role(&in, 0, 64), MP_A);
    assert_int_equal(memplan_operand_role(&in, 1, 64), MP_R);
    tp_inst z = {.k = TP_K_MEMSET_ZERO};
    z.arg[0] = (tp_arg){.kind = TP_ARG_INT, .i = 64};
    assert_int_equal(memplan_operand_role(&z, 0, 64), MP_W);
    assert_int_equal(memplan_operand_role(&z, 0, 128), MP_P);
    tp_inst cc = {.k = TP_K_COPY_COLS}; /* rows, w, dst_ld, dst_off, src_ld, src_off, acc */
    int64_t a[7] = {4, 8, 16, 8, 8, 0, 0};
    for (int i = 0; i < 7; i++)
        cc.arg[i] = (tp_arg){.kind = TP_ARG_INT, .i = a[i]};
    assert_int_equal(memplan_operand_role(&cc, 0, 4 * 16 * 4), MP_P);
    cc.arg[2].i = 8;
    cc.arg[3].i = 0;
    assert_int_equal(memplan_operand_role(&cc, 0, 4 * 8 * 4), MP_W);
    cc.arg[6].i = 1;
    assert_int_equal(memplan_operand_role(&cc, 0, 4 * 8 * 4), MP_A);
}

/* ------------------------------------------------------------------ abstract schedules */

typedef struct sched {
    mp_access acc[256];
    int n_acc;
    mp_loop loops[8];
    int n_loops;
    size_t bytes[16];
    bool live_out[16];
    int n_pos, n_bufs;
} sched;

static void acc(sched *s, int pos, int buf, mp_role r)
{
    s->acc[s->n_acc++] = (mp_access){pos, buf, r};
    if (pos + 1 > s->n_pos)
        s->n_pos = pos + 1;
    if (buf + 1 > s->n_bufs)
        s->n_bufs = buf + 1;
}

static mp_schedule view(sched *s)
{
    return (mp_schedule){.n_pos = s->n_pos,
                         .n_bufs = s->n_bufs,
                         .bytes = s->bytes,
                         .acc = s->acc,
                         .n_acc = s->n_acc,
                         .loops = s->loops,
                         .n_loops = s->n_loops,
                         .live_out = s->live_out};
}

static bool overlap_bytes(const size_t *off, const size_t *bytes, int a, int b)
{
    return off[a] < off[b] + bytes[b] && off[b] < off[a] + bytes[a];
}

/* Liveness, offsets, and the two checks every plan must pass; returns the peak. */
static size_t plan_and_check(const mp_schedule *s, mp_liveness *lv, size_t *off, ir_arena *A,
                             const mp_offset_options *o)
{
    assert_int_equal(memplan_liveness(s, A, lv), IR_OK);
    size_t lower = memplan_live_bytes(s, lv, NULL);
    size_t peak = memplan_assign_offsets(s->n_bufs, s->bytes, lv, off, o);
    assert_true(peak >= lower);
    for (int b = 0; b < s->n_bufs; b++) {
        assert_true(off[b] % MEMPLAN_ALIGN == 0);
        if (s->bytes[b] && lv->hull[b].first >= 0)
            assert_true(off[b] + s->bytes[b] <= peak);
    }
    for (int a = 0; a < s->n_bufs; a++)
        for (int b = a + 1; b < s->n_bufs; b++)
            if (s->bytes[a] && s->bytes[b] && memplan_live_together(lv, a, b))
                assert_false(overlap_bytes(off, s->bytes, a, b));
    ir_diag d;
    ir_diag_init(&d, "sched");
    int rc = memplan_simulate(s, off, NULL, &d);
    if (rc != IR_OK)
        print_diag(&d);
    assert_int_equal(rc, IR_OK);
    ir_diag_free(&d);
    return peak;
}

static bool live_at(const mp_liveness *lv, int b, int pos)
{
    for (int r = lv->start[b]; r < lv->start[b + 1]; r++)
        if (lv->range[r].first <= pos && pos <= lv->range[r].last)
            return true;
    return false;
}

/* An accumulator over a loop's iterations is live over the whole loop; a temporary written and
 * read in one iteration is not, and the two never share bytes. */
static void test_loop_accumulator(void **state)
{
    (void)state;
    enum { ACC, T, U, OUT };
    sched s = {0};
    for (int b = 0; b < 4; b++)
        s.bytes[b] = 256;
    acc(&s, 0, ACC, MP_W);                       /* zero the accumulator */
    acc(&s, 1, T, MP_W);                         /* loop body: 1..4 */
    acc(&s, 2, T, MP_R);
    acc(&s, 2, ACC, MP_A);
    acc(&s, 3, U, MP_W);
    acc(&s, 4, U, MP_R);
    acc(&s, 4, ACC, MP_A);
    acc(&s, 5, ACC, MP_R);
    acc(&s, 5, OUT, MP_W);
    s.live_out[OUT] = true;
    s.loops[s.n_loops++] = (mp_loop){1, 4};
    mp_schedule v = view(&s);
    ir_arena *A = ir_arena_new();
    mp_liveness lv;
    size_t off[16];
    size_t peak = plan_and_check(&v, &lv, off, A, NULL);
    for (int q = 0; q <= 5; q++)
        assert_true(live_at(&lv, ACC, q));
    assert_false(live_at(&lv, T, 3));
    assert_false(live_at(&lv, U, 2));
    assert_int_equal(lv.iter_loop[T], 0);
    assert_int_equal(lv.iter_loop[U], 0);
    assert_int_equal(lv.iter_loop[ACC], -1);
    assert_false(overlap_bytes(off, s.bytes, ACC, T));
    assert_false(overlap_bytes(off, s.bytes, ACC, U));
    assert_int_equal(peak, 512); /* T and U share; OUT reuses T/U after the loop */

    /* a plan that puts T on the accumulator is caught by the simulation */
    off[T] = off[ACC];
    ir_diag d;
    ir_diag_init(&d, "bad");
    assert_int_equal(memplan_simulate(&v, off, (const char *const[]){"acc", "t", "u", "out"},
                                      &d),
                     IR_ERR);
    assert_true(d.n_errors > 0);
    assert_non_null(strstr(d.entries[0].msg, "acc"));
    ir_diag_free(&d);
    ir_arena_free(A);
}

/* A value read in the body before its write in the body comes from the previous iteration:
 * live over the whole loop. A value written in the body and read after the loop is live from
 * its write on; the start of the body is free for a temporary. */
static void test_loop_carried_and_after(void **state)
{
    (void)state;
    enum { X, T, Y };
    sched s = {0};
    for (int b = 0; b < 3; b++)
        s.bytes[b] = 128;
    acc(&s, 0, X, MP_W);
    acc(&s, 1, X, MP_R); /* body 1..4: read, then write: carried */
    acc(&s, 2, T, MP_W);
    acc(&s, 3, T, MP_R);
    acc(&s, 3, Y, MP_W);
    acc(&s, 4, X, MP_W);
    acc(&s, 5, Y, MP_R);
    s.loops[s.n_loops++] = (mp_loop){1, 4};
    mp_schedule v = view(&s);
    ir_arena *A = ir_arena_new();
    mp_liveness lv;
    size_t off[16];
    plan_and_check(&v, &lv, off, A, NULL);
    for (int q = 0; q <= 4; q++)
        assert_true(live_at(&lv, X, q));
    assert_false(live_at(&lv, X, 5));
    /* Y: written at 3, read at 5 after the loop: not live at 1..2 of the body */
    assert_true(live_at(&lv, Y, 3) && live_at(&lv, Y, 4) && live_at(&lv, Y, 5));
    assert_false(live_at(&lv, Y, 1));
    assert_false(live_at(&lv, Y, 2));
    /* so T (2..3) and Y meet only at 3 */
    assert_true(memplan_live_together(&lv, T, Y));
    /* a temporary that dies before Y's write may share Y's bytes: the run agrees */
    sched s2 = {0};
    s2.bytes[0] = s2.bytes[1] = 128;
    acc(&s2, 0, 0, MP_W); /* body 0..3: t =, read t, y =, read y; y read after the loop */
    acc(&s2, 1, 0, MP_R);
    acc(&s2, 2, 1, MP_W);
    acc(&s2, 3, 1, MP_R);
    acc(&s2, 4, 1, MP_R);
    s2.loops[s2.n_loops++] = (mp_loop){0, 3};
    mp_schedule v2 = view(&s2);
    plan_and_check(&v2, &lv, off, A, NULL);
    assert_false(memplan_live_together(&lv, 0, 1));
    size_t same[2] = {0, 0};
    ir_diag d;
    ir_diag_init(&d, "share");
    assert_int_equal(memplan_simulate(&v2, same, NULL, &d), IR_OK);
    ir_diag_free(&d);

    /* a partial write first in the body keeps the rest: a use, live over the loop */
    sched p = {0};
    p.bytes[0] = p.bytes[1] = 64;
    acc(&p, 0, 0, MP_W);
    acc(&p, 1, 0, MP_P); /* body 1..2 */
    acc(&p, 2, 1, MP_W);
    acc(&p, 2, 0, MP_R);
    acc(&p, 3, 1, MP_R);
    p.loops[p.n_loops++] = (mp_loop){1, 2};
    mp_schedule pv = view(&p);
    plan_and_check(&pv, &lv, off, A, NULL);
    assert_true(live_at(&lv, 0, 1) && live_at(&lv, 0, 2));
    assert_int_equal(lv.iter_loop[0], -1);

    /* a whole write outside loops ends the previous value (recompute in the backward) */
    sched r = {0};
    r.bytes[0] = r.bytes[1] = 64;
    acc(&r, 0, 0, MP_W);
    acc(&r, 1, 0, MP_R);
    acc(&r, 2, 1, MP_W);
    acc(&r, 3, 1, MP_R);
    acc(&r, 4, 0, MP_W);
    acc(&r, 5, 0, MP_R);
    mp_schedule rv = view(&r);
    size_t peak = plan_and_check(&rv, &lv, off, A, NULL);
    assert_int_equal(lv.start[1] - lv.start[0], 2);
    assert_int_equal(peak, 64);
    ir_arena_free(A);
}

static void test_malformed_loops(void **state)
{
    (void)state;
    sched s = {0};
    s.bytes[0] = 64;
    for (int q = 0; q < 6; q++)
        acc(&s, q, 0, q ? MP_R : MP_W);
    s.loops[s.n_loops++] = (mp_loop){1, 3};
    s.loops[s.n_loops++] = (mp_loop){2, 4}; /* overlaps without nesting */
    mp_schedule v = view(&s);
    ir_arena *A = ir_arena_new();
    mp_liveness lv;
    assert_int_equal(memplan_liveness(&v, A, &lv), IR_ERR);
    s.loops[1] = (mp_loop){2, 3}; /* nested: fine */
    v = view(&s);
    assert_int_equal(memplan_liveness(&v, A, &lv), IR_OK);
    ir_arena_free(A);
}

/* Random schedules with nested and disjoint loops: every plan passes the simulation. */
static unsigned rng_state = 12345;
static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) % n;
}

/* One random schedule with nested and disjoint loops into *s; false when it reads a value
 * nothing wrote (the simulation could not judge a plan of it), to be drawn again. */
static bool random_sched(sched *s)
{
    memset(s, 0, sizeof *s);
    int nb = 4 + (int)rnd(12), np = 8 + (int)rnd(40);
    for (int b = 0; b < nb; b++)
        s->bytes[b] = 64 * (1 + rnd(8));
    bool written[16] = {false};
    for (int q = 0; q < np && s->n_acc < 250; q++) {
        int k = 1 + (int)rnd(3);
        int used[4] = {-1, -1, -1, -1};
        for (int j = 0; j < k; j++) {
            int b = (int)rnd((unsigned)nb);
            bool dup = false;
            for (int i = 0; i < j; i++)
                dup = dup || used[i] == b;
            if (dup)
                continue;
            used[j] = b;
            mp_role r = !written[b] ? MP_W : (mp_role)(1 + rnd(4));
            written[b] = true;
            acc(s, q, b, r);
        }
    }
    s->n_pos = np;
    s->n_bufs = nb;
    int a = (int)rnd((unsigned)np), b = a + (int)rnd((unsigned)(np - a));
    s->loops[s->n_loops++] = (mp_loop){a, b};
    if (b > a + 2)
        s->loops[s->n_loops++] = (mp_loop){a + 1, b - 1};
    if (b + 3 < np)
        s->loops[s->n_loops++] = (mp_loop){b + 1, b + 1 + (int)rnd((unsigned)(np - b - 1))};
    s->live_out[rnd((unsigned)nb)] = true;
    /* the simulation checks reads against writes: drop schedules that read garbage */
    mp_schedule v = view(s);
    size_t off[16];
    for (int i = 0; i < nb; i++)
        off[i] = (size_t)i * 1024; /* no sharing at all */
    ir_diag d;
    ir_diag_init(&d, "rnd");
    int ok = memplan_simulate(&v, off, NULL, &d);
    ir_diag_free(&d);
    return ok == IR_OK;
}

static void test_random_schedules(void **state)
{
    (void)state;
    ir_arena *A = ir_arena_new();
    double worst = 1;
    rng_state = 12345;
    for (int trial = 0; trial < 300; trial++) {
        sched s;
        if (!random_sched(&s))
            continue;
        mp_schedule v = view(&s);
        mp_liveness lv;
        size_t off[16];
        size_t peak = plan_and_check(&v, &lv, off, A, NULL);
        size_t lower = memplan_live_bytes(&v, &lv, NULL);
        if (lower && (double)peak / (double)lower > worst)
            worst = (double)peak / (double)lower;
    }
    print_message("  random schedules: worst planned / lower bound %.3f\n", worst);
    ir_arena_free(A);
}

/* ------------------------------------------------------------------ the start-order path
 *
 * memplan_assign_offsets runs one best-fit pass in start order over each buffer's hull instead
 * of its eight placement orders when the live-together pairs exceed about 2^23 + 16n; only
 * programs far beyond a unit test's size get there, so mp_offset_options.start_order takes that
 * path here on small schedules. Its plans must pass the same checks as the eight orders' (no two
 * buffers live together share a byte, the simulated run, 64-byte offsets, peak >= the liveness
 * lower bound), and cost at most a stated factor more.
 */

/* The start-order peak over the eight-order peak, at most. Measured worst over the 200 random
 * schedules below: 1.538, mean 1.052 (a buffer with several ranges keeps its bytes over its
 * whole hull in the start-order pass, and these schedules, up to 16 buffers rewritten at
 * random, have many); the bound is a little above that. On the fixture programs see START_ORDER_FIXTURE_RATIO. */
#define START_ORDER_RANDOM_RATIO 1.6

static void test_start_order_random(void **state)
{
    (void)state;
    ir_arena *A = ir_arena_new();
    double worst = 0, worst_lb = 0, sum = 0;
    int n = 0;
    rng_state = 777;
    while (n < 200) {
        sched s;
        if (!random_sched(&s))
            continue;
        mp_schedule v = view(&s);
        mp_liveness lv;
        size_t off[16];
        size_t peak8 = plan_and_check(&v, &lv, off, A, NULL);
        const mp_offset_options start_order = {.start_order = true};
        size_t peak1 = plan_and_check(&v, &lv, off, A, &start_order);
        size_t lower = memplan_live_bytes(&v, &lv, NULL);
        assert_true(peak8 > 0 && lower > 0);
        double r = (double)peak1 / (double)peak8;
        if (r > START_ORDER_RANDOM_RATIO)
            print_message("  schedule %d: start order %zu, eight orders %zu\n", n, peak1,
                          peak8);
        assert_true(r <= START_ORDER_RANDOM_RATIO);
        worst = r > worst ? r : worst;
        double rl = (double)peak1 / (double)lower;
        worst_lb = rl > worst_lb ? rl : worst_lb;
        sum += r;
        n++;
    }
    print_message("  %d random schedules: start-order peak / eight-order peak: worst %.3f, mean "
                  "%.3f; start-order peak / lower bound: worst %.3f\n",
                  n, worst, sum / n, worst_lb);
    ir_arena_free(A);
}

/* A schedule too large for the fixed-size sched above (malloc'd; big_free). */
typedef struct big {
    mp_access *acc;
    int n_acc, cap;
    size_t *bytes;
    bool *live_out;
    int n_pos, n_bufs;
} big;

static void big_init(big *s, int n_bufs, int cap)
{
    s->acc = malloc(sizeof *s->acc * (size_t)cap);
    s->bytes = calloc((size_t)n_bufs, sizeof *s->bytes);
    s->live_out = calloc((size_t)n_bufs, sizeof *s->live_out);
    assert_true(s->acc && s->bytes && s->live_out);
    s->n_acc = 0;
    s->cap = cap;
    s->n_pos = 0;
    s->n_bufs = n_bufs;
}

static void big_acc(big *s, int pos, int buf, mp_role r)
{
    assert_true(s->n_acc < s->cap && buf < s->n_bufs);
    s->acc[s->n_acc++] = (mp_access){pos, buf, r};
    if (pos + 1 > s->n_pos)
        s->n_pos = pos + 1;
}

static mp_schedule big_view(const big *s)
{
    return (mp_schedule){.n_pos = s->n_pos,
                         .n_bufs = s->n_bufs,
                         .bytes = s->bytes,
                         .acc = s->acc,
                         .n_acc = s->n_acc,
                         .live_out = s->live_out};
}

static void big_free(big *s)
{
    free(s->acc);
    free(s->bytes);
    free(s->live_out);
}

/* The pairwise check of plan_and_check in O(sum of lifetimes): at each position the buffers
 * live there, sorted by offset, must lie apart. Two buffers are live together exactly when some
 * position has both live, so this is the same check without the n^2 pairs, written apart from
 * plan.c's own verifier (a sweep in offset order) so that the two check each other; fine for
 * schedules whose lifetimes are short. */
static void check_apart_by_position(const mp_schedule *s, const mp_liveness *lv,
                                    const size_t *off, size_t peak)
{
    int np = s->n_pos;
    size_t *cnt = calloc((size_t)np + 1, sizeof *cnt);
    assert_non_null(cnt);
    for (int b = 0; b < s->n_bufs; b++) {
        assert_true(off[b] % MEMPLAN_ALIGN == 0);
        if (!s->bytes[b] || lv->hull[b].first < 0)
            continue;
        assert_true(off[b] + s->bytes[b] <= peak);
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++)
            for (int q = lv->range[r].first; q <= lv->range[r].last; q++)
                cnt[q + 1]++;
    }
    for (int q = 0; q < np; q++)
        cnt[q + 1] += cnt[q];
    int *at = malloc(sizeof *at * (cnt[np] + 1));
    size_t *fill = calloc((size_t)np + 1, sizeof *fill);
    assert_true(at && fill);
    for (int b = 0; b < s->n_bufs; b++) {
        if (!s->bytes[b] || lv->hull[b].first < 0)
            continue;
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++)
            for (int q = lv->range[r].first; q <= lv->range[r].last; q++)
                at[cnt[q] + fill[q]++] = b;
    }
    for (int q = 0; q < np; q++) {
        int *l = at + cnt[q];
        int k = (int)(cnt[q + 1] - cnt[q]);
        for (int i = 1; i < k; i++) { /* insertion sort by offset: a handful live at once */
            int x = l[i], j = i;
            for (; j > 0 && off[l[j - 1]] > off[x]; j--)
                l[j] = l[j - 1];
            l[j] = x;
        }
        for (int i = 1; i < k; i++)
            if (off[l[i - 1]] + s->bytes[l[i - 1]] > off[l[i]]) {
                print_message("  position %d: buffers %d and %d overlap\n", q, l[i - 1], l[i]);
                fail();
            }
    }
    free(cnt);
    free(at);
    free(fill);
}

/* Scale: a chain of buffers, each written at its own position and read one to five positions
 * later (a long program's temporaries), planned by both paths. Not timed (timing belongs to
 * bench/bench_scale.py); the test is that it completes under ctest's TIMEOUT (120 s) with a
 * correct plan: the eight-order path with O(n) conflicts and the start-order path are both
 * O(n log n). Measured: `test_memplan scale` takes 0.4 s with 200000 buffers in a release
 * build; under AddressSanitizer and UBSan (SBP_SANITIZE, a Debug build) 50000 take 2.2 s, so
 * the sanitizer run stays far from the TIMEOUT on a slow CI machine. */
#ifdef SBP_TEST_SANITIZE
enum { SCALE_N = 50000 };
#else
enum { SCALE_N = 200000 };
#endif

static void test_start_order_scale(void **state)
{
    (void)state;
    int n = SCALE_N;
    big s;
    big_init(&s, n, 3 * n + 8);
    for (int q = 0; q < n + 5; q++) {
        /* reads first (the values this instruction consumes), then its write */
        if (q >= 1 && q - 1 < n)
            big_acc(&s, q, q - 1, MP_R);
        int back = q - 2 - (int)((unsigned)q * 2654435761u % 4u); /* 2..5 positions back */
        if (back >= 0 && back < n)
            big_acc(&s, q, back, MP_R);
        if (q < n) {
            s.bytes[q] = MEMPLAN_ALIGN * (1 + (size_t)((unsigned)q * 40503u % 16u));
            big_acc(&s, q, q, MP_W);
        }
    }
    s.live_out[n - 1] = true;
    mp_schedule v = big_view(&s);
    ir_arena *A = ir_arena_new();
    mp_liveness lv;
    assert_int_equal(memplan_liveness(&v, A, &lv), IR_OK);
    size_t lower = memplan_live_bytes(&v, &lv, NULL);
    size_t *off = malloc(sizeof *off * (size_t)n);
    assert_non_null(off);
    size_t peak[2];
    for (int force = 0; force < 2; force++) {
        const mp_offset_options o = {.start_order = force};
        peak[force] = memplan_assign_offsets(n, s.bytes, &lv, off, &o);
        assert_true(peak[force] != (size_t)-1);
        assert_true(peak[force] >= lower);
        /* a sanity bound, not a quality target: measured 1.06 (eight orders) and 1.47 (start
         * order: best fit in start order leaves gaps a later, larger buffer cannot use) */
        assert_true(peak[force] <= 2 * lower);
        check_apart_by_position(&v, &lv, off, peak[force]);
    }
    print_message("  chain of %d buffers: lower bound %zu, eight orders %zu, start order %zu\n",
                  n, lower, peak[0], peak[1]);
    free(off);
    ir_arena_free(A);
    big_free(&s);
}

/* The switch itself: a forward-backward chain (activation i written at position i of the
 * forward, read at the mirrored position of the backward, as a long program keeps its
 * activations) has about N^2 live-together pairs (2N buffers), past the budget of 2^23 + 16 per
 * buffer at N = 3000, so memplan_assign_offsets takes the start-order path unforced: its offsets
 * equal the forced ones. Small enough for the full checks (every pair, the simulated run). */
static void test_start_order_switch(void **state)
{
    (void)state;
    enum { N = 3000 };
    big s;
    big_init(&s, 2 * N, 6 * N + 8);
    for (int i = 0; i < N; i++) { /* forward: activation i from activation i - 1 */
        if (i > 0)
            big_acc(&s, i, i - 1, MP_R);
        s.bytes[i] = MEMPLAN_ALIGN * (1 + (size_t)(i % 5));
        big_acc(&s, i, i, MP_W);
    }
    for (int k = 0; k < N; k++) { /* backward: gradient temporary k from activation N-1-k */
        int q = N + k, t = N + k;
        big_acc(&s, q, N - 1 - k, MP_R);
        if (k > 0)
            big_acc(&s, q, t - 1, MP_R);
        s.bytes[t] = MEMPLAN_ALIGN * (1 + (size_t)(k % 3));
        big_acc(&s, q, t, MP_W);
    }
    s.live_out[2 * N - 1] = true;
    mp_schedule v = big_view(&s);
    ir_arena *A = ir_arena_new();
    mp_liveness lv;
    assert_int_equal(memplan_liveness(&v, A, &lv), IR_OK);
    size_t lower = memplan_live_bytes(&v, &lv, NULL);
    size_t *off = malloc(sizeof *off * 2 * N), *forced = malloc(sizeof *forced * 2 * N);
    assert_true(off && forced);
    size_t peak = memplan_assign_offsets(2 * N, s.bytes, &lv, off, NULL);
    size_t peak_forced = memplan_assign_offsets(2 * N, s.bytes, &lv, forced,
                                                &(mp_offset_options){.start_order = true});
    assert_int_equal(peak, peak_forced);
    assert_memory_equal(off, forced, sizeof *off * 2 * N);
    assert_true(peak >= lower);
    long pairs = 0;
    for (int a = 0; a < 2 * N; a++) {
        assert_true(off[a] % MEMPLAN_ALIGN == 0);
        for (int b = a + 1; b < 2 * N; b++)
            if (memplan_live_together(&lv, a, b)) {
                pairs++;
                assert_false(overlap_bytes(off, s.bytes, a, b));
            }
    }
    assert_true(pairs > (1L << 23) + 16L * 2 * N); /* past the budget: the start-order path */
    ir_diag d;
    ir_diag_init(&d, "switch");
    int rc = memplan_simulate(&v, off, NULL, &d);
    if (rc != IR_OK)
        print_diag(&d);
    assert_int_equal(rc, IR_OK);
    ir_diag_free(&d);
    print_message("  forward-backward chain of %d buffers: %ld pairs live together, lower bound "
                  "%zu, planned %zu\n",
                  2 * N, pairs, lower, peak);
    free(off);
    free(forced);
    ir_arena_free(A);
    big_free(&s);
}

/* ------------------------------------------------------------------ a hand-made program */

static int add_buf(sbp_train_program *p, const char *name, size_t numel, bool is_grad,
                   int region, bool span)
{
    tp_buf *b = ir_arena_calloc(p->g->arena, 1, sizeof *b);
    b->id = p->n_bufs;
    b->name = name;
    b->kind = TP_BUF_WS;
    b->is_grad = is_grad;
    b->rank = 1;
    b->dims[0] = (int64_t)numel;
    b->numel = numel;
    b->region = region;
    b->span = span;
    b->what = name;
    p->bufs[p->n_bufs] = b;
    return p->n_bufs++;
}

static void inst(tp_block *blk, tp_kernel k, int b0, int b1, int64_t a0)
{
    tp_inst *in = &blk->insts[blk->n_insts++];
    memset(in, 0, sizeof *in);
    in->k = k;
    for (int j = 0; j < TP_MAX_BUFS; j++)
        in->buf[j] = -1;
    in->buf[0] = b0;
    in->buf[1] = b1;
    in->arg[0] = (tp_arg){.kind = TP_ARG_INT, .i = a0};
    in->what = "test";
}

/* A block with a chunk loop: a span zero of the persistent gradients before it, a span zero of
 * the chunk-local gradients at the start of its body. After planning: the accumulator's zero
 * is hoisted before the loop, the chunk-local gradient is zeroed inside the body right before
 * its first contribution, the loop's bounds include the one and not the other, and the plan
 * keeps the accumulator apart from every per-iteration buffer. */
static void test_program_with_loop(void **state)
{
    (void)state;
    ir_diag d;
    ir_diag_init(&d, "handmade");
    ir_graph *g = ir_graph_new(&d, "handmade");
    sbp_train_program *p = ir_arena_calloc(g->arena, 1, sizeof *p);
    p->g = g;
    p->bufs = ir_arena_calloc(g->arena, 16, sizeof *p->bufs);
    p->cap_bufs = 16;
    p->ids_buf = p->labels_buf = -1;
    enum { N = 64 };
    int span_p = add_buf(p, "d_persistent", 0, true, TP_REGION_PERSIST, true);
    int span_0 = add_buf(p, "d_chunk", 0, true, 0, true);
    int x = add_buf(p, "x", N, false, TP_REGION_PERSIST, false);
    int accb = add_buf(p, "acc", N, true, TP_REGION_PERSIST, false);
    int t = add_buf(p, "t", N, false, 0, false);
    int dt = add_buf(p, "dt", N, true, 0, false);
    int out = add_buf(p, "out", N, false, TP_REGION_PERSIST, false);
    p->loss_buf = out;
    tp_block *blk = ir_arena_calloc(g->arena, 1, sizeof *blk);
    blk->name = "block";
    blk->insts = ir_arena_calloc(g->arena, 16, sizeof *blk->insts);
    blk->cap_insts = 16;
    p->blocks = ir_arena_calloc(g->arena, 1, sizeof *p->blocks);
    p->blocks[0] = blk;
    p->n_blocks = p->cap_blocks = 1;
    inst(blk, TP_K_MEMSET_ZERO, span_p, -1, 0);  /* 0 */
    inst(blk, TP_K_MEMSET_ZERO, x, -1, N * 4);   /* 1 */
    inst(blk, TP_K_MEMSET_ZERO, span_0, -1, 0);  /* 2: loop body 2..6 */
    inst(blk, TP_K_GELU_TANH_FWD, t, x, N);      /* 3 */
    inst(blk, TP_K_ACCUMULATE, dt, t, N);        /* 4 */
    inst(blk, TP_K_ACCUMULATE, dt, x, N);        /* 5 */
    inst(blk, TP_K_ACCUMULATE, accb, dt, N);     /* 6 */
    inst(blk, TP_K_COPY, out, accb, N * 4);      /* 7 */
    blk->loops = ir_arena_calloc(g->arena, 1, sizeof *blk->loops);
    blk->loops[0] = (tp_loop){.first = 2, .end = 7, .batch = 1, .seq = 4, .begin = 0,
                              .stop = 4, .step = 1, .len = 1, .what = "test loop"};
    blk->n_loops = blk->cap_loops = 1;

    int rc = sbp_memplan(p, &d);
    if (rc != IR_OK)
        print_diag(&d);
    assert_int_equal(rc, IR_OK);
    /* x, zero(acc) | loop: t=, zero(dt), dt+=, dt+=, acc+= | out= */
    const tp_loop *l = &blk->loops[0];
    int zacc = -1, zdt = -1;
    for (int i = 0; i < blk->n_insts; i++) {
        const tp_inst *in = &blk->insts[i];
        assert_false(in->k == TP_K_MEMSET_ZERO && p->bufs[in->buf[0]]->span);
        if (in->k == TP_K_MEMSET_ZERO && in->buf[0] == accb)
            zacc = i;
        if (in->k == TP_K_MEMSET_ZERO && in->buf[0] == dt)
            zdt = i;
    }
    assert_int_equal(blk->n_insts, 8);
    assert_true(zacc >= 0 && zacc < l->first);
    assert_true(zdt >= l->first && zdt < l->end);
    assert_int_equal(blk->insts[zdt + 1].k, TP_K_ACCUMULATE);
    assert_int_equal(blk->insts[zdt + 1].buf[0], dt);
    assert_int_equal(l->end, 7);
    assert_int_equal(blk->insts[l->end].k, TP_K_COPY);
    rc = memplan_verify(p, &d);
    if (rc != IR_OK)
        print_diag(&d);
    assert_int_equal(rc, IR_OK);
    memplan *m = memplan_analyze(p);
    assert_non_null(m);
    assert_int_equal(m->lv.iter_loop[t], 0);
    assert_int_equal(m->lv.iter_loop[dt], 0);
    assert_int_equal(m->lv.iter_loop[accb], -1);
    size_t ba = p->bufs[accb]->offset;
    assert_true(ba >= p->bufs[dt]->offset + 256 || p->bufs[dt]->offset >= ba + 256);
    assert_true(ba >= p->bufs[t]->offset + 256 || p->bufs[t]->offset >= ba + 256);
    assert_true(p->workspace_bytes <= 4 * 256);

    /* the verifier catches a plan that puts the temporary on the accumulator */
    p->bufs[t]->offset = ba;
    ir_diag d2;
    ir_diag_init(&d2, "bad");
    assert_int_equal(memplan_verify(p, &d2), IR_ERR);
    assert_true(d2.n_errors > 0);
    ir_diag_free(&d2);
    ir_graph_free(g);
    ir_diag_free(&d);
}

/* ------------------------------------------------------------------ real plans */

typedef struct model_case {
    const char *model;
    int64_t b, t;
} model_case;

static const model_case models[] = {
    {"gpt2_op17_dyn.onnx", 2, 64},
    {"llama_op17_dyn.onnx", 2, 64},
    {"qwen3_op17_dyn.onnx", 2, 64},
    {"llama_op17_loss.onnx", 0, 0},
};

typedef struct strategy_case {
    const char *label;
    sbp_train_options opt;
} strategy_case;

static const strategy_case strategies[] = {
    {"store", {.strategy = SBP_STRATEGY_STORE}},
    {"checkpoint", {.strategy = SBP_STRATEGY_CHECKPOINT}},
    {"stream", {.strategy = SBP_STRATEGY_STREAM}},
    {"stream c16/l32", {.strategy = SBP_STRATEGY_STREAM, .chunk = 16, .logits_chunk = 32}},
    {"stream c24/l48", {.strategy = SBP_STRATEGY_STREAM, .chunk = 24, .logits_chunk = 48}},
};

/* The program of a model under a strategy, built as sbpc does (the caller frees *g, *d). */
static sbp_train_program *build(const char *model, int64_t b, int64_t t,
                                const sbp_train_options *o, ir_graph **g, ir_diag *d)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", SBP_FIXTURES_DIR, model);
    ir_diag_init(d, model);
    const sbp_flow_options fo = {.pass = {.batch = b, .seq_len = t, .verify = true},
                                 .objective = SBP_OBJECTIVE_SFT,
                                 .train = *o};
    sbp_flow f = {.path = path};
    int rc = sbp_flow_run(&f, &fo, d, NULL);
    *g = f.g;
    if (rc != IR_OK)
        print_diag(d);
    assert_int_equal(rc, IR_OK);
    assert_non_null(f.program);
    return f.program;
}

/* (a), (b) with workspace <= bound x lower bound, (c) on one program; returns planned / lower
 * bound. */
static double check_plan(const sbp_train_program *p, const char *label, double bound)
{
    ir_diag d;
    ir_diag_init(&d, label);
    int rc = memplan_verify(p, &d);
    if (rc == IR_OK)
        rc = sbp_train_verify(p, &d); /* the loops still cover their rows after the rewrite */
    if (rc != IR_OK)
        print_diag(&d);
    assert_int_equal(rc, IR_OK);
    ir_diag_free(&d);
    memplan *m = memplan_analyze(p);
    assert_non_null(m);
    /* (a) once more, here: every pair of buffers live together is apart */
    int pairs = 0;
    for (int i = 0; i < p->n_bufs; i++) {
        if (!m->bytes[i] || m->lv.hull[i].first < 0)
            continue;
        size_t oi = p->bufs[i]->offset;
        assert_true(oi % MEMPLAN_ALIGN == 0);
        assert_true(oi + m->bytes[i] <= p->workspace_bytes);
        for (int j = i + 1; j < p->n_bufs; j++) {
            if (!m->bytes[j] || m->lv.hull[j].first < 0 || !memplan_live_together(&m->lv, i, j))
                continue;
            pairs++;
            size_t oj = p->bufs[j]->offset;
            if (oi < oj + m->bytes[j] && oj < oi + m->bytes[i])
                print_message("  %s: %s and %s overlap\n", label, p->bufs[i]->name,
                              p->bufs[j]->name);
            assert_false(oi < oj + m->bytes[j] && oj < oi + m->bytes[i]);
        }
    }
    assert_true(pairs > 0);
    /* (b) */
    assert_true(m->lower_bound > 0);
    assert_true(p->workspace_bytes >= m->lower_bound);
    double ratio = (double)p->workspace_bytes / (double)m->lower_bound;
    assert_true(ratio <= bound);
    /* (c) explicit zeroing: no span left; each gradient's first access makes it whole */
    bool *seen = calloc((size_t)p->n_bufs + 1, sizeof *seen);
    assert_non_null(seen);
    for (int i = 0; i < m->s.n_acc; i++) {
        const mp_access *a = &m->s.acc[i];
        if (seen[a->buf])
            continue;
        seen[a->buf] = true;
        if (p->bufs[a->buf]->is_grad && m->bytes[a->buf]) {
            if (a->role != MP_W && a->role != MP_P)
                print_message("  %s: gradient %s first used at %s without a zero\n", label,
                              p->bufs[a->buf]->name, memplan_pos_name(m, a->pos));
            assert_true(a->role == MP_W || a->role == MP_P);
        }
    }
    free(seen);
    for (int bi = 0; bi < p->n_blocks; bi++)
        for (int i = 0; i < p->blocks[bi]->n_insts; i++) {
            const tp_inst *in = &p->blocks[bi]->insts[i];
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++)
                assert_false(in->buf[j] >= 0 && p->bufs[in->buf[j]]->span);
        }
    print_message("  %-32s workspace %9zu  lower bound %9zu  ratio %.3f  %4d positions "
                  "%3d loops\n",
                  label,
                  p->workspace_bytes, m->lower_bound, ratio, m->n_pos, m->s.n_loops);
    return ratio;
}

/* The start-order peak over the eight-order peak on the fixture programs, at most. Measured
 * worst: 2.366 (tiny_llama T=256 checkpoint; the fixtures' checkpoint plans 2.14 to 2.34, stream
 * 1.36 to 1.73, store 1.00 to 1.02). The start-order pass frees a buffer only after the last
 * position of its hull, so a checkpointed activation, live in the forward and again from its
 * recompute in the backward, keeps its bytes in between, and checkpoint saves nothing there
 * (its plan is then larger than store's); the eight orders place by ranges and reach the lower
 * bound. This bound is a little above the measured worst: it pins the present behaviour
 * down, it does not say the loss is acceptable. */
#define START_ORDER_FIXTURE_RATIO 2.5

/* Plans p again through the start-order path (mp_offset_options.start_order) on the schedule
 * and lifetimes sbp_memplan left (its zeroing rewrite done), writes the offsets into p as
 * sbp_memplan does, and runs check_plan on them; returns the new workspace over the old. */
static double replan_start_order(sbp_train_program *p, const char *label)
{
    size_t before = p->workspace_bytes;
    memplan *m = memplan_analyze(p);
    assert_non_null(m);
    size_t *off = calloc((size_t)p->n_bufs + 1, sizeof *off);
    assert_non_null(off);
    size_t peak = memplan_assign_offsets(p->n_bufs, m->bytes, &m->lv, off,
                                         &(mp_offset_options){.start_order = true});
    assert_true(peak != (size_t)-1);
    for (int i = 0; i < p->n_bufs; i++)
        if (p->bufs[i]->kind == TP_BUF_WS)
            p->bufs[i]->offset = off[i];
    free(off);
    p->workspace_bytes = peak < MEMPLAN_ALIGN ? MEMPLAN_ALIGN : peak;
    char l2[160];
    snprintf(l2, sizeof l2, "%s (start order)", label);
    /* against the lower bound: the eight orders' 1.1, times the start order's allowance */
    check_plan(p, l2, 1.1 * START_ORDER_FIXTURE_RATIO);
    double r = (double)p->workspace_bytes / (double)before;
    assert_true(r <= START_ORDER_FIXTURE_RATIO);
    return r;
}

static void test_fixture_plans(void **state)
{
    (void)state;
    double worst = 0, worst_start = 0;
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        size_t ws[sizeof strategies / sizeof strategies[0]];
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
            ir_graph *g;
            ir_diag d;
            sbp_train_program *p =
                build(models[mi].model, models[mi].b, models[mi].t, &strategies[si].opt, &g, &d);
            char label[128];
            snprintf(label, sizeof label, "%.*s %s",
                     (int)(strchr(models[mi].model, '.') - models[mi].model), models[mi].model,
                     strategies[si].label);
            double r = check_plan(p, label, 1.1);
            worst = r > worst ? r : worst;
            ws[si] = p->workspace_bytes;
            double r1 = replan_start_order(p, label);
            worst_start = r1 > worst_start ? r1 : worst_start;
            ir_graph_free(g);
            ir_diag_free(&d);
        }
        /* recomputation pays: checkpoint and stream need less than store */
        assert_true(ws[1] < ws[0]);
        assert_true(ws[2] < ws[0]);
    }
    print_message("  worst planned / lower bound over the fixtures: %.3f\n", worst);
    print_message("  worst start-order / eight-order workspace over the fixtures: %.3f\n",
                  worst_start);
}

/* A longer sequence (the bundled example model, V = 256, up to 256 positions), where the chunk
 * loops run many iterations: stream needs less than checkpoint, which needs less than store. */
static void test_long_sequence(void **state)
{
    (void)state;
    const sbp_train_options opts[3] = {
        {.strategy = SBP_STRATEGY_STORE},
        {.strategy = SBP_STRATEGY_CHECKPOINT},
        {.strategy = SBP_STRATEGY_STREAM, .chunk = 32, .logits_chunk = 64},
    };
    size_t ws[3];
    for (int k = 0; k < 3; k++) {
        ir_graph *g;
        ir_diag d;
        sbp_train_program *p = build("../../examples/tiny_llama.onnx", 2, 256, &opts[k], &g, &d);
        check_plan(p, "tiny_llama T=256", 1.1);
        ws[k] = p->workspace_bytes;
        replan_start_order(p, "tiny_llama T=256");
        ir_graph_free(g);
        ir_diag_free(&d);
    }
    assert_true(ws[1] < ws[0]);
    assert_true(ws[2] < ws[1]);
}

/* ------------------------------------------------------------------ the report and the plot */

/* A small XML check: declarations, elements properly nested and closed, quoted attributes. */
static bool well_formed_xml(const char *s)
{
    const char *stack[64];
    size_t len[64];
    int depth = 0, roots = 0;
    while (*s) {
        if (*s != '<') {
            if (*s == '>')
                return false;
            s++;
            continue;
        }
        if (s[1] == '?') {
            const char *e = strstr(s, "?>");
            if (!e)
                return false;
            s = e + 2;
            continue;
        }
        bool close = s[1] == '/';
        const char *name = s + (close ? 2 : 1);
        size_t n = strcspn(name, " \t\n/>");
        if (n == 0)
            return false;
        const char *p = name + n;
        bool in_quote = false;
        while (*p && (in_quote || *p != '>')) {
            if (*p == '"')
                in_quote = !in_quote;
            if (in_quote && *p == '<')
                return false;
            p++;
        }
        if (!*p)
            return false;
        bool self = p[-1] == '/';
        if (close) {
            if (depth == 0 || len[depth - 1] != n || strncmp(stack[depth - 1], name, n) != 0)
                return false;
            depth--;
        } else if (!self) {
            if (depth == 64)
                return false;
            if (depth == 0)
                roots++;
            stack[depth] = name;
            len[depth++] = n;
        }
        s = p + 1;
    }
    return depth == 0 && roots == 1;
}

static void test_report_and_plot(void **state)
{
    (void)state;
    const sbp_train_options opts[3] = {
        {.strategy = SBP_STRATEGY_STORE},
        {.strategy = SBP_STRATEGY_CHECKPOINT},
        {.strategy = SBP_STRATEGY_STREAM, .chunk = 16, .logits_chunk = 32},
    };
    ir_graph *g[3];
    ir_diag d[3];
    sbp_report_entry e[4];
    for (int k = 0; k < 3; k++) {
        sbp_train_program *p = build("qwen3_op17_dyn.onnx", 2, 64, &opts[k], &g[k], &d[k]);
        e[k] = (sbp_report_entry){sbp_strategy_name(opts[k].strategy), p, NULL};
    }
    e[3] = (sbp_report_entry){"other", NULL, "not built for this test"};
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    assert_non_null(f);
    ir_diag rd;
    ir_diag_init(&rd, "report");
    assert_int_equal(sbp_report_write(f, e, 4, 1, &rd), IR_OK);
    fclose(f);
    fputs(text, stdout);
    const char *must[] = {"parameters", "gradients", "optimizer state (AdamW m, v)",
                          "workspace, planned", "liveness lower bound", "layer checkpoints",
                          "K/V", "per-chunk scratch", "largest workspace buffers (checkpoint)",
                          "store", "checkpoint", "stream", "other: not built"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        if (!strstr(text, must[i]))
            print_message("report lacks '%s'\n", must[i]);
        assert_non_null(strstr(text, must[i]));
    }
    /* the figures: each strategy's workspace, lower bound, parameter bytes, on their rows */
    const char *ws_row = strstr(text, "workspace, planned");
    const char *lb_row = strstr(text, "workspace, liveness lower bound");
    const char *par_row = strstr(text, "parameters");
    assert_true(ws_row && lb_row && par_row);
    for (int k = 0; k < 3; k++) {
        memplan *m = memplan_analyze(e[k].p);
        assert_non_null(m);
        char num[64];
        snprintf(num, sizeof num, " %zu", e[k].p->workspace_bytes);
        const char *nl = strchr(ws_row, '\n');
        const char *hit = strstr(ws_row, num);
        assert_true(hit && hit < nl);
        snprintf(num, sizeof num, " %zu", m->lower_bound);
        nl = strchr(lb_row, '\n');
        hit = strstr(lb_row, num);
        assert_true(hit && hit < nl);
        snprintf(num, sizeof num, " %zu", e[k].p->param_elems * 4);
        nl = strchr(par_row, '\n');
        hit = strstr(par_row, num);
        assert_true(hit && hit < nl);
    }
    /* the stream column has per-chunk scratch, the store column has none */
    const char *chunk_row = strstr(text, "per-chunk scratch");
    long v[3];
    assert_int_equal(sscanf(chunk_row + strlen("per-chunk scratch"), "%ld %ld %ld", &v[0], &v[1],
                            &v[2]),
                     3);
    assert_int_equal(v[0], 0);
    assert_true(v[2] > 0);
    free(text);

    char path[1024];
    snprintf(path, sizeof path, "%s/plot.svg", SBP_MEMPLAN_OUT);
    f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(sbp_report_plot_svg(f, e, 4, &rd), IR_OK);
    fclose(f);
    f = fopen(path, "r");
    assert_non_null(f);
    char *svg = calloc(1, 1 << 22);
    size_t n = fread(svg, 1, (1 << 22) - 1, f);
    fclose(f);
    assert_true(n > 0 && n < (1 << 22) - 1);
    assert_true(strncmp(svg, "<?xml", 5) == 0);
    assert_non_null(strstr(svg, "<svg"));
    int lines = 0;
    for (const char *s = svg; (s = strstr(s, "<polyline")); s++)
        lines++;
    assert_int_equal(lines, 3);
    assert_non_null(strstr(svg, "schedule position"));
    assert_non_null(strstr(svg, "workspace bytes live"));
    assert_non_null(strstr(svg, ">store: arena"));
    assert_non_null(strstr(svg, ">stream: arena"));
    assert_true(well_formed_xml(svg));
    free(svg);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "command -v python3 >/dev/null 2>&1 || exit 0; python3 -c 'import sys, "
             "xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])' %s",
             path);
    assert_int_equal(system(cmd), 0);
    ir_diag_free(&rd);
    for (int k = 0; k < 3; k++) {
        ir_graph_free(g[k]);
        ir_diag_free(&d[k]);
    }
}

/* `test_memplan` runs the unit tests; `test_memplan scale` the large schedules alone, a ctest
 * of their own (memplan.scale) with a TIMEOUT that says how long "completes at all" may take. */
int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roles_table),
        cmocka_unit_test(test_args_column),
        cmocka_unit_test(test_loop_accumulator),
        cmocka_unit_test(test_loop_carried_and_after),
        cmocka_unit_test(test_malformed_loops),
        cmocka_unit_test(test_random_schedules),
        cmocka_unit_test(test_start_order_random),
        cmocka_unit_test(test_program_with_loop),
        cmocka_unit_test(test_fixture_plans),
        cmocka_unit_test(test_long_sequence),
        cmocka_unit_test(test_report_and_plot),
    };
    const struct CMUnitTest scale[] = {
        cmocka_unit_test(test_start_order_switch),
        cmocka_unit_test(test_start_order_scale),
    };
    if (argc > 1 && strcmp(argv[1], "scale") == 0)
        return cmocka_run_group_tests_name("memplan scale", scale, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
