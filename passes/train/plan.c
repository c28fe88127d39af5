/* plan.c — the flow's "plan" stage: buffer lifetimes and offsets in one workspace arena (see
 * memplan.h).
 *
 * Approach, in order:
 *   1. roles      the ROLES column of train_kernels.def (a short row is a build error below)
 *                 gives each buffer operand's role; a few depend on the call's scalar
 *                 arguments (GEMM's beta, copy_cols' accumulate flag, byte counts);
 *   2. linearise  every instruction of every block, in execution order, gets a position; each
 *                 workspace operand is an access (duplicates within one call merged);
 *   3. zeroing    the builder's region-wide gradient zeroing (span buffers) becomes one
 *                 MEMSET_ZERO per gradient buffer before its first contribution;
 *   4. liveness   ranges from a whole write to the last read of that value, widened to whole
 *                 loops where a value crosses iterations;
 *   5. offsets    a heap simulation (best fit / first fit, several placement orders; the
 *                 smallest peak wins), 64-byte aligned;
 *   6. check      in builds without NDEBUG: an overlap test (a sweep over positions, each
 *                 buffer against its neighbours in offset order) and a simulated run, both
 *                 O(n log n) so that long programs stay checkable.
 * The abstract part (liveness, offsets, simulation on an mp_schedule) does not know about
 * training programs, so tests can hand it schedules with loops of any shape.
 */
#include "memplan.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- 1. roles
 *
 * The ROLES column of train_kernels.def: one letter per buffer operand, in the kernel's operand
 * order: r read, w written whole, a accumulated (+=), p partly written; g GEMM's c (beta),
 * c copy_cols' dst, z a byte-count destination (memplan.h). A row whose ROLES string does not
 * have NBUF letters fails the build here.
 */
#define K(e, nb, na, roles, bf16, args, call)                                                  \
    _Static_assert(sizeof(roles) == (nb) + 1,                                                  \
                   "train_kernels.def: the ROLES of kernel " #e " need one letter per buffer "  \
                   "operand");
#include "train_kernels.def"
#undef K

const char *memplan_kernel_roles(tp_kernel k)
{
    return (int)k >= 0 && k < TP_K_COUNT ? tp_kernel_table[k].roles : NULL;
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

/* ---------------------------------------------------------------- 4. liveness (abstract)
 *
 * Loops nest or are disjoint, so they form a forest; every position has an innermost loop, and
 * the loops holding a position are that loop and its ancestors. Everything below walks those
 * chains (as long as the nesting is deep: 1 or 2 in a program) instead of every loop, and finds
 * a buffer's next access by binary search in its own access list: liveness is
 * O((accesses + positions) log) whatever the number of loops and buffers.
 */

static bool loop_contains(const mp_loop *l, int pos) { return l->first <= pos && pos <= l->last; }

/* The loop forest of a schedule (malloc'd arrays; loop_forest_free). */
typedef struct loop_forest {
    int *parent; /* [n_loops] the smallest loop strictly holding it, or -1 */
    int *inner;  /* [n_pos] the innermost loop holding the position, or -1 */
} loop_forest;

static const mp_loop *g_sort_loops; /* qsort has no context argument; single-threaded */

/* By first ascending, last descending (outer first), then index descending: of two equal
 * loops the lower index is the inner one, as the inner-first order by length (stable) had it. */
static int cmp_loop_idx(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    const mp_loop *x = &g_sort_loops[a], *y = &g_sort_loops[b];
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->last != y->last)
        return x->last > y->last ? -1 : 1;
    return a > b ? -1 : a < b;
}

static void loop_forest_free(loop_forest *f)
{
    free(f->parent);
    free(f->inner);
    f->parent = f->inner = NULL;
}

/* Builds the forest; IR_ERR for loops out of range, loops that overlap without nesting, accesses
 * out of position order, or out of memory. O(L log L + n_pos + n_acc). */
static int loop_forest_build(const mp_schedule *s, loop_forest *f)
{
    f->parent = malloc(sizeof *f->parent * (size_t)(s->n_loops + 1));
    f->inner = malloc(sizeof *f->inner * (size_t)(s->n_pos + 1));
    int *ord = malloc(sizeof *ord * (size_t)(s->n_loops + 1));
    int *stack = malloc(sizeof *stack * (size_t)(s->n_loops + 1));
    int rc = f->parent && f->inner && ord && stack ? IR_OK : IR_ERR;
    for (int i = 0; i < s->n_loops && rc == IR_OK; i++) {
        const mp_loop *a = &s->loops[i];
        if (a->first < 0 || a->last < a->first || a->last >= s->n_pos)
            rc = IR_ERR;
        ord[i] = i;
    }
    for (int i = 1; i < s->n_acc && rc == IR_OK; i++)
        if (s->acc[i].pos < s->acc[i - 1].pos)
            rc = IR_ERR;
    if (rc == IR_OK) {
        g_sort_loops = s->loops;
        qsort(ord, (size_t)s->n_loops, sizeof *ord, cmp_loop_idx);
        /* sweep the positions: the stack holds the loops open at q, outermost at the bottom */
        int depth = 0, k = 0;
        for (int q = 0; q < s->n_pos && rc == IR_OK; q++) {
            while (depth > 0 && s->loops[stack[depth - 1]].last < q)
                depth--;
            for (; k < s->n_loops && s->loops[ord[k]].first == q; k++) {
                int l = ord[k];
                while (depth > 0 && s->loops[stack[depth - 1]].last < q)
                    depth--;
                if (depth > 0 && s->loops[stack[depth - 1]].last < s->loops[l].last) {
                    rc = IR_ERR; /* starts inside the open loop and ends after it */
                    break;
                }
                f->parent[l] = depth > 0 ? stack[depth - 1] : -1;
                stack[depth++] = l;
            }
            f->inner[q] = depth > 0 ? stack[depth - 1] : -1;
        }
    }
    free(ord);
    free(stack);
    if (rc != IR_OK)
        loop_forest_free(f);
    return rc;
}

static int check_loops(const mp_schedule *s)
{
    loop_forest f;
    int rc = loop_forest_build(s, &f);
    if (rc == IR_OK)
        loop_forest_free(&f);
    return rc;
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

/* The first k in [lo, hi) with acc[list[k]].pos >= pos (hi if none): binary search. */
static int first_access_from(const mp_schedule *s, const int *list, int lo, int hi, int pos)
{
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->acc[list[mid]].pos < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
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

/* Whether range rg of a buffer (accesses list[lo..hi)) must be widened over loop L: it meets the
 * loop without covering it, and its first access inside the body is there (a range passing
 * through without an access does not) and is not the whole write that starts the range (a
 * value made in this iteration). */
static bool must_widen(const mp_schedule *s, const int *list, int lo, int hi,
                       const mp_interval *rg, const mp_loop *L)
{
    if (rg->last < L->first || rg->first > L->last)
        return false;
    if (rg->first <= L->first && rg->last >= L->last)
        return false; /* already over the whole loop */
    int from = rg->first > L->first ? rg->first : L->first;
    int to = rg->last < L->last ? rg->last : L->last;
    int k = first_access_from(s, list, lo, hi, from);
    if (k >= hi)
        return false;
    const mp_access *a = &s->acc[list[k]];
    if (a->pos > to)
        return false;
    return !(a->role == MP_W && a->pos == rg->first);
}

/* Widens rg over one loop that needs it (the loops holding its ends, innermost first); false
 * when none does. A loop that meets a range without covering it holds one of its ends. */
static bool widen_once(const mp_schedule *s, const loop_forest *f, const int *list, int lo,
                       int hi, mp_interval *rg)
{
    for (int end = 0; end < 2; end++) {
        int q = end ? rg->last : rg->first;
        for (int l = f->inner[q]; l >= 0; l = f->parent[l]) {
            const mp_loop *L = &s->loops[l];
            if (must_widen(s, list, lo, hi, rg, L)) {
                if (rg->first > L->first)
                    rg->first = L->first;
                if (rg->last < L->last)
                    rg->last = L->last;
                return true;
            }
        }
    }
    return false;
}

/* The smallest loop holding the whole range (-1: none). */
static int loop_around(const loop_forest *f, const mp_schedule *s, const mp_interval *rg)
{
    for (int l = f->inner[rg->first]; l >= 0; l = f->parent[l])
        if (loop_contains(&s->loops[l], rg->last))
            return l;
    return -1;
}

/* Per buffer: ranges split where a whole write kills the value, then widened over the loops the
 * value crosses and merged where they overlap, until nothing changes. Widening only grows a
 * range, and a range that needs widening over a loop still needs it once grown (it starts at
 * the same access, or at a loop start or earlier range that holds no whole write in the body
 * first), so every order of widening and merging reaches the same ranges: this one goes left to
 * right, keeping the ranges done so far on a stack, and re-examines a range each time it grows
 * (merging the ranges it now overlaps on either side). */
int memplan_liveness(const mp_schedule *s, ir_arena *arena, mp_liveness *out)
{
    memset(out, 0, sizeof *out);
    loop_forest f;
    if (loop_forest_build(s, &f) != IR_OK)
        return IR_ERR;
    int *start = NULL, *list = NULL;
    if (by_buffer(s, &start, &list) != IR_OK) {
        loop_forest_free(&f);
        return IR_ERR;
    }
    rangevec v = {0};
    mp_interval *tmp = malloc(sizeof *tmp * (size_t)(s->n_acc + 1));
    int rc = tmp ? IR_OK : IR_ERR;
    for (int b = 0; b < s->n_bufs && rc == IR_OK; b++) {
        int lo = start[b], hi = start[b + 1];
        int n = 0;
        for (int k = lo; k < hi; k++) {
            const mp_access *a = &s->acc[list[k]];
            if (n == 0 || a->role == MP_W)
                tmp[n++] = (mp_interval){a->pos, a->pos};
            else
                tmp[n - 1].last = a->pos;
        }
        if (n && s->live_out && s->live_out[b])
            tmp[n - 1].last = s->n_pos - 1;
        if (n > 0 && s->n_loops > 0) {
            int w = 0; /* tmp[0..w) done (a stack), tmp[w] the range being examined */
            for (int r = 0; r < n; r++) {
                mp_interval cur = tmp[r];
                for (;;) {
                    /* merge the ranges it overlaps: done ones on the left, next ones on the right */
                    while (w > 0 && tmp[w - 1].last >= cur.first) {
                        w--;
                        if (tmp[w].first < cur.first)
                            cur.first = tmp[w].first;
                        if (tmp[w].last > cur.last)
                            cur.last = tmp[w].last;
                    }
                    while (r + 1 < n && tmp[r + 1].first <= cur.last) {
                        r++;
                        if (tmp[r].last > cur.last)
                            cur.last = tmp[r].last;
                    }
                    if (!widen_once(s, &f, list, lo, hi, &cur))
                        break;
                }
                tmp[w++] = cur;
            }
            n = w;
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
                int in = loop_around(&f, s, rg);
                bool w = false;
                for (int k = first_access_from(s, list, start[b], start[b + 1], rg->first);
                     k < start[b + 1] && s->acc[list[k]].pos == rg->first && !w; k++)
                    w = s->acc[list[k]].role == MP_W;
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
    free(start);
    free(list);
    loop_forest_free(&f);
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

/* ---------------------------------------------------------------- 5. offsets
 *
 * Which buffers conflict (are live together) comes from one sweep over all ranges in start
 * order: a range meets exactly the ranges still open when it starts. When the conflicts are few
 * (at most CONFLICT_BUDGET pairs: every program whose lifetimes are short or whose buffers are
 * not too many), each heap simulation places a buffer among its placed conflicts only, sorted by
 * offset: O(conflicts log) per order, and the offsets are exactly the ones of placing among all
 * placed buffers. When they are many (a long program whose values live from the forward to the
 * backward, where the conflicts grow as the square of its length), one simulation in start order
 * runs instead: buffers taken by start, each freed after its last position (as its hull: a
 * buffer with two ranges keeps its bytes in between), the free gaps kept in two ordered trees
 * (by offset, to merge neighbours; by size, for the best fit): O(n log n).
 */

/* Conflicts allowed for the exact simulations: 2^23 pairs (about 100 MB of adjacency lists,
 * a second or two of placement) plus 16 per buffer. Real models stay far below it (a 64-layer
 * Llama-shaped program: 2186 buffers, at most 2.4M pairs even if all were live together); the
 * start-order sweep is for programs beyond, such as a 100k-op chain. It is the worse plan for
 * buffers with several ranges (a checkpointed or streamed activation keeps its bytes between
 * its forward use and its recompute): on the fixtures, forced, 1.4-1.7x the exact plan under
 * stream and 2.1-2.4x under checkpoint (tests/memplan measures it), so the budget is generous. */
#define CONFLICT_BUDGET(n) (((size_t)1 << 23) + (size_t)(n) * 16)

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

/* ---- the conflict sweep */

/* A binary min-heap of indices into an interval array (a liveness's ranges, or its hulls),
 * keyed by the interval's last position: what ends first leaves first, in both sweeps below. */
typedef struct last_heap {
    int *h, n;
    const mp_interval *r; /* the intervals the indices name */
} last_heap;

static void lh_push(last_heap *q, int x)
{
    int i = q->n++;
    while (i > 0 && q->r[q->h[(i - 1) / 2]].last > q->r[x].last) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = x;
}

static int lh_pop(last_heap *q)
{
    int top = q->h[0], x = q->h[--q->n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= q->n)
            break;
        if (c + 1 < q->n && q->r[q->h[c + 1]].last < q->r[q->h[c]].last)
            c++;
        if (q->r[q->h[c]].last >= q->r[x].last)
            break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n > 0)
        q->h[i] = x;
    return top;
}

static int cmp_int_by_first(const void *pa, const void *pb)
{
    int a = *(const int *)pa, b = *(const int *)pb;
    const mp_interval *r = g_pc.lv->range;
    if (r[a].first != r[b].first)
        return r[a].first < r[b].first ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* The conflicts of the planned buffers (use[b]): pairs of buffers with overlapping ranges, as
 * adjacency lists adj[adj_start[b] .. adj_start[b + 1]) (a pair meeting in several ranges is
 * listed as often). With adj NULL only counts them (the return value). SIZE_MAX: out of
 * memory. */
static size_t conflicts(const mp_liveness *lv, const bool *use, size_t limit, size_t *adj_start,
                        int *adj)
{
    int nr = lv->n_ranges, nb = lv->n_bufs;
    int *rbuf = malloc(sizeof *rbuf * (size_t)(nr + 1));
    int *ord = malloc(sizeof *ord * (size_t)(nr + 1));
    int *active = malloc(sizeof *active * (size_t)(nr + 1));
    last_heap q = {malloc(sizeof(int) * (size_t)(nr + 1)), 0, lv->range};
    int *at = malloc(sizeof *at * (size_t)(nr + 1)); /* each range's index in active[] */
    size_t *fill = adj ? calloc((size_t)nb + 1, sizeof *fill) : NULL;
    if (!rbuf || !ord || !active || !q.h || !at || (adj && !fill)) {
        free(rbuf), free(ord), free(active), free(q.h), free(at), free(fill);
        return SIZE_MAX;
    }
    int m = 0;
    for (int b = 0; b < nb; b++)
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++) {
            rbuf[r] = b;
            if (use[b])
                ord[m++] = r;
        }
    g_pc.lv = lv;
    qsort(ord, (size_t)m, sizeof *ord, cmp_int_by_first);
    size_t total = 0;
    int na = 0;
    for (int k = 0; k < m && total <= limit; k++) {
        int r = ord[k];
        while (q.n > 0 && lv->range[q.h[0]].last < lv->range[r].first) {
            int x = lh_pop(&q); /* out of the active array: swap with its last */
            int i = at[x], y = active[--na];
            active[i] = y;
            at[y] = i;
        }
        int b = rbuf[r];
        total += (size_t)na;
        if (adj)
            for (int i = 0; i < na; i++) {
                int c = rbuf[active[i]];
                adj[adj_start[b] + fill[b]++] = c;
                adj[adj_start[c] + fill[c]++] = b;
            }
        else if (adj_start)
            for (int i = 0; i < na; i++) {
                adj_start[b + 1]++;
                adj_start[rbuf[active[i]] + 1]++;
            }
        at[r] = na;
        active[na++] = r;
        lh_push(&q, r);
    }
    free(rbuf), free(ord), free(active), free(q.h), free(at), free(fill);
    return total;
}

/* One heap simulation: buffers in `order`, each at the best-fitting (or first) gap among the
 * placed buffers it is live together with (its conflicts adj[], sorted by offset here), else
 * above them all. Returns the peak. */
typedef struct span {
    size_t lo, hi;
} span;

static int cmp_span(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static size_t place(int n, const int *order, const size_t *bytes, const size_t *adj_start,
                    const int *adj, bool best_fit, size_t *offset, int *stamp, int trial,
                    span *sp)
{
    size_t peak = 0;
    for (int k = 0; k < n; k++) {
        int b = order[k];
        int ns = 0;
        for (size_t j = adj_start[b]; j < adj_start[b + 1]; j++) {
            int c = adj[j];
            if (stamp[c] == trial)
                sp[ns++] = (span){offset[c], offset[c] + bytes[c]};
        }
        qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
        size_t best = (size_t)-1, best_gap = (size_t)-1, end = 0;
        for (int j = 0; j < ns; j++) {
            if (sp[j].lo > end) {
                size_t gap = sp[j].lo - end;
                if (gap >= bytes[b] && (best_fit ? gap < best_gap : best == (size_t)-1)) {
                    best = end;
                    best_gap = gap;
                    if (!best_fit || gap == bytes[b])
                        break; /* nothing fits better */
                }
            }
            if (sp[j].hi > end)
                end = sp[j].hi;
        }
        size_t at = best != (size_t)-1 ? best : end;
        offset[b] = at;
        stamp[b] = trial;
        if (at + bytes[b] > peak)
            peak = at + bytes[b];
    }
    return peak;
}

/* ---- the start-order simulation for many conflicts: free gaps in two treaps */

typedef struct treap {
    int *l, *r;          /* children, -1 none */
    unsigned *prio;
    size_t *k1, *k2;     /* the key (k1, k2), ordered lexicographically */
    int root;
} treap;

static bool tk_less(const treap *t, int x, size_t a1, size_t a2)
{
    return t->k1[x] < a1 || (t->k1[x] == a1 && t->k2[x] < a2);
}

/* Splits t at key (a1, a2): *lo < key <= *hi. */
static void tr_split(treap *t, int x, size_t a1, size_t a2, int *lo, int *hi)
{
    if (x < 0) {
        *lo = *hi = -1;
        return;
    }
    if (tk_less(t, x, a1, a2)) {
        tr_split(t, t->r[x], a1, a2, &t->r[x], hi);
        *lo = x;
    } else {
        tr_split(t, t->l[x], a1, a2, lo, &t->l[x]);
        *hi = x;
    }
}

static int tr_merge(treap *t, int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    if (t->prio[a] > t->prio[b]) {
        t->r[a] = tr_merge(t, t->r[a], b);
        return a;
    }
    t->l[b] = tr_merge(t, a, t->l[b]);
    return b;
}

static void tr_insert(treap *t, int x)
{
    int lo, hi;
    t->l[x] = t->r[x] = -1;
    tr_split(t, t->root, t->k1[x], t->k2[x], &lo, &hi);
    t->root = tr_merge(t, tr_merge(t, lo, x), hi);
}

static void tr_erase(treap *t, int x)
{
    int lo, mid, hi;
    tr_split(t, t->root, t->k1[x], t->k2[x], &lo, &mid);
    tr_split(t, mid, t->k1[x], t->k2[x] + 1, &mid, &hi); /* mid: exactly x (keys are unique) */
    t->root = tr_merge(t, lo, hi);
}

/* The first node with key >= (a1, a2), or -1. */
static int tr_lower_bound(const treap *t, size_t a1, size_t a2)
{
    int best = -1;
    for (int x = t->root; x >= 0;)
        if (tk_less(t, x, a1, a2))
            x = t->r[x];
        else {
            best = x;
            x = t->l[x];
        }
    return best;
}

/* The last node with key < (a1, a2), or -1. */
static int tr_before(const treap *t, size_t a1, size_t a2)
{
    int best = -1;
    for (int x = t->root; x >= 0;)
        if (tk_less(t, x, a1, a2)) {
            best = x;
            x = t->r[x];
        } else {
            x = t->l[x];
        }
    return best;
}


/* Gap g (node g of both treaps: by offset (off, 0), by size (size, off)). */
typedef struct gaps {
    treap by_off, by_size;
    size_t *off, *size;
    int *free_ids, n_free;
} gaps;

static void gap_add(gaps *G, size_t off, size_t size)
{
    int x = G->free_ids[--G->n_free];
    G->off[x] = off;
    G->size[x] = size;
    G->by_off.k1[x] = off;
    G->by_off.k2[x] = 0;
    G->by_size.k1[x] = size;
    G->by_size.k2[x] = off;
    tr_insert(&G->by_off, x);
    tr_insert(&G->by_size, x);
}

static void gap_remove(gaps *G, int x)
{
    tr_erase(&G->by_off, x);
    tr_erase(&G->by_size, x);
    G->free_ids[G->n_free++] = x;
}

/* Best fit in start order over hulls: O(n log n). order: the buffers by hull start. */
static size_t place_sweep(int n, const int *order, const size_t *bytes, const mp_liveness *lv,
                          size_t *offset)
{
    int cap = n + 1;
    gaps G = {0};
    treap *ts[2] = {&G.by_off, &G.by_size};
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        ts[i]->l = malloc(sizeof(int) * (size_t)cap);
        ts[i]->r = malloc(sizeof(int) * (size_t)cap);
        ts[i]->prio = malloc(sizeof(unsigned) * (size_t)cap);
        ts[i]->k1 = malloc(sizeof(size_t) * (size_t)cap);
        ts[i]->k2 = malloc(sizeof(size_t) * (size_t)cap);
        ts[i]->root = -1;
        ok = ok && ts[i]->l && ts[i]->r && ts[i]->prio && ts[i]->k1 && ts[i]->k2;
    }
    G.off = malloc(sizeof(size_t) * (size_t)cap);
    G.size = malloc(sizeof(size_t) * (size_t)cap);
    G.free_ids = malloc(sizeof(int) * (size_t)cap);
    last_heap q = {malloc(sizeof(int) * (size_t)cap), 0, lv->hull};
    size_t peak = (size_t)-1;
    if (ok && G.off && G.size && G.free_ids && q.h) {
        unsigned seed = 2463534242u; /* xorshift: deterministic priorities */
        for (int i = 0; i < cap; i++) {
            seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
            G.by_off.prio[i] = seed;
            seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
            G.by_size.prio[i] = seed;
            G.free_ids[i] = cap - 1 - i;
        }
        G.n_free = cap;
        size_t top = 0;
        peak = 0;
        for (int k = 0; k < n; k++) {
            int b = order[k];
            while (q.n > 0 && lv->hull[q.h[0]].last < lv->hull[b].first) {
                int c = lh_pop(&q); /* free c's bytes, merged with the gaps beside them */
                size_t lo = offset[c], hi = offset[c] + bytes[c];
                int p = tr_before(&G.by_off, lo, 0);
                if (p >= 0 && G.off[p] + G.size[p] == lo) {
                    lo = G.off[p];
                    gap_remove(&G, p);
                }
                int s = tr_lower_bound(&G.by_off, hi, 0);
                if (s >= 0 && G.off[s] == hi) {
                    hi = G.off[s] + G.size[s];
                    gap_remove(&G, s);
                }
                if (hi == top)
                    top = lo;
                else
                    gap_add(&G, lo, hi - lo);
            }
            int g = tr_lower_bound(&G.by_size, bytes[b], 0);
            if (g >= 0) {
                size_t at = G.off[g], rest = G.size[g] - bytes[b];
                gap_remove(&G, g);
                if (rest)
                    gap_add(&G, at + bytes[b], rest);
                offset[b] = at;
            } else {
                offset[b] = top;
                top += bytes[b];
            }
            if (offset[b] + bytes[b] > peak)
                peak = offset[b] + bytes[b];
            lh_push(&q, b);
        }
    }
    for (int i = 0; i < 2; i++) {
        free(ts[i]->l), free(ts[i]->r), free(ts[i]->prio), free(ts[i]->k1), free(ts[i]->k2);
    }
    free(G.off), free(G.size), free(G.free_ids), free(q.h);
    return peak;
}

size_t memplan_assign_offsets(int n, const size_t *bytes, const mp_liveness *lv, size_t *offset,
                              const mp_offset_options *o)
{
    int *order = malloc(sizeof *order * (size_t)(n + 1));
    size_t *trial = malloc(sizeof *trial * (size_t)(n + 1));
    int *stamp = malloc(sizeof *stamp * (size_t)(n + 1));
    double *len = calloc((size_t)n + 1, sizeof *len);
    bool *use = calloc((size_t)n + 1, sizeof *use);
    size_t *adj_start = calloc((size_t)n + 2, sizeof *adj_start);
    int *adj = NULL;
    span *sp = NULL;
    for (int b = 0; b < n; b++)
        offset[b] = 0;
    size_t best = (size_t)-1;
    if (!order || !trial || !stamp || !len || !use || !adj_start)
        goto out;
    int m = 0;
    for (int b = 0; b < n; b++) {
        for (int r = lv->start[b]; r < lv->start[b + 1]; r++)
            len[b] += lv->range[r].last - lv->range[r].first + 1;
        if (lv->start[b] < lv->start[b + 1] && bytes[b] > 0) {
            order[m++] = b;
            use[b] = true;
        }
        stamp[b] = -1;
    }
    if (m == 0) {
        best = 0;
        goto out;
    }
    size_t limit = CONFLICT_BUDGET(n);
    size_t e = conflicts(lv, use, limit, NULL, NULL);
    if (e == SIZE_MAX)
        goto out;
    if (e > limit || (o && o->start_order)) {
        g_pc = (place_ctx){bytes, lv, len, 1};
        qsort(order, (size_t)m, sizeof *order, cmp_order);
        best = place_sweep(m, order, bytes, lv, offset);
        goto out;
    }
    /* the adjacency lists: count, then fill */
    if (conflicts(lv, use, limit, adj_start, NULL) == SIZE_MAX)
        goto out;
    for (int b = 0; b < n; b++)
        adj_start[b + 1] += adj_start[b];
    adj = malloc(sizeof *adj * (adj_start[n] + 1));
    sp = malloc(sizeof *sp * (adj_start[n] + 1));
    if (!adj || !sp || conflicts(lv, use, limit, adj_start, adj) == SIZE_MAX)
        goto out;
    for (int key = 0; key < 4; key++) {
        g_pc = (place_ctx){bytes, lv, len, key};
        qsort(order, (size_t)m, sizeof *order, cmp_order);
        for (int fit = 0; fit < 2; fit++) {
            size_t peak =
                place(m, order, bytes, adj_start, adj, fit == 0, trial, stamp, 2 * key + fit, sp);
            if (peak < best) {
                best = peak;
                for (int k = 0; k < m; k++)
                    offset[order[k]] = trial[order[k]];
            }
        }
    }
out:
    free(order);
    free(trial);
    free(stamp);
    free(len);
    free(use);
    free(adj_start);
    free(adj);
    free(sp);
    return best;
}

/* ---------------------------------------------------------------- 6. simulation
 *
 * The schedule is run on buffer states (unset, valid, garbage, clobbered): a read of anything
 * but a valid buffer is an error. Whether a valid buffer was clobbered (another buffer that
 * shares some of its bytes written since) is found when it is read, not pushed to every
 * overlapping buffer at each write, which would cost O(writes x buffers): a segment tree over the
 * workspace's byte ranges (the distinct buffer boundaries) holds, for every range, the key of
 * its latest write (a running count of writes times (n_bufs + 1), plus the buffer written). A
 * buffer is clobbered exactly when the latest write anywhere in its bytes is newer than its own
 * latest write; that buffer is the one the diagnostic names. O((writes + reads) log buffers).
 */

enum { SIM_UNSET = 0, SIM_VALID, SIM_GARBAGE, SIM_CLOBBERED };

typedef struct sim {
    const mp_schedule *s;
    const size_t *offset;
    const char *const *names;
    ir_diag *d;
    unsigned char *state; /* [n_bufs] as its own writes left it (valid: unless clobbered) */
    uint64_t *own;        /* [n_bufs] key of its latest write, 0 before the first */
    int *lo, *hi;         /* [n_bufs] its bytes as elementary ranges [lo, hi) of the tree */
    int n_seg;            /* elementary byte ranges: distinct boundaries - 1 */
    uint64_t *mx;         /* [4 n_seg] latest write key anywhere in a node's ranges */
    uint64_t *tag;        /* [4 n_seg] latest write key that covered a node's ranges whole */
    uint64_t stamp;       /* writes so far */
    int *pos_acc;         /* [n_pos + 1] first access of each position */
    int errors;
} sim;

/* Writes are stamped in increasing order, so "assign" is "max" and no tag is ever pushed. */
static void seg_write(sim *st, int node, int l, int r, int ql, int qr, uint64_t key)
{
    if (qr <= l || r <= ql)
        return;
    st->mx[node] = key;
    if (ql <= l && r <= qr) {
        st->tag[node] = key;
        return;
    }
    int mid = l + (r - l) / 2;
    seg_write(st, 2 * node, l, mid, ql, qr, key);
    seg_write(st, 2 * node + 1, mid, r, ql, qr, key);
}

static uint64_t seg_latest(const sim *st, int node, int l, int r, int ql, int qr)
{
    if (qr <= l || r <= ql)
        return 0;
    if (ql <= l && r <= qr)
        return st->mx[node];
    int mid = l + (r - l) / 2;
    uint64_t a = seg_latest(st, 2 * node, l, mid, ql, qr);
    uint64_t b = seg_latest(st, 2 * node + 1, mid, r, ql, qr);
    uint64_t m = st->tag[node]; /* covers all of [l, r), which meets [ql, qr) */
    m = a > m ? a : m;
    return b > m ? b : m;
}

/* Buffer b's state now; *by the buffer that clobbered it. */
static int sim_state(const sim *st, int b, int *by)
{
    if (st->state[b] != SIM_VALID)
        return st->state[b];
    uint64_t latest = seg_latest(st, 1, 0, st->n_seg, st->lo[b], st->hi[b]);
    if (latest > st->own[b]) {
        *by = (int)(latest % ((uint64_t)st->s->n_bufs + 1));
        return SIM_CLOBBERED;
    }
    return SIM_VALID;
}

static const char *sim_name(const sim *st, int b, char *buf, size_t n)
{
    if (st->names && st->names[b])
        return st->names[b];
    snprintf(buf, n, "#%d", b);
    return buf;
}

static void sim_read(sim *st, int b, int pos)
{
    int by = -1, state = sim_state(st, b, &by);
    if (state == SIM_VALID)
        return;
    if (st->errors++ >= 8)
        return;
    char n1[32], n2[32];
    if (state == SIM_CLOBBERED)
        ir_diag_error(st->d, "memory plan: buffer %s is read at position %d, but %s, planned at "
                             "bytes that overlap it, was written since",
                      sim_name(st, b, n1, sizeof n1), pos, sim_name(st, by, n2, sizeof n2));
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
        int by;
        if (!s->bytes[a->buf])
            continue;
        if (a->role == MP_R || (a->role == MP_A && sim_state(st, a->buf, &by) == SIM_CLOBBERED))
            sim_read(st, a->buf, pos);
    }
    for (int i = st->pos_acc[pos]; i < st->pos_acc[pos + 1]; i++) {
        const mp_access *a = &s->acc[i];
        int b = a->buf, by;
        if (!s->bytes[b] || a->role == MP_R)
            continue;
        if (a->role == MP_A)
            /* accumulating into garbage is harmless until something reads the result */
            st->state[b] = sim_state(st, b, &by) == SIM_VALID ? SIM_VALID : SIM_GARBAGE;
        else
            st->state[b] = SIM_VALID;
        /* garbage stays garbage; only a value can be lost, and that is seen when it is read */
        st->own[b] = ++st->stamp * ((uint64_t)s->n_bufs + 1) + (uint64_t)b;
        seg_write(st, 1, 0, st->n_seg, st->lo[b], st->hi[b], st->own[b]);
    }
}

/* Runs positions lo..hi, each loop among loops[from..) (sorted by first, outer first) twice. The
 * cursor k passes every loop once per call: loops starting before pos can no longer start. */
static void sim_range(sim *st, const mp_loop *loops, int n_loops, int lo, int hi, int from)
{
    int k = from;
    for (int pos = lo; pos <= hi;) {
        int j = -1;
        while (k < n_loops && loops[k].first < pos)
            k++;
        for (int q = k; q < n_loops && loops[q].first == pos; q++)
            if (loops[q].last <= hi) {
                j = q;
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

static int cmp_size(const void *pa, const void *pb)
{
    size_t a = *(const size_t *)pa, b = *(const size_t *)pb;
    return a < b ? -1 : a > b;
}

/* The index of x in the sorted xs[0..n). */
static int find_size(const size_t *xs, int n, size_t x)
{
    int l = 0, r = n - 1;
    while (l < r) {
        int mid = l + (r - l) / 2;
        if (xs[mid] < x)
            l = mid + 1;
        else
            r = mid;
    }
    return l;
}

int memplan_simulate(const mp_schedule *s, const size_t *offset, const char *const *names,
                     ir_diag *d)
{
    if (check_loops(s) != IR_OK)
        return ir_diag_error(d, "memory plan: malformed loops in the schedule");
    sim st = {.s = s, .offset = offset, .names = names, .d = d};
    size_t nb = (size_t)s->n_bufs + 1;
    st.state = calloc(nb, 1);
    st.own = calloc(nb, sizeof *st.own);
    st.lo = calloc(nb, sizeof *st.lo);
    st.hi = calloc(nb, sizeof *st.hi);
    size_t *xs = malloc(2 * nb * sizeof *xs);
    st.pos_acc = calloc((size_t)s->n_pos + 2, sizeof *st.pos_acc);
    mp_loop *loops = malloc(sizeof *loops * (size_t)(s->n_loops + 1));
    int nx = 0;
    if (st.state && st.own && st.lo && st.hi && xs) {
        for (int b = 0; b < s->n_bufs; b++)
            if (s->bytes[b]) {
                xs[nx++] = offset[b];
                xs[nx++] = offset[b] + s->bytes[b];
            }
        qsort(xs, (size_t)nx, sizeof *xs, cmp_size);
        int u = 0;
        for (int k = 0; k < nx; k++)
            if (u == 0 || xs[k] != xs[u - 1])
                xs[u++] = xs[k];
        nx = u;
        for (int b = 0; b < s->n_bufs; b++)
            if (s->bytes[b]) {
                st.lo[b] = find_size(xs, nx, offset[b]);
                st.hi[b] = find_size(xs, nx, offset[b] + s->bytes[b]);
            }
    }
    st.n_seg = nx > 1 ? nx - 1 : 1;
    st.mx = calloc(4 * (size_t)st.n_seg, sizeof *st.mx);
    st.tag = calloc(4 * (size_t)st.n_seg, sizeof *st.tag);
    int rc = IR_OK;
    if (!st.state || !st.own || !st.lo || !st.hi || !xs || !st.pos_acc || !loops || !st.mx ||
        !st.tag) {
        rc = ir_diag_error(d, "out of memory");
        goto out;
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
    rc = st.errors ? IR_ERR : IR_OK;
out:
    free(st.state);
    free(st.own);
    free(st.lo);
    free(st.hi);
    free(xs);
    free(st.mx);
    free(st.tag);
    free(st.pos_acc);
    free(loops);
    return rc;
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

/* The outermost loop that contains position a and not position z (z = -1: none), or -1. The
 * loops holding a are a chain; those holding z too are its outer part. */
static int outermost_loop_between(const mp_schedule *s, const loop_forest *f, int z, int a)
{
    int best = -1;
    for (int l = f->inner[a]; l >= 0 && (z < 0 || !loop_contains(&s->loops[l], z));
         l = f->parent[l])
        best = l;
    return best;
}

typedef struct zero_point {
    int region, pos;
} zero_point;

static int cmp_zero_point(const void *pa, const void *pb)
{
    const zero_point *a = pa, *b = pb;
    if (a->region != b->region)
        return a->region < b->region ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

static int rewrite_zeroing(sbp_train_program *p, const memplan *m, ir_diag *d)
{
    const mp_schedule *s = &m->s;
    int nb = p->n_bufs;
    /* per-buffer access lists; at most one zero per access of a gradient */
    int *start = NULL, *list = NULL;
    if (by_buffer(s, &start, &list) != IR_OK)
        return ir_diag_error(d, "out of memory");
    loop_forest f;
    if (loop_forest_build(s, &f) != IR_OK) {
        free(start);
        free(list);
        return ir_diag_error(d, "memory plan: the program's loops overlap without nesting");
    }
    zero_point *zp = malloc(sizeof *zp * (size_t)(m->n_pos + 1)); /* span zeroes */
    zero_ins *ins = malloc(sizeof *ins * (size_t)(s->n_acc + 1));
    int nz = 0, ni = 0;
    if (!zp || !ins) {
        free(start);
        free(list);
        loop_forest_free(&f);
        free(zp);
        free(ins);
        return ir_diag_error(d, "out of memory");
    }
    for (int q = 0; q < m->n_pos; q++) {
        const tp_inst *in = &p->blocks[m->pos_block[q]]->insts[m->pos_inst[q]];
        if (is_span_zero(p, in))
            zp[nz++] = (zero_point){p->bufs[in->buf[0]]->region, q};
    }
    qsort(zp, (size_t)nz, sizeof *zp, cmp_zero_point); /* by region, then position */

    /* zero points of buffer b: program start (-1), then its region's span zeroes; after each,
     * the first access before the next one decides. Walked by access: an access is the first
     * after a zero point when a zero point lies between it and the access before it. */
    for (int b = 0; b < nb; b++) {
        const tp_buf *tb = p->bufs[b];
        if (!planned(tb) || !tb->is_grad || !m->bytes[b] || start[b] == start[b + 1])
            continue;
        int zlo = 0, zhi = nz; /* b's region: zp[zlo..zhi) */
        while (zlo < zhi) {
            int mid = zlo + (zhi - zlo) / 2;
            if (zp[mid].region < tb->region)
                zlo = mid + 1;
            else
                zhi = mid;
        }
        zhi = zlo;
        while (zhi < nz && zp[zhi].region == tb->region)
            zhi++;
        int prev_k = -1;
        for (int i = start[b]; i < start[b + 1]; i++) {
            const mp_access *a = &s->acc[list[i]];
            int lo = zlo, hi = zhi; /* k: the zero points before a */
            while (lo < hi) {
                int mid = lo + (hi - lo) / 2;
                if (zp[mid].pos < a->pos)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            int k = lo - zlo;
            if (i > start[b] && k == prev_k)
                continue;
            prev_k = k;
            if (a->role != MP_W) {
                int z = k > 0 ? zp[zlo + k - 1].pos : -1;
                int L = outermost_loop_between(s, &f, z, a->pos);
                ins[ni++] = (zero_ins){L >= 0 ? s->loops[L].first : a->pos, b, L >= 0};
            }
        }
    }
    loop_forest_free(&f);
    free(zp);
    free(start);
    free(list);

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
    size_t peak = memplan_assign_offsets(p->n_bufs, m->bytes, &m->lv, off, NULL);
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

/* The pairwise check of memplan_verify without the n^2 pairs (a long chain keeps thousands of
 * buffers live at once): a sweep over positions keeps the buffers live there in a Fenwick tree
 * indexed by their rank in offset order. While the plan is sound they lie apart, so a buffer
 * that becomes live overlaps one of them exactly when it overlaps its neighbour below or above
 * in offset order. After a first overlap later ones may go unreported; the error stands.
 * O(ranges log buffers). */
typedef struct apart_ev {
    int pos;   /* a range's first position, or its last + 1 */
    int enter; /* 0: leaves (sorted first at a position), 1: becomes live */
    int buf;
} apart_ev;

typedef struct apart_buf {
    size_t off;
    int buf;
} apart_buf;

static int cmp_apart_buf(const void *pa, const void *pb)
{
    const apart_buf *a = pa, *b = pb;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    return a->buf < b->buf ? -1 : a->buf > b->buf;
}

static int cmp_apart_ev(const void *pa, const void *pb)
{
    const apart_ev *a = pa, *b = pb;
    if (a->pos != b->pos)
        return a->pos < b->pos ? -1 : 1;
    if (a->enter != b->enter)
        return a->enter < b->enter ? -1 : 1;
    return a->buf < b->buf ? -1 : a->buf > b->buf;
}

static void fw_add(int *t, int n, int i, int v)
{
    for (i++; i <= n; i += i & -i)
        t[i] += v;
}

/* How many of ranks 0..i-1 are set. */
static int fw_count(const int *t, int i)
{
    int c = 0;
    for (; i > 0; i -= i & -i)
        c += t[i];
    return c;
}

/* The rank of the k-th (1-based) set rank. */
static int fw_kth(const int *t, int n, int k)
{
    int pos = 0, pw = 1;
    while (pw * 2 <= n)
        pw *= 2;
    for (; pw; pw /= 2)
        if (pos + pw <= n && t[pos + pw] < k) {
            pos += pw;
            k -= t[pos];
        }
    return pos;
}

static int check_apart(const memplan *m, int nb, const size_t *off, const char **names,
                       ir_diag *d, int *shown)
{
    const mp_liveness *lv = &m->lv;
    apart_buf *by_rank = malloc(((size_t)nb + 1) * sizeof *by_rank);
    int *rank = malloc(((size_t)nb + 1) * sizeof *rank);
    int *fw = calloc((size_t)nb + 2, sizeof *fw);
    apart_ev *ev = malloc(2 * ((size_t)lv->n_ranges + 1) * sizeof *ev);
    if (!by_rank || !rank || !fw || !ev) {
        free(by_rank);
        free(rank);
        free(fw);
        free(ev);
        return ir_diag_error(d, "out of memory");
    }
    int n = 0, ne = 0, rc = IR_OK;
    for (int i = 0; i < nb; i++) {
        if (!m->bytes[i] || lv->hull[i].first < 0)
            continue;
        by_rank[n++] = (apart_buf){off[i], i};
        for (int r = lv->start[i]; r < lv->start[i + 1]; r++) {
            ev[ne++] = (apart_ev){lv->range[r].first, 1, i};
            ev[ne++] = (apart_ev){lv->range[r].last + 1, 0, i};
        }
    }
    qsort(by_rank, (size_t)n, sizeof *by_rank, cmp_apart_buf);
    for (int k = 0; k < n; k++)
        rank[by_rank[k].buf] = k;
    qsort(ev, (size_t)ne, sizeof *ev, cmp_apart_ev);
    for (int e = 0; e < ne; e++) {
        int i = ev[e].buf, ri = rank[i];
        if (!ev[e].enter) {
            fw_add(fw, n, ri, -1);
            continue;
        }
        int below = fw_count(fw, ri), live = fw_count(fw, n);
        int nbr[2] = {below > 0 ? by_rank[fw_kth(fw, n, below)].buf : -1,
                      below < live ? by_rank[fw_kth(fw, n, below + 1)].buf : -1};
        for (int k = 0; k < 2; k++) {
            int j = nbr[k];
            if (j < 0 || !(off[i] < off[j] + m->bytes[j] && off[j] < off[i] + m->bytes[i]))
                continue;
            int a = i < j ? i : j, b = i < j ? j : i;
            if ((*shown)++ < 8)
                ir_diag_error(d, "memory plan: '%s' (live %s) and '%s' (live %s) are live "
                                 "together and overlap in the workspace",
                              names[a], ranges_str(m, a), names[b], ranges_str(m, b));
            rc = IR_ERR;
        }
        fw_add(fw, n, ri, 1);
    }
    free(by_rank);
    free(rank);
    free(fw);
    free(ev);
    return rc;
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
    if (check_apart(m, p->n_bufs, off, names, d, &shown) != IR_OK)
        rc = IR_ERR;
    if (memplan_simulate(&m->s, off, names, d) != IR_OK)
        rc = IR_ERR;
    free(off);
    free(names);
    return rc;
}
