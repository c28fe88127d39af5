/* memplan.c — buffer lifetimes and offsets in one workspace arena (see memplan.h).
 *
 * Approach, in order:
 *   1. roles      a table, one row per kernel of train_kernels.def (a missing or short row is a
 *                 build error below), gives each buffer operand's role; a few depend on the
 *                 call's scalar arguments (GEMM's beta, copy_cols' accumulate flag, byte counts);
 *   2. linearise  every instruction of every block, in execution order, gets a position; each
 *                 workspace operand is an access (duplicates within one call merged);
 *   3. zeroing    the builder's region-wide gradient zeroing (span buffers) becomes one
 *                 MEMSET_ZERO per gradient buffer before its first contribution;
 *   4. liveness   ranges from a whole write to the last read of that value, widened to whole
 *                 loops where a value crosses iterations;
 *   5. offsets    a heap simulation (best fit / first fit, several placement orders; the
 *                 smallest peak wins), 64-byte aligned;
 *   6. check      in builds without NDEBUG: a brute-force overlap test and a simulated run.
 * The abstract part (liveness, offsets, simulation on an mp_schedule) does not know about
 * training programs, so tests can hand it schedules with loops of any shape.
 */
#include "memplan.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- 1. roles
 *
 * One row per kernel, one letter per buffer operand, in the kernel's operand order (outputs
 * first, as runtime/sbprt.h orders them): r read, w written whole, a accumulated (+=), p partly
 * written; g GEMM's c (beta), c copy_cols' dst, z a byte-count destination (memplan.h).
 * A kernel added to train_kernels.def without a row here fails the build at the
 * _Static_assert below ("ROLES_<KERNEL> undeclared"); give it a row.
 */
#define ROLES_MEMSET_ZERO   "z"
#define ROLES_COPY          "zr"
#define ROLES_GEMM          "grr"
#define ROLES_BIAS_ADD      "ar"        /* y += bias */
#define ROLES_BIAS_BACKWARD "ar"
#define ROLES_ADD           "wrr"
#define ROLES_ACCUMULATE    "ar"
#define ROLES_SCALE         "wr"        /* out, x (the constant is an argument) */
#define ROLES_SCALE_ACCUMULATE "ar"
#define ROLES_DIV_SCALAR    "wr"
#define ROLES_DIV_SCALAR_ACCUMULATE "ar"
#define ROLES_EMBEDDING_FWD "wrr"
#define ROLES_EMBEDDING_BWD "arr"
#define ROLES_LAYERNORM_FWD "wwwrrr"    /* out, mean, rstd, x, gamma, beta */
#define ROLES_LAYERNORM_BWD "aaarrrrr"  /* dx, dgamma, dbeta, dout, x, gamma, mean, rstd */
#define ROLES_RMSNORM_FWD   "wwrr"
#define ROLES_RMSNORM_BWD   "aarrrr"
#define ROLES_GELU_TANH_FWD "wr"
#define ROLES_GELU_TANH_BWD "arr"
#define ROLES_GELU_ERF_FWD  "wr"
#define ROLES_GELU_ERF_BWD  "arr"
#define ROLES_SILU_FWD      "wr"
#define ROLES_SILU_BWD      "arr"
#define ROLES_RELU_FWD      "wr"
#define ROLES_RELU_BWD      "arr"       /* dx, dout, x or y (the rule passes what it keeps) */
#define ROLES_TANH_FWD      "wr"
#define ROLES_TANH_BWD      "arr"       /* dx, dout, y (the forward's output) */
#define ROLES_SWIGLU_FWD    "wrr"
#define ROLES_SWIGLU_BWD    "aarrr"
#define ROLES_ROPE_FWD      "wrrrr"     /* out, x, pos, cos, sin */
#define ROLES_ROPE_BWD      "arrrr"
#define ROLES_ATTENTION_FWD "wwrrr"     /* out, lse, q, k, v */
#define ROLES_ATTENTION_BWD "aaarrrrrr" /* dq, dk, dv, dout, q, k, v, out, lse */
#define ROLES_CROSS_ENTROPY "awrr"      /* loss_sum +=, dlogits = (ignored rows 0), logits, labels */
#define ROLES_PERMUTE_FWD   "wr"
#define ROLES_PERMUTE_BWD   "ar"
#define ROLES_COPY_COLS     "cr"
#define ROLES_BROADCAST_FWD "wrr"
#define ROLES_BROADCAST_BWD "aarrr"
#define ROLES_LOGPROB_FWD   "wwrr"      /* logp, lse, logits, labels */
#define ROLES_LOGPROB_GRAD  "wrrrr"     /* dlogits = (ignored rows 0), dlogp, logits, labels, lse */
#define ROLES_GRPO_LOSS     "awrrr"     /* loss_sum +=, dlogp =, logp, labels, row weights */
#define ROLES_GRPO_WEIGHTS  "wr"        /* row weights, labels (host step) */
#define ROLES_DPO_COEF      "wwr"       /* coefficients per token, loss, logp per token (host) */

#define K(e, nb, na, call)                                                                     \
    _Static_assert(sizeof(ROLES_##e) == (nb) + 1,                                              \
                   "memplan.c: the operand-role row of kernel " #e " needs one letter per "    \
                   "buffer operand");
#include "train_kernels.def"
#undef K

static const char *const kernel_roles[TP_K_COUNT] = {
#define K(e, nb, na, call) [TP_K_##e] = ROLES_##e,
#include "train_kernels.def"
#undef K
};

const char *memplan_kernel_roles(tp_kernel k)
{
    return (int)k >= 0 && k < TP_K_COUNT ? kernel_roles[k] : NULL;
}

/* Scalar argument i as a number; false for an expression or a list. */
static bool arg_num(const tp_inst *in, int i, double *x)
{
    const tp_arg *a = &in->arg[i];
    if (a->kind == TP_ARG_INT)
        *x = (double)a->i;
    else if (a->kind == TP_ARG_FLOAT)
        *x = a->f;
    else
        return false;
    return true;
}

mp_role memplan_operand_role(const tp_inst *in, int op, size_t buf_bytes)
{
    const char *r = memplan_kernel_roles(in->k);
    if (!r || op < 0 || op >= (int)strlen(r))
        return MP_A; /* cannot happen for a built program; the safe answer */
    double x, rows, w, ld, off;
    switch (r[op]) {
    case 'r': return MP_R;
    case 'w': return MP_W;
    case 'p': return MP_P;
    case 'g': return arg_num(in, 6, &x) && x == 0 ? MP_W : MP_A;
    case 'c':
        if (!arg_num(in, 6, &x) || x != 0)
            return MP_A;
        if (arg_num(in, 0, &rows) && arg_num(in, 1, &w) && arg_num(in, 2, &ld) &&
            arg_num(in, 3, &off) && off == 0 && w == ld && rows * w * 4 >= (double)buf_bytes)
            return MP_W;
        return MP_P;
    case 'z': return arg_num(in, 0, &x) && x >= (double)buf_bytes ? MP_W : MP_P;
    default: return MP_A;
    }
}

static bool role_reads(mp_role r) { return r == MP_R || r == MP_A; }
static bool role_writes(mp_role r) { return r != MP_R; }

/* Two accesses of one call to the same buffer as one. */
static mp_role merge_roles(mp_role a, mp_role b)
{
    if ((role_reads(a) || role_reads(b)) && (role_writes(a) || role_writes(b)))
        return MP_A;
    if (a == MP_R && b == MP_R)
        return MP_R;
    return a == MP_W || b == MP_W ? MP_W : MP_P;
}

static size_t align_up(size_t x) { return (x + MEMPLAN_ALIGN - 1) / MEMPLAN_ALIGN * MEMPLAN_ALIGN; }

/* ---------------------------------------------------------------- 4. liveness (abstract) */

static bool loop_contains(const mp_loop *l, int pos) { return l->first <= pos && pos <= l->last; }

static int check_loops(const mp_schedule *s)
{
    for (int i = 0; i < s->n_loops; i++) {
        const mp_loop *a = &s->loops[i];
        if (a->first < 0 || a->last < a->first || a->last >= s->n_pos)
            return IR_ERR;
        for (int j = 0; j < i; j++) {
            const mp_loop *b = &s->loops[j];
            bool disjoint = a->last < b->first || b->last < a->first;
            bool nested = (a->first <= b->first && b->last <= a->last) ||
                          (b->first <= a->first && a->last <= b->last);
            if (!disjoint && !nested)
                return IR_ERR;
        }
    }
    for (int i = 1; i < s->n_acc; i++)
        if (s->acc[i].pos < s->acc[i - 1].pos)
            return IR_ERR;
    return IR_OK;
}

/* Accesses of each buffer in position order: acc indices list[start[b] .. start[b+1]). */
static int by_buffer(const mp_schedule *s, int **start_out, int **list_out)
{
    int *start = calloc((size_t)s->n_bufs + 2, sizeof *start);
    int *list = malloc(sizeof *list * (size_t)(s->n_acc + 1));
    int *fill = calloc((size_t)s->n_bufs + 1, sizeof *fill);
    if (!start || !list || !fill) {
        free(start);
        free(list);
        free(fill);
        return IR_ERR;
    }
    for (int i = 0; i < s->n_acc; i++)
        start[s->acc[i].buf + 1]++;
    for (int b = 0; b < s->n_bufs; b++)
        start[b + 1] += start[b];
    for (int i = 0; i < s->n_acc; i++) {
        int b = s->acc[i].buf;
        list[start[b] + fill[b]++] = i;
    }
    free(fill);
    *start_out = start;
    *list_out = list;
    return IR_OK;
}

/* A growing array of ranges, per buffer in ascending order. */
typedef struct rangevec {
    mp_interval *r;
    int *buf;
    int n, cap;
} rangevec;

static int rv_push(rangevec *v, int b, int first, int last)
{
    if (v->n == v->cap) {
        int nc = v->cap ? 2 * v->cap : 64;
        mp_interval *r = realloc(v->r, sizeof *r * (size_t)nc);
        if (r)
            v->r = r;
        int *bb = realloc(v->buf, sizeof *bb * (size_t)nc);
        if (bb)
            v->buf = bb;
        if (!r || !bb)
            return IR_ERR;
        v->cap = nc;
    }
    v->r[v->n] = (mp_interval){first, last};
    v->buf[v->n++] = b;
    return IR_OK;
}

int memplan_liveness(const mp_schedule *s, ir_arena *arena, mp_liveness *out)
{
    memset(out, 0, sizeof *out);
    if (check_loops(s) != IR_OK)
        return IR_ERR;
    int *start = NULL, *list = NULL;
    if (by_buffer(s, &start, &list) != IR_OK)
        return IR_ERR;
    int *order = malloc(sizeof *order * (size_t)(s->n_loops + 1));
    rangevec v = {0};
    int rc = order ? IR_OK : IR_ERR;

    /* inner loops first (by length; a nested loop is never longer than its parent) */
    for (int i = 0; i < s->n_loops && order; i++)
        order[i] = i;
    for (int i = 1; i < s->n_loops && order; i++) { /* insertion sort: few loops */
        int x = order[i], j = i;
        int lx = s->loops[x].last - s->loops[x].first;
        while (j > 0 && s->loops[order[j - 1]].last - s->loops[order[j - 1]].first > lx) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = x;
    }

    /* per buffer: ranges split where a whole write kills the value, then widened over loops
     * the value crosses, then merged where they meet */
    mp_interval *tmp = malloc(sizeof *tmp * (size_t)(s->n_acc + 1));
    if (!tmp)
        rc = IR_ERR;
    for (int b = 0; b < s->n_bufs && rc == IR_OK; b++) {
        int n = 0;
        for (int k = start[b]; k < start[b + 1]; k++) {
            const mp_access *a = &s->acc[list[k]];
            if (n == 0 || a->role == MP_W)
                tmp[n++] = (mp_interval){a->pos, a->pos};
            else
                tmp[n - 1].last = a->pos;
        }
        if (n && s->live_out && s->live_out[b])
            tmp[n - 1].last = s->n_pos - 1;
        for (bool changed = n > 0 && s->n_loops > 0; changed;) {
            changed = false;
            for (int ko = 0; ko < s->n_loops; ko++) {
                const mp_loop *L = &s->loops[order[ko]];
                for (int r = 0; r < n; r++) {
                    if (tmp[r].last < L->first || tmp[r].first > L->last)
                        continue;
                    if (tmp[r].first <= L->first && tmp[r].last >= L->last)
                        continue; /* already over the whole loop */
                    /* the range's first access inside the body */
                    int lo = tmp[r].first > L->first ? tmp[r].first : L->first;
                    int hi = tmp[r].last < L->last ? tmp[r].last : L->last;
                    const mp_access *first = NULL;
                    for (int k = start[b]; k < start[b + 1]; k++) {
                        const mp_access *a = &s->acc[list[k]];
                        if (a->pos >= lo && a->pos <= hi) {
                            first = a;
                            break;
                        }
                    }
                    /* no access in the body: the range passes through (or it is the live-out
                     * tail); a whole write first: the value is made in this iteration */
                    if (!first || (first->role == MP_W && first->pos == tmp[r].first))
                        continue;
                    if (tmp[r].first > L->first)
                        tmp[r].first = L->first;
                    if (tmp[r].last < L->last)
                        tmp[r].last = L->last;
                    changed = true;
                }
                /* merge ranges that now meet (they stay sorted by first) */
                int w = 0;
                for (int r = 0; r < n; r++) {
                    if (w > 0 && tmp[r].first <= tmp[w - 1].last) {
                        if (tmp[r].last > tmp[w - 1].last)
                            tmp[w - 1].last = tmp[r].last;
                    } else {
                        tmp[w++] = tmp[r];
                    }
                }
                n = w;
            }
        }
        for (int r = 0; r < n && rc == IR_OK; r++)
            rc = rv_push(&v, b, tmp[r].first, tmp[r].last);
    }

    if (rc == IR_OK) {
        out->n_bufs = s->n_bufs;
        out->n_ranges = v.n;
        out->start = ir_arena_calloc(arena, (size_t)s->n_bufs + 1, sizeof *out->start);
        out->range = ir_arena_calloc(arena, (size_t)v.n + 1, sizeof *out->range);
        out->hull = ir_arena_calloc(arena, (size_t)s->n_bufs + 1, sizeof *out->hull);
        out->iter_loop = ir_arena_calloc(arena, (size_t)s->n_bufs + 1, sizeof *out->iter_loop);
        if (!out->start || !out->range || !out->hull || !out->iter_loop)
            rc = IR_ERR;
    }
    if (rc == IR_OK) {
        for (int b = 0; b < s->n_bufs; b++)
            out->hull[b] = (mp_interval){-1, -1};
        for (int i = 0; i < v.n; i++) {
            int b = v.buf[i];
            out->range[i] = v.r[i];
            out->start[b + 1]++;
            if (out->hull[b].first < 0)
                out->hull[b].first = v.r[i].first;
            out->hull[b].last = v.r[i].last;
        }
        for (int b = 0; b < s->n_bufs; b++)
            out->start[b + 1] += out->start[b];
        /* per-chunk scratch: every range lies inside one iteration of a loop, i.e. inside
         * the innermost loop holding it and begins with a whole write (was not widened) */
        for (int b = 0; b < s->n_bufs; b++) {
            out->iter_loop[b] = -1;
            bool all = out->start[b] < out->start[b + 1];
            int first_loop = -1;
            for (int r = out->start[b]; r < out->start[b + 1] && all; r++) {
                const mp_interval *rg = &out->range[r];
                int in = -1;
                for (int ko = 0; ko < s->n_loops && in < 0; ko++) {
                    const mp_loop *L = &s->loops[order[ko]];
                    if (loop_contains(L, rg->first) && loop_contains(L, rg->last))
                        in = order[ko];
                }
                bool w = false;
                for (int k = start[b]; k < start[b + 1] && !w; k++) {
                    const mp_access *a = &s->acc[list[k]];
                    w = a->pos == rg->first && a->role == MP_W;
                }
                all = in >= 0 && w;
                if (first_loop < 0)
                    first_loop = in;
            }
            if (all)
                out->iter_loop[b] = first_loop;
        }
    }
    free(tmp);
    free(v.r);
    free(v.buf);
    free(order);
    free(start);
    free(list);
    return rc;
}

size_t memplan_live_bytes(const mp_schedule *s, const mp_liveness *lv, size_t *live)
{
    size_t *d = calloc((size_t)s->n_pos + 1, sizeof *d);
    size_t *l = live ? live : calloc((size_t)s->n_pos + 1, sizeof *l);
    size_t most = 0;
    if (!d || !l) {
        free(d);
        if (!live)
            free(l);
        return 0;
    }
    /* a difference array in unsigned arithmetic: wraps, but every prefix sum is exact */
    for (int b = 0; b < s->n_bufs; b++) {
        if (!s->bytes[b])
            continue;
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++) {
            d[lv->range[r].first] += s->bytes[b];
            d[lv->range[r].last + 1] -= s->bytes[b];
        }
    }
    size_t run = 0;
    for (int q = 0; q < s->n_pos; q++) {
        run += d[q];
        l[q] = run;
        if (run > most)
            most = run;
    }
    free(d);
    if (!live)
        free(l);
    return most;
}

bool memplan_live_together(const mp_liveness *lv, int a, int b)
{
    int i = lv->start[a], j = lv->start[b];
    while (i < lv->start[a + 1] && j < lv->start[b + 1]) {
        const mp_interval *x = &lv->range[i], *y = &lv->range[j];
        if (x->first <= y->last && y->first <= x->last)
            return true;
        if (x->last < y->last)
            i++;
        else
            j++;
    }
    return false;
}

/* ---------------------------------------------------------------- 5. offsets */

typedef struct place_ctx {
    const size_t *bytes;
    const mp_liveness *lv;
    const double *len; /* [n] positions live */
    int key;
} place_ctx;

static place_ctx g_pc; /* qsort has no context argument; planning is single-threaded */

static int cmp_order(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    const size_t *sz = g_pc.bytes;
    const mp_interval *h = g_pc.lv->hull;
    double la = g_pc.len[a], lb = g_pc.len[b];
    double ka = 0, kb = 0;
    switch (g_pc.key) {
    case 0: ka = (double)sz[a]; kb = (double)sz[b]; break;             /* size, descending */
    case 1: ka = -(double)h[a].first; kb = -(double)h[b].first; break; /* start, ascending */
    case 2: ka = (double)sz[a] * la; kb = (double)sz[b] * lb; break;   /* area, descending */
    default: ka = la; kb = lb; break;                                  /* duration, descending */
    }
    if (ka != kb)
        return ka > kb ? -1 : 1;
    if (sz[a] != sz[b])
        return sz[a] > sz[b] ? -1 : 1;
    if (h[a].first != h[b].first)
        return h[a].first < h[b].first ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* One heap simulation: buffers in `order`, each at the best-fitting (or first) gap among the
 * placed buffers it is live together with. placed[] keeps the placed buffers sorted by offset,
 * so the gaps are found in one pass. Returns the peak. */
static size_t place(int n, const int *order, const size_t *bytes, const mp_liveness *lv,
                    bool best_fit, size_t *offset, int *placed)
{
    size_t peak = 0;
    for (int k = 0; k < n; k++) {
        int b = order[k];
        const mp_interval *hb = &lv->hull[b];
        size_t best = (size_t)-1, best_gap = (size_t)-1, end = 0;
        for (int j = 0; j < k; j++) {
            int c = placed[j];
            const mp_interval *hc = &lv->hull[c];
            if (hb->first > hc->last || hc->first > hb->last || !memplan_live_together(lv, b, c))
                continue;
            if (offset[c] > end) {
                size_t gap = offset[c] - end;
                if (gap >= bytes[b] && (best_fit ? gap < best_gap : best == (size_t)-1)) {
                    best = end;
                    best_gap = gap;
                    if (!best_fit || gap == bytes[b])
                        break; /* nothing fits better */
                }
            }
            if (offset[c] + bytes[c] > end)
                end = offset[c] + bytes[c];
        }
        size_t at = best != (size_t)-1 ? best : end;
        offset[b] = at;
        if (at + bytes[b] > peak)
            peak = at + bytes[b];
        int lo = 0, hi = k; /* insert b by offset */
        while (lo < hi) {
            int mid = lo + (hi - lo) / 2;
            if (offset[placed[mid]] <= at)
                lo = mid + 1;
            else
                hi = mid;
        }
        memmove(placed + lo + 1, placed + lo, sizeof *placed * (size_t)(k - lo));
        placed[lo] = b;
    }
    return peak;
}

size_t memplan_assign_offsets(int n, const size_t *bytes, const mp_liveness *lv, size_t *offset)
{
    int *order = malloc(sizeof *order * (size_t)(n + 1));
    size_t *trial = malloc(sizeof *trial * (size_t)(n + 1));
    int *tmp = malloc(sizeof *tmp * (size_t)(n + 1));
    double *len = calloc((size_t)n + 1, sizeof *len);
    for (int b = 0; b < n; b++)
        offset[b] = 0;
    if (!order || !trial || !tmp || !len) {
        free(order);
        free(trial);
        free(tmp);
        free(len);
        return (size_t)-1;
    }
    int m = 0;
    for (int b = 0; b < n; b++) {
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++)
            len[b] += lv->range[r].last - lv->range[r].first + 1;
        if (lv->start[b] < lv->start[b + 1] && bytes[b] > 0)
            order[m++] = b;
    }
    size_t best = (size_t)-1;
    for (int key = 0; key < 4; key++) {
        g_pc = (place_ctx){bytes, lv, len, key};
        qsort(order, (size_t)m, sizeof *order, cmp_order);
        for (int fit = 0; fit < 2; fit++) {
            size_t peak = place(m, order, bytes, lv, fit == 0, trial, tmp);
            if (peak < best) {
                best = peak;
                for (int k = 0; k < m; k++)
                    offset[order[k]] = trial[order[k]];
            }
        }
    }
    free(order);
    free(trial);
    free(tmp);
    free(len);
    return m ? best : 0;
}

/* ---------------------------------------------------------------- 6. simulation */

enum { SIM_UNSET = 0, SIM_VALID, SIM_GARBAGE, SIM_CLOBBERED };

typedef struct sim {
    const mp_schedule *s;
    const size_t *offset;
    const char *const *names;
    ir_diag *d;
    unsigned char *state; /* [n_bufs] */
    int *by;              /* [n_bufs] the buffer that clobbered it */
    int *pos_acc;         /* [n_pos + 1] first access of each position */
    int errors;
} sim;

static const char *sim_name(const sim *st, int b, char *buf, size_t n)
{
    if (st->names && st->names[b])
        return st->names[b];
    snprintf(buf, n, "#%d", b);
    return buf;
}

static void sim_read(sim *st, int b, int pos)
{
    if (st->state[b] == SIM_VALID)
        return;
    if (st->errors++ >= 8)
        return;
    char n1[32], n2[32];
    if (st->state[b] == SIM_CLOBBERED)
        ir_diag_error(st->d, "memory plan: buffer %s is read at position %d, but %s, planned at "
                             "bytes that overlap it, was written since",
                      sim_name(st, b, n1, sizeof n1), pos, sim_name(st, st->by[b], n2, sizeof n2));
    else
        ir_diag_error(st->d, "memory plan: buffer %s is read at position %d before anything "
                             "writes it",
                      sim_name(st, b, n1, sizeof n1), pos);
}

static void sim_step(sim *st, int pos)
{
    const mp_schedule *s = st->s;
    for (int i = st->pos_acc[pos]; i < st->pos_acc[pos + 1]; i++) {
        const mp_access *a = &s->acc[i];
        if (!s->bytes[a->buf])
            continue;
        if (a->role == MP_R || (a->role == MP_A && st->state[a->buf] == SIM_CLOBBERED))
            sim_read(st, a->buf, pos);
    }
    for (int i = st->pos_acc[pos]; i < st->pos_acc[pos + 1]; i++) {
        const mp_access *a = &s->acc[i];
        int b = a->buf;
        if (!s->bytes[b] || a->role == MP_R)
            continue;
        if (a->role == MP_A)
            /* accumulating into garbage is harmless until something reads the result */
            st->state[b] = st->state[b] == SIM_VALID ? SIM_VALID : SIM_GARBAGE;
        else
            st->state[b] = SIM_VALID;
        size_t lo = st->offset[b], hi = lo + s->bytes[b];
        for (int c = 0; c < s->n_bufs; c++) {
            if (c == b || !s->bytes[c])
                continue;
            /* garbage stays garbage; only a value can be lost */
            if (st->offset[c] < hi && lo < st->offset[c] + s->bytes[c] &&
                st->state[c] == SIM_VALID) {
                st->state[c] = SIM_CLOBBERED;
                st->by[c] = b;
            }
        }
    }
}

static void sim_range(sim *st, const mp_loop *loops, int n_loops, int lo, int hi, int from)
{
    for (int pos = lo; pos <= hi;) {
        int j = -1;
        for (int k = from; k < n_loops; k++)
            if (loops[k].first == pos && loops[k].last <= hi) {
                j = k;
                break;
            }
        if (j < 0) {
            sim_step(st, pos);
            pos++;
            continue;
        }
        for (int it = 0; it < 2; it++)
            sim_range(st, loops, n_loops, loops[j].first, loops[j].last, j + 1);
        pos = loops[j].last + 1;
    }
}

static int cmp_loop(const void *pa, const void *pb)
{
    const mp_loop *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return a->last > b->last ? -1 : a->last < b->last; /* outer first */
}

int memplan_simulate(const mp_schedule *s, const size_t *offset, const char *const *names,
                     ir_diag *d)
{
    if (check_loops(s) != IR_OK)
        return ir_diag_error(d, "memory plan: malformed loops in the schedule");
    sim st = {.s = s, .offset = offset, .names = names, .d = d};
    st.state = calloc((size_t)s->n_bufs + 1, 1);
    st.by = calloc((size_t)s->n_bufs + 1, sizeof *st.by);
    st.pos_acc = calloc((size_t)s->n_pos + 2, sizeof *st.pos_acc);
    mp_loop *loops = malloc(sizeof *loops * (size_t)(s->n_loops + 1));
    if (!st.state || !st.by || !st.pos_acc || !loops) {
        free(st.state);
        free(st.by);
        free(st.pos_acc);
        free(loops);
        return ir_diag_error(d, "out of memory");
    }
    for (int i = 0; i < s->n_acc; i++)
        st.pos_acc[s->acc[i].pos + 1]++;
    for (int q = 0; q < s->n_pos; q++)
        st.pos_acc[q + 1] += st.pos_acc[q];
    if (s->n_loops)
        memcpy(loops, s->loops, sizeof *loops * (size_t)s->n_loops);
    qsort(loops, (size_t)s->n_loops, sizeof *loops, cmp_loop);
    sim_range(&st, loops, s->n_loops, 0, s->n_pos - 1, 0);
    if (s->live_out)
        for (int b = 0; b < s->n_bufs; b++)
            if (s->live_out[b] && s->bytes[b] && st.state[b] != SIM_UNSET)
                sim_read(&st, b, s->n_pos);
    free(st.state);
    free(st.by);
    free(st.pos_acc);
    free(loops);
    return st.errors ? IR_ERR : IR_OK;
}

/* ---------------------------------------------------------------- 2. linearise */

static bool planned(const tp_buf *b) { return b->kind == TP_BUF_WS && !b->span; }

/* The program's chunk loops (train.h: tp_block.loops, instruction ranges of a block) as
 * position ranges; returns how many (out may be NULL to count). */
static int program_loops(const sbp_train_program *p, const int *block_first, mp_loop *out)
{
    int n = 0;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        for (int k = 0; k < blk->n_loops; k++) {
            const tp_loop *l = &blk->loops[k];
            if (l->end <= l->first)
                continue;
            if (out)
                out[n] = (mp_loop){block_first[bi] + l->first, block_first[bi] + l->end - 1};
            n++;
        }
    }
    return n;
}

/* An operand that starts at a chunk's rows inside its buffer (a slice). */
static bool sliced(const tp_inst *in, int op)
{
    return in->off[op].per_row != 0 || in->off[op].per_batch != 0;
}

static memplan *linearize(const sbp_train_program *p)
{
    ir_arena *A = p->g->arena;
    memplan *m = ir_arena_calloc(A, 1, sizeof *m);
    if (!m)
        return NULL;
    m->p = p;
    int n = 0;
    for (int bi = 0; bi < p->n_blocks; bi++)
        n += p->blocks[bi]->n_insts;
    m->n_pos = n;
    m->pos_block = ir_arena_calloc(A, (size_t)n + 1, sizeof *m->pos_block);
    m->pos_inst = ir_arena_calloc(A, (size_t)n + 1, sizeof *m->pos_inst);
    m->block_first = ir_arena_calloc(A, (size_t)p->n_blocks + 1, sizeof *m->block_first);
    m->bytes = ir_arena_calloc(A, (size_t)p->n_bufs + 1, sizeof *m->bytes);
    m->live = ir_arena_calloc(A, (size_t)n + 1, sizeof *m->live);
    mp_access *acc = ir_arena_calloc(A, (size_t)n * TP_MAX_BUFS + 1, sizeof *acc);
    bool *live_out = ir_arena_calloc(A, (size_t)p->n_bufs + 1, sizeof *live_out);
    if (!m->pos_block || !m->pos_inst || !m->block_first || !m->bytes || !m->live || !acc ||
        !live_out)
        return NULL;
    for (int i = 0; i < p->n_bufs; i++)
        if (planned(p->bufs[i]))
            m->bytes[i] = align_up(p->bufs[i]->numel * tp_buf_elem_bytes(p->bufs[i]));
    int pos = 0, na = 0;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        m->block_first[bi] = pos;
        for (int i = 0; i < blk->n_insts; i++, pos++) {
            const tp_inst *in = &blk->insts[i];
            m->pos_block[pos] = bi;
            m->pos_inst[pos] = i;
            int first = na;
            for (int j = 0; j < tp_kernel_table[in->k].n_buf && j < TP_MAX_BUFS; j++) {
                int b = in->buf[j];
                if (b < 0 || b >= p->n_bufs || !planned(p->bufs[b]))
                    continue;
                mp_role r = memplan_operand_role(in, j, p->bufs[b]->numel * 4);
                if (r == MP_W && sliced(in, j))
                    r = MP_P; /* one chunk's rows of it: the other rows are kept */
                int k = first;
                while (k < na && acc[k].buf != b)
                    k++;
                if (k < na)
                    acc[k].role = merge_roles(acc[k].role, r);
                else
                    acc[na++] = (mp_access){pos, b, r};
            }
        }
    }
    m->block_first[p->n_blocks] = pos;
    int nl = program_loops(p, m->block_first, NULL);
    mp_loop *loops = ir_arena_calloc(A, (size_t)nl + 1, sizeof *loops);
    if (!loops)
        return NULL;
    program_loops(p, m->block_first, loops);
    if (p->loss_buf >= 0 && p->loss_buf < p->n_bufs)
        live_out[p->loss_buf] = true; /* copied out by sbp_step_run after the last block */
    m->s = (mp_schedule){.n_pos = n,
                         .n_bufs = p->n_bufs,
                         .bytes = m->bytes,
                         .acc = acc,
                         .n_acc = na,
                         .loops = loops,
                         .n_loops = nl,
                         .live_out = live_out};
    return m;
}

const char *memplan_pos_name(const memplan *m, int pos)
{
    if (pos < 0 || pos >= m->n_pos)
        return pos < 0 ? "-" : "end";
    const sbp_train_program *p = m->p;
    return ir_arena_printf(p->g->arena, "%s:%d", p->blocks[m->pos_block[pos]]->name,
                           m->pos_inst[pos]);
}

/* ---------------------------------------------------------------- 3. gradient zeroing */

typedef struct zero_ins {
    int pos;  /* before the instruction at this position */
    int buf;
    bool hoisted; /* placed before a loop (a different comment) */
} zero_ins;

static bool is_span_zero(const sbp_train_program *p, const tp_inst *in)
{
    return in->k == TP_K_MEMSET_ZERO && in->buf[0] >= 0 && p->bufs[in->buf[0]]->span;
}

/* The outermost loop of s that contains position a and not position z (z = -1: none). */
static int outermost_loop_between(const mp_schedule *s, int z, int a)
{
    int best = -1;
    for (int k = 0; k < s->n_loops; k++) {
        const mp_loop *L = &s->loops[k];
        if (loop_contains(L, a) && (z < 0 || !loop_contains(L, z)) &&
            (best < 0 || L->last - L->first > s->loops[best].last - s->loops[best].first))
            best = k;
    }
    return best;
}

static int rewrite_zeroing(sbp_train_program *p, const memplan *m, ir_diag *d)
{
    const mp_schedule *s = &m->s;
    int nb = p->n_bufs;
    /* per-buffer access lists; at most one zero per access of a gradient */
    int *start = NULL, *list = NULL;
    if (by_buffer(s, &start, &list) != IR_OK)
        return ir_diag_error(d, "out of memory");
    int *zpos = malloc(sizeof *zpos * (size_t)(m->n_pos + 1)); /* span zeroes: positions */
    int *zreg = malloc(sizeof *zreg * (size_t)(m->n_pos + 1)); /* and regions */
    zero_ins *ins = malloc(sizeof *ins * (size_t)(s->n_acc + 1));
    int nz = 0, ni = 0;
    if (!zpos || !zreg || !ins) {
        free(start);
        free(list);
        free(zpos);
        free(zreg);
        free(ins);
        return ir_diag_error(d, "out of memory");
    }
    for (int q = 0; q < m->n_pos; q++) {
        const tp_inst *in = &p->blocks[m->pos_block[q]]->insts[m->pos_inst[q]];
        if (is_span_zero(p, in)) {
            zpos[nz] = q;
            zreg[nz++] = p->bufs[in->buf[0]]->region;
        }
    }

    /* zero points of buffer b: program start (-1), then its region's span zeroes; after each,
     * the first access before the next one decides */
    for (int b = 0; b < nb; b++) {
        const tp_buf *tb = p->bufs[b];
        if (!planned(tb) || !tb->is_grad || !m->bytes[b] || start[b] == start[b + 1])
            continue;
        int z = -1, zi = -1;
        for (;;) {
            int next = -1; /* the next zero point of b's region after z */
            for (int k = zi + 1; k < nz; k++)
                if (zreg[k] == tb->region) {
                    next = k;
                    break;
                }
            int next_pos = next >= 0 ? zpos[next] : m->n_pos;
            for (int i = start[b]; i < start[b + 1]; i++) {
                const mp_access *a = &s->acc[list[i]];
                if (a->pos <= z)
                    continue;
                if (a->pos < next_pos && a->role != MP_W) {
                    int L = outermost_loop_between(s, z, a->pos);
                    ins[ni++] = (zero_ins){L >= 0 ? s->loops[L].first : a->pos, b, L >= 0};
                }
                break;
            }
            if (next < 0)
                break;
            z = zpos[next];
            zi = next;
        }
    }
    free(start);
    free(list);
    free(zpos);
    free(zreg);

    /* rebuild the blocks: span zeroes out, per-buffer zeroes in (by position; equal positions
     * keep buffer order) */
    int *at = calloc((size_t)m->n_pos + 2, sizeof *at);
    if (!at) {
        free(ins);
        return ir_diag_error(d, "out of memory");
    }
    for (int i = 0; i < ni; i++)
        at[ins[i].pos + 1]++;
    for (int q = 0; q < m->n_pos; q++)
        at[q + 1] += at[q];
    zero_ins *sorted = malloc(sizeof *sorted * (size_t)(ni + 1));
    int *fill2 = calloc((size_t)m->n_pos + 1, sizeof *fill2);
    if (!sorted || !fill2) {
        free(ins);
        free(at);
        free(sorted);
        free(fill2);
        return ir_diag_error(d, "out of memory");
    }
    for (int i = 0; i < ni; i++)
        sorted[at[ins[i].pos] + fill2[ins[i].pos]++] = ins[i];
    free(fill2);
    free(ins);
    int rc = IR_OK;
    for (int bi = 0; bi < p->n_blocks && rc == IR_OK; bi++) {
        tp_block *blk = p->blocks[bi];
        int q0 = m->block_first[bi];
        int extra = at[q0 + blk->n_insts] - at[q0];
        int cap = blk->n_insts + extra + 1;
        tp_inst *out = ir_arena_calloc(p->g->arena, (size_t)cap, sizeof *out);
        /* inside[i]: new index of the first instruction that belongs to old instruction i's
         * place inside a loop; after[i]: new index after it (to move the loops) */
        int *inside = malloc(sizeof *inside * (size_t)(blk->n_insts + 1));
        int *after = malloc(sizeof *after * (size_t)(blk->n_insts + 1));
        if (!out || !inside || !after) {
            free(inside);
            free(after);
            rc = ir_diag_error(d, "out of memory");
            break;
        }
        int n = 0;
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            for (int pass = 0; pass < 2; pass++) { /* hoisted zeroes first: before the loop */
                if (pass == 1)
                    inside[i] = n;
                for (int k = at[q0 + i]; k < at[q0 + i + 1]; k++) {
                    const zero_ins *z = &sorted[k];
                    if (z->hoisted != (pass == 0))
                        continue;
                    tp_inst *zi = &out[n++];
                    memset(zi, 0, sizeof *zi);
                    zi->k = TP_K_MEMSET_ZERO;
                    for (int j = 0; j < TP_MAX_BUFS; j++)
                        zi->buf[j] = -1;
                    zi->buf[0] = z->buf;
                    zi->arg[0] = (tp_arg){.kind = TP_ARG_INT,
                                          .i = (int64_t)(p->bufs[z->buf]->numel * 4)};
                    zi->node = z->hoisted ? NULL : in->node;
                    zi->what = z->hoisted ? "zero the gradients the loop accumulates"
                                          : "zero the gradient";
                }
            }
            if (!is_span_zero(p, in))
                out[n++] = *in;
            after[i] = n;
        }
        for (int k = 0; k < blk->n_loops; k++) {
            tp_loop *l = &blk->loops[k];
            if (l->end <= l->first || l->end > blk->n_insts)
                continue;
            l->first = inside[l->first];
            l->end = after[l->end - 1];
        }
        free(inside);
        free(after);
        blk->insts = out;
        blk->n_insts = n;
        blk->cap_insts = cap;
    }
    free(at);
    free(sorted);
    return rc;
}

/* ---------------------------------------------------------------- the pass */

/* A buffer other than a gradient must be written before it is read. */
static int check_defined(const sbp_train_program *p, const memplan *m, ir_diag *d)
{
    bool *seen = calloc((size_t)p->n_bufs + 1, sizeof *seen);
    if (!seen)
        return ir_diag_error(d, "out of memory");
    int rc = IR_OK;
    for (int i = 0; i < m->s.n_acc; i++) {
        const mp_access *a = &m->s.acc[i];
        if (seen[a->buf])
            continue;
        seen[a->buf] = true;
        const tp_buf *b = p->bufs[a->buf];
        if (a->role == MP_R && m->bytes[a->buf])
            rc = ir_diag_error(d, "memory plan: workspace buffer '%s' (%s) is read at %s before "
                                  "anything writes it",
                               b->name, b->what ? b->what : "", memplan_pos_name(m, a->pos));
    }
    free(seen);
    return rc;
}

int sbp_memplan(sbp_train_program *p, ir_diag *d)
{
    memplan *m = linearize(p);
    if (!m)
        return ir_diag_error(d, "out of memory");
    if (check_loops(&m->s) != IR_OK)
        return ir_diag_error(d, "memory plan: the program's loops overlap without nesting");
    if (rewrite_zeroing(p, m, d) != IR_OK)
        return IR_ERR;
    m = linearize(p);
    if (!m)
        return ir_diag_error(d, "out of memory");
    if (memplan_liveness(&m->s, p->g->arena, &m->lv) != IR_OK)
        return ir_diag_error(d, "memory plan: liveness failed (out of memory)");
    if (check_defined(p, m, d) != IR_OK)
        return IR_ERR;
    size_t *off = calloc((size_t)p->n_bufs + 1, sizeof *off);
    if (!off)
        return ir_diag_error(d, "out of memory");
    size_t peak = memplan_assign_offsets(p->n_bufs, m->bytes, &m->lv, off);
    if (peak == (size_t)-1) {
        free(off);
        return ir_diag_error(d, "out of memory");
    }
    for (int i = 0; i < p->n_bufs; i++)
        if (p->bufs[i]->kind == TP_BUF_WS)
            p->bufs[i]->offset = off[i];
    free(off);
    p->workspace_bytes = peak < MEMPLAN_ALIGN ? MEMPLAN_ALIGN : peak;
#ifndef NDEBUG
    if (memplan_verify(p, d) != IR_OK)
        return IR_ERR;
#endif
    return IR_OK;
}

memplan *memplan_analyze(const sbp_train_program *p)
{
    memplan *m = linearize(p);
    if (!m || memplan_liveness(&m->s, p->g->arena, &m->lv) != IR_OK)
        return NULL;
    m->lower_bound = memplan_live_bytes(&m->s, &m->lv, m->live);
    m->lower_bound_pos = 0;
    for (int q = 0; q < m->n_pos; q++)
        if (m->live[q] == m->lower_bound) {
            m->lower_bound_pos = q;
            break;
        }
    for (int i = 0; i < p->n_bufs; i++)
        if (m->bytes[i] && m->lv.hull[i].first >= 0 &&
            p->bufs[i]->offset + m->bytes[i] > m->peak)
            m->peak = p->bufs[i]->offset + m->bytes[i];
    return m;
}

/* "a..b" or "a..b, c..d": a buffer's ranges in words, in p's arena. */
static const char *ranges_str(const memplan *m, int b)
{
    const char *s = "";
    for (int r = m->lv.start[b]; r < m->lv.start[b + 1]; r++)
        s = ir_arena_printf(m->p->g->arena, "%s%s%s..%s", s, *s ? ", " : "",
                            memplan_pos_name(m, m->lv.range[r].first),
                            memplan_pos_name(m, m->lv.range[r].last));
    return s;
}

int memplan_verify(const sbp_train_program *p, ir_diag *d)
{
    memplan *m = memplan_analyze(p);
    if (!m)
        return ir_diag_error(d, "memory plan: cannot analyse the program");
    int rc = IR_OK, shown = 0;
    size_t *off = calloc((size_t)p->n_bufs + 1, sizeof *off);
    const char **names = calloc((size_t)p->n_bufs + 1, sizeof *names);
    if (!off || !names) {
        free(off);
        free(names);
        return ir_diag_error(d, "out of memory");
    }
    for (int i = 0; i < p->n_bufs; i++) {
        off[i] = p->bufs[i]->offset;
        names[i] = p->bufs[i]->name;
        if (m->bytes[i] && m->lv.hull[i].first >= 0 &&
            (off[i] % MEMPLAN_ALIGN || off[i] + m->bytes[i] > p->workspace_bytes)) {
            rc = ir_diag_error(d, "memory plan: buffer '%s' at %zu (+%zu) is misaligned or "
                                  "outside the workspace (%zu bytes)",
                               names[i], off[i], m->bytes[i], p->workspace_bytes);
        }
    }
    /* brute force: every pair */
    for (int i = 0; i < p->n_bufs; i++) {
        if (!m->bytes[i] || m->lv.hull[i].first < 0)
            continue;
        for (int j = i + 1; j < p->n_bufs; j++) {
            if (!m->bytes[j] || m->lv.hull[j].first < 0 || !memplan_live_together(&m->lv, i, j))
                continue;
            if (off[i] < off[j] + m->bytes[j] && off[j] < off[i] + m->bytes[i]) {
                if (shown++ < 8)
                    ir_diag_error(d, "memory plan: '%s' (live %s) and '%s' (live %s) are live "
                                     "together and overlap in the workspace",
                                  names[i], ranges_str(m, i), names[j], ranges_str(m, j));
                rc = IR_ERR;
            }
        }
    }
    if (memplan_simulate(&m->s, off, names, d) != IR_OK)
        rc = IR_ERR;
    free(off);
    free(names);
    return rc;
}
