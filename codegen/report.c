/* report.c — the memory report (`sbpc --report`) and the memory plot (`sbpc --memory-plot`).
 *
 * Both take the training programs of several strategies for one model (built and planned by
 * sbp_train_build, whose last step is passes/train/plan.c) and re-derive each plan's liveness with
 * memplan_analyze, so they show exactly what the emitted steps will do.
 *
 * The footprint of a step is parameters + gradients (the caller's two blocks, as many floats as
 * there are parameters) + optimizer state (AdamW's m and v: twice the parameters, as sbp-train
 * allocates them) + the planned workspace. The workspace is broken down at its liveness peak
 * (the position where the most bytes are live: those figures add up to the lower bound) into
 * categories, each buffer in the first that fits:
 *   logits              the loss's logits and their gradient (or a chunk of them);
 *   K/V                 attention keys and values and their gradients;
 *   layer checkpoints   activations that cross a segment boundary (each layer's input);
 *   per-chunk scratch   buffers that live inside one iteration of a chunk loop (stream);
 *   activation grads    other gradients of activations;
 *   weight gradients    --offload optimizer: the parameter gradients on their way to the host;
 *   other activations   the rest (saved activations, statistics, relayout copies).
 * The plot draws, per strategy, the workspace bytes live at each position of the schedule.
 */
#include "codegen.h"
#include "memplan.h"

#include <stdlib.h>
#include <string.h>

enum { CAT_LOGITS, CAT_KV, CAT_CKPT, CAT_CHUNK, CAT_AGRAD, CAT_WGRAD, CAT_OTHER, N_CAT };

static const char *const cat_names[N_CAT] = {
    "logits", "K/V", "layer checkpoints", "per-chunk scratch", "activation gradients",
    "weight gradients (streamed)", "other activations",
};
static const char *const cat_short[N_CAT] = {"logits",    "K/V",     "checkpoint", "chunk",
                                             "act. grad", "w. grad", "activation"};

typedef struct figures {
    const char *name;          /* strategy */
    const sbp_train_program *p;
    const char *why;           /* p == NULL: why */
    memplan *m;
    unsigned char *cat;        /* [n_bufs] category of each workspace buffer */
    size_t params, grads, opt, ids, consts;
    size_t ws, lower;          /* planned workspace, liveness lower bound */
    size_t at_peak[N_CAT];     /* bytes live at the lower bound's position, by category */
    size_t total;
} figures;

/* ------------------------------------------------------------------ categories */

/* The segment of each node of p's graph, by node id; -1 when none. */
static int *node_segments(const sbp_train_program *p)
{
    const ir_graph *g = p->g;
    int max_id = 0;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k]->id > max_id)
            max_id = g->nodes[k]->id;
    int *seg = malloc(sizeof *seg * (size_t)(max_id + 1));
    if (!seg)
        return NULL;
    for (int i = 0; i <= max_id; i++)
        seg[i] = -1;
    for (int k = 0; k < g->n_nodes; k++)
        for (int s = 0; s < p->n_segments; s++)
            if (k >= p->segments[s].first_node && k < p->segments[s].end_node)
                seg[g->nodes[k]->id] = s;
    return seg;
}

static int categorize(figures *f)
{
    const sbp_train_program *p = f->p;
    int nb = p->n_bufs;
    f->cat = calloc((size_t)nb + 1, 1);
    int *seg = node_segments(p);
    int *wseg = malloc(sizeof *wseg * (size_t)(nb + 1)); /* segment writing it, -2: several */
    bool *cross = calloc((size_t)nb + 1, sizeof *cross);
    bool *logits = calloc((size_t)nb + 1, sizeof *logits);
    bool *kv = calloc((size_t)nb + 1, sizeof *kv);
    /* by value id: a non-gradient buffer of that value holds logits (1) or K/V (2), so that a
     * gradient buffer finds its value's category at once (a chain has thousands of them) */
    const int nv = p->g->n_values;
    unsigned char *vcat = calloc((size_t)nv + 1, 1);
    if (!f->cat || !seg || !wseg || !cross || !logits || !kv || !vcat) {
        free(seg);
        free(wseg);
        free(cross);
        free(logits);
        free(kv);
        free(vcat);
        return IR_ERR;
    }
    for (int i = 0; i < nb; i++)
        wseg[i] = -1;
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            int s = in->node ? seg[in->node->id] : -1;
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
                int b = in->buf[j];
                if (b < 0 || p->bufs[b]->kind != TP_BUF_WS)
                    continue;
                mp_role r = memplan_operand_role(in, j, p->bufs[b]->numel * 4);
                if (r != MP_R && s >= 0 && wseg[b] != s)
                    wseg[b] = wseg[b] == -1 ? s : -2;
                if ((in->k == TP_K_CROSS_ENTROPY && (j == 1 || j == 2)) ||
                    (in->k == TP_K_LOGPROB_FWD && j == 2) || /* DPO / GRPO */
                    (in->k == TP_K_LOGPROB_GRAD && (j == 0 || j == 2)))
                    logits[b] = true;
                bool fwd = in->k == TP_K_ATTENTION_FWD || in->k == TP_K_ATTENTION_PACKED_FWD;
                bool bwd = in->k == TP_K_ATTENTION_BWD || in->k == TP_K_ATTENTION_PACKED_BWD;
                if ((fwd && (j == 3 || j == 4)) || (bwd && (j == 1 || j == 2 || j == 5 || j == 6)))
                    kv[b] = true;
            }
        }
    }
    /* a value written in one segment and read in another crosses a boundary */
    for (int bi = 0; bi < p->n_blocks; bi++) {
        const tp_block *blk = p->blocks[bi];
        for (int i = 0; i < blk->n_insts; i++) {
            const tp_inst *in = &blk->insts[i];
            int s = in->node ? seg[in->node->id] : -1;
            for (int j = 0; j < tp_kernel_table[in->k].n_buf; j++) {
                int b = in->buf[j];
                if (b < 0 || p->bufs[b]->kind != TP_BUF_WS || s < 0)
                    continue;
                if (memplan_operand_role(in, j, p->bufs[b]->numel * 4) == MP_R &&
                    wseg[b] >= 0 && wseg[b] != s)
                    cross[b] = true;
            }
        }
    }
    /* gradients of the logits / K/V values are in the same category */
    for (int i = 0; i < nb; i++) {
        const ir_value *v = p->bufs[i]->value;
        if ((logits[i] || kv[i]) && !p->bufs[i]->is_grad && v && v->id >= 0 && v->id < nv)
            vcat[v->id] |= (unsigned char)((logits[i] ? 1 : 0) | (kv[i] ? 2 : 0));
    }
    for (int i = 0; i < nb; i++) {
        const tp_buf *b = p->bufs[i];
        if (b->kind != TP_BUF_WS || b->span)
            continue;
        bool lg = logits[i], k = kv[i];
        if (b->is_grad && b->value && b->value->id >= 0 && b->value->id < nv) {
            lg = lg || (vcat[b->value->id] & 1);
            k = k || (vcat[b->value->id] & 2);
        }
        if (b->is_grad && b->value && b->value->kind == IR_VAL_PARAM)
            f->cat[i] = CAT_WGRAD;
        else if (lg)
            f->cat[i] = CAT_LOGITS;
        else if (k)
            f->cat[i] = CAT_KV;
        else if (!b->is_grad && cross[i])
            f->cat[i] = CAT_CKPT;
        else if (f->m->lv.iter_loop[i] >= 0)
            f->cat[i] = CAT_CHUNK;
        else if (b->is_grad)
            f->cat[i] = CAT_AGRAD;
        else
            f->cat[i] = CAT_OTHER;
    }
    free(seg);
    free(wseg);
    free(cross);
    free(logits);
    free(kv);
    free(vcat);
    return IR_OK;
}

static int compute(figures *f, ir_diag *d)
{
    const sbp_train_program *p = f->p;
    f->m = memplan_analyze(p);
    if (!f->m)
        return ir_diag_error(d, "report: cannot analyse the %s program", f->name);
    if (categorize(f) != IR_OK)
        return ir_diag_error(d, "out of memory");
    f->params = p->param_elems * sizeof(float);
    /* the trained parameters' only; --offload optimizer: the host's, as m and v */
    f->grads = sbp_train_device_grad_bytes(p);
    f->opt = f->p->offload_optimizer ? 0 : 2 * f->grads;
    f->ids = (size_t)(p->batch * p->seq_len) * sizeof(int32_t) * (p->labels_buf >= 0 ? 2 : 1);
    for (int i = 0; i < p->n_bufs; i++)
        if (p->bufs[i]->kind == TP_BUF_CONST)
            f->consts += p->bufs[i]->numel * 4;
    f->ws = p->workspace_bytes;
    /* a bf16 program's parameter copy (passes/train/precision.c) is live the whole step */
    f->lower = f->m->lower_bound + (p->bf16 ? p->shadow_elems * 2 : 0);
    int q = f->m->lower_bound_pos;
    for (int i = 0; i < p->n_bufs; i++) {
        if (!f->m->bytes[i])
            continue;
        for (int r = f->m->lv.start[i]; r < f->m->lv.start[i + 1]; r++)
            if (f->m->lv.range[r].first <= q && q <= f->m->lv.range[r].last)
                f->at_peak[f->cat[i]] += f->m->bytes[i];
    }
    f->total = f->params + f->grads + f->opt + f->ws;
    return IR_OK;
}

static void free_figures(figures *f, int n)
{
    for (int i = 0; i < n; i++)
        free(f[i].cat);
    free(f);
}

static figures *compute_all(const sbp_report_entry *e, int n, ir_diag *d)
{
    figures *f = calloc((size_t)n + 1, sizeof *f);
    if (!f) {
        ir_diag_error(d, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        f[i].name = e[i].name;
        f[i].p = e[i].p;
        f[i].why = e[i].why;
        if (f[i].p && compute(&f[i], d) != IR_OK) {
            free_figures(f, n);
            return NULL;
        }
    }
    return f;
}

/* ------------------------------------------------------------------ the text report */

/* "12.3 MiB" */
static const char *human(char *buf, size_t n, size_t bytes)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)bytes;
    int u = 0;
    while (x >= 1024 && u < 4) {
        x /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%zu B", bytes);
    else
        snprintf(buf, n, "%.1f %s", x, unit[u]);
    return buf;
}

#define COLW 16

static void row(FILE *out, const char *label, const figures *f, int n, size_t off)
{
    fprintf(out, "  %-32s", label);
    for (int i = 0; i < n; i++) {
        if (!f[i].p)
            fprintf(out, " %*s", COLW, "-");
        else
            fprintf(out, " %*zu", COLW, *(const size_t *)((const char *)&f[i] + off));
    }
    fputc('\n', out);
}

static void cat_row(FILE *out, int c, const figures *f, int n)
{
    fprintf(out, "    %-30s", cat_names[c]);
    for (int i = 0; i < n; i++) {
        if (!f[i].p)
            fprintf(out, " %*s", COLW, "-");
        else
            fprintf(out, " %*zu", COLW, f[i].at_peak[c]);
    }
    fputc('\n', out);
}

static const size_t *g_sort_bytes; /* for cmp_largest (qsort has no context argument) */

/* By size, largest first; ties by buffer index. */
static int cmp_largest(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (g_sort_bytes[x] != g_sort_bytes[y])
        return g_sort_bytes[x] > g_sort_bytes[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void largest_buffers(FILE *out, const figures *f, int top)
{
    const sbp_train_program *p = f->p;
    const memplan *m = f->m;
    int *idx = malloc(sizeof *idx * (size_t)(p->n_bufs + 1));
    if (!idx)
        return;
    int n = 0;
    for (int i = 0; i < p->n_bufs; i++)
        if (m->bytes[i] && m->lv.hull[i].first >= 0)
            idx[n++] = i;
    g_sort_bytes = m->bytes;
    qsort(idx, (size_t)n, sizeof *idx, cmp_largest);
    fprintf(out, "\nlargest workspace buffers (%s): %d planned buffers\n", f->name, n);
    fprintf(out, "  %12s %12s  %-12s %-44s %s\n", "bytes", "offset", "category", "live",
            "buffer");
    for (int k = 0; k < n && k < top; k++) {
        int i = idx[k];
        const tp_buf *b = p->bufs[i];
        char live[512];
        size_t used = 0;
        live[0] = 0;
        for (int r = m->lv.start[i]; r < m->lv.start[i + 1] && used < sizeof live; r++) {
            int w = snprintf(live + used, sizeof live - used, "%s%s..%s", used ? ", " : "",
                             memplan_pos_name(m, m->lv.range[r].first),
                             memplan_pos_name(m, m->lv.range[r].last));
            if (w < 0)
                break;
            used += (size_t)w;
        }
        fprintf(out, "  %12zu %12zu  %-12s %-44s %s", m->bytes[i], b->offset,
                cat_short[f->cat[i]], live, b->name);
        fputs(" ", out);
        fputs(b->is_int ? "i32[" : b->bf16 ? "bf16[" : "f32[", out);
        for (int k2 = 0; k2 < b->rank; k2++)
            fprintf(out, "%s%lld", k2 ? "," : "", (long long)b->dims[k2]);
        fputs("]\n", out);
    }
    free(idx);
}

/* Kernel calls run from after (b0, i0) to before (b1, i1), a chunk loop's body once per chunk
 * of each sequence: the work a transfer between the two can hide behind. */
static int64_t calls_between(const sbp_train_program *p, int b0, int i0, int b1, int i1)
{
    int64_t n = 0;
    for (int bi = b0; bi <= b1; bi++) {
        const tp_block *blk = p->blocks[bi];
        int lo = bi == b0 ? i0 + 1 : 0, hi = bi == b1 ? i1 : blk->n_insts;
        for (int i = lo; i < hi; i++) {
            int64_t times = 1;
            for (int l = 0; l < blk->n_loops; l++) {
                const tp_loop *lp = &blk->loops[l];
                if (lp->first <= i && i < lp->end && lp->step > 0)
                    times = lp->batch * ((lp->stop - lp->begin + lp->step - 1) / lp->step);
            }
            n += times;
        }
    }
    return n;
}

/* --offload: each transfer, its bytes and the compute between the copy and its wait. */
static void transfers(FILE *out, const sbp_train_program *p)
{
    char h[32];
    size_t gb = 0;
    for (int i = 0; i < p->n_grad_transfers; i++)
        gb += p->grad_transfers[i].bytes;
    if (p->n_grad_transfers > 0)
        fprintf(out, "offload: %d gradients (%s) accumulated on the device and sent to the host "
                     "block after their last contribution; the copy runs next to the kernel "
                     "calls before its wait (the copy in happens when accumulating only):\n",
                p->n_grad_transfers, human(h, sizeof h, gb));
    for (int i = 0; i < p->n_grad_transfers; i++) {
        const tp_transfer *t = &p->grad_transfers[i];
        fprintf(out, "  %-44s %10zu B  in in %s behind %lld calls, out in %s behind %lld "
                     "calls\n",
                p->bufs[t->buf]->name, t->bytes, p->blocks[t->in_block]->name,
                (long long)calls_between(p, t->in_block, t->in_inst, t->in_wait_block,
                                         t->in_wait_inst),
                p->blocks[t->out_block]->name,
                (long long)calls_between(p, t->out_block, t->out_inst, t->out_wait_block,
                                         t->out_wait_inst));
    }
    if (p->n_transfers == 0)
        return;
    fprintf(out, "offload: %d buffers (%s) in host memory between forward and backward; each "
                 "copy runs on the copy stream next to the kernel calls before its wait:\n",
            p->n_transfers, human(h, sizeof h, p->host_bytes));
    for (int i = 0; i < p->n_transfers; i++) {
        const tp_transfer *t = &p->transfers[i];
        fprintf(out, "  %-44s %10zu B  out in %s behind %lld calls, back in %s behind %lld "
                     "calls\n",
                p->bufs[t->buf]->name, t->bytes, p->blocks[t->out_block]->name,
                (long long)calls_between(p, t->out_block, t->out_inst, t->out_wait_block,
                                         t->out_wait_inst),
                p->blocks[t->in_block]->name,
                (long long)calls_between(p, t->in_block, t->in_inst, t->in_wait_block,
                                         t->in_wait_inst));
    }
}

int sbp_report_write(FILE *out, const sbp_report_entry *e, int n, int main_index, ir_diag *d)
{
    figures *f = compute_all(e, n, d);
    if (!f)
        return IR_ERR;
    const sbp_train_program *any = NULL;
    for (int i = 0; i < n && !any; i++)
        any = f[i].p;
    fputs("memory plan", out);
    if (any)
        fprintf(out, ": B = %lld, T = %lld, V = %lld, objective %s%s, %d parameter tensors",
                (long long)any->batch, (long long)any->seq_len, (long long)any->vocab,
                sbp_objective_name(any->objective), any->per_document ? " per document" : "",
                any->n_params);
    fputs("\n\n", out);
    fprintf(out, "  %-32s", "bytes");
    for (int i = 0; i < n; i++)
        fprintf(out, " %*s", COLW, f[i].name);
    fputc('\n', out);
    row(out, "parameters", f, n, offsetof(figures, params));
    row(out, "gradients", f, n, offsetof(figures, grads));
    row(out, "optimizer state (AdamW m, v)", f, n, offsetof(figures, opt));
    row(out, "workspace, planned", f, n, offsetof(figures, ws));
    row(out, "workspace, liveness lower bound", f, n, offsetof(figures, lower));
    fprintf(out, "  %-32s", "planned / lower bound");
    for (int i = 0; i < n; i++) {
        if (!f[i].p || !f[i].lower)
            fprintf(out, " %*s", COLW, "-");
        else
            fprintf(out, " %*.3f", COLW, (double)f[i].ws / (double)f[i].lower);
    }
    fputc('\n', out);
    fprintf(out, "  %-32s\n", "live at the workspace's peak:");
    for (int c = 0; c < N_CAT; c++)
        cat_row(out, c, f, n);
    row(out, "peak (params+grads+opt+workspace)", f, n, offsetof(figures, total));
    fprintf(out, "  %-32s", "");
    for (int i = 0; i < n; i++) {
        char h[32];
        fprintf(out, " %*s", COLW, f[i].p ? human(h, sizeof h, f[i].total) : "-");
    }
    fputc('\n', out);
    /* --offload: what lives in host memory instead (not in the peak above, a device figure) */
    bool any_host = false;
    for (int i = 0; i < n; i++)
        any_host |= f[i].p && (f[i].p->n_transfers > 0 || f[i].p->offload_optimizer);
    if (any_host) {
        fprintf(out, "  %-32s", "host: masters, AdamW m, v, grads");
        for (int i = 0; i < n; i++) {
            if (f[i].p && f[i].p->offload_optimizer)
                fprintf(out, " %*zu", COLW, sbp_train_host_state_bytes(f[i].p) - f[i].p->host_bytes);
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fputc('\n', out);
        fprintf(out, "  %-32s", "host: offloaded checkpoints");
        for (int i = 0; i < n; i++) {
            if (f[i].p && f[i].p->n_transfers > 0)
                fprintf(out, " %*zu", COLW, f[i].p->host_bytes);
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fprintf(out, "\n  %-32s", "host: bytes moved per step");
        for (int i = 0; i < n; i++) { /* checkpoints out and back; gradients out, weights in */
            const sbp_train_program *q = f[i].p;
            if (q && (q->n_transfers > 0 || q->offload_optimizer))
                fprintf(out, " %*zu", COLW, 2 * q->host_bytes +
                        (q->offload_optimizer ? (q->grad_elems + q->param_elems) * 4 : 0));
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fputc('\n', out);
    }
    /* the evaluation program (sbp_step_eval): forward only, its own plan */
    bool any_eval = false;
    for (int i = 0; i < n; i++)
        any_eval |= f[i].p && f[i].p->eval;
    if (any_eval) {
        fprintf(out, "  %-32s", "evaluation: workspace, planned");
        for (int i = 0; i < n; i++) {
            if (f[i].p && f[i].p->eval)
                fprintf(out, " %*zu", COLW, f[i].p->eval->workspace_bytes);
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fprintf(out, "\n  %-32s", "evaluation: peak (params+ws)");
        for (int i = 0; i < n; i++) {
            char h[32];
            if (f[i].p && f[i].p->eval)
                fprintf(out, " %*s", COLW,
                        human(h, sizeof h, f[i].params + f[i].p->eval->workspace_bytes));
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fputc('\n', out);
    }
    /* the log-probability program (sbp_step_logps, DPO / GRPO): forward only, its own plan */
    bool any_logps = false;
    for (int i = 0; i < n; i++)
        any_logps |= f[i].p && f[i].p->logps;
    if (any_logps) {
        fprintf(out, "  %-32s", "log-probs: workspace, planned");
        for (int i = 0; i < n; i++) {
            if (f[i].p && f[i].p->logps)
                fprintf(out, " %*zu", COLW, f[i].p->logps->workspace_bytes);
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fprintf(out, "\n  %-32s", "log-probs: peak (params+ws)");
        for (int i = 0; i < n; i++) {
            char h[32];
            if (f[i].p && f[i].p->logps)
                fprintf(out, " %*s", COLW,
                        human(h, sizeof h, f[i].params + f[i].p->logps->workspace_bytes));
            else
                fprintf(out, " %*s", COLW, "-");
        }
        fputc('\n', out);
    }
    fprintf(out, "  %-32s", "chunk rows (layers / LM head)");
    for (int i = 0; i < n; i++) {
        char c[48] = "-";
        if (f[i].p && f[i].p->strategy == SBP_STRATEGY_STREAM)
            snprintf(c, sizeof c, "%lld / %lld", (long long)f[i].p->chunk,
                     (long long)f[i].p->logits_chunk);
        fprintf(out, " %*s", COLW, c);
    }
    fputc('\n', out);
    fprintf(out, "  %-32s", "instructions (schedule length)");
    for (int i = 0; i < n; i++) {
        if (!f[i].p)
            fprintf(out, " %*s", COLW, "-");
        else
            fprintf(out, " %*d", COLW, f[i].m->n_pos);
    }
    fputc('\n', out);
    fputs("  (also outside the workspace: ids and labels, constants in the step library:", out);
    for (int i = 0; i < n; i++)
        if (f[i].p) {
            fprintf(out, " %zu and %zu bytes)\n", f[i].ids, f[i].consts);
            break;
        }
    for (int i = 0; i < n; i++)
        if (!f[i].p)
            fprintf(out, "  %s: not built%s%s\n", f[i].name, f[i].why ? ": " : "",
                    f[i].why ? f[i].why : "");
    if (main_index >= 0 && main_index < n && f[main_index].p) {
        const figures *m = &f[main_index];
        char h1[32], h2[32];
        fprintf(out, "\n%s: workspace %zu bytes (%s) planned; at most %zu bytes (%s) are live "
                     "at once, first at %s\n",
                m->name, m->ws, human(h1, sizeof h1, m->ws), m->lower,
                human(h2, sizeof h2, m->lower), memplan_pos_name(m->m, m->m->lower_bound_pos));
        if (m->p->eval)
            fprintf(out,
                    "%s evaluation (sbp_step_eval: the forward and the loss, no gradients): "
                    "workspace %zu bytes (%s), %.1f%% of the training step's\n",
                    m->name, m->p->eval->workspace_bytes,
                    human(h1, sizeof h1, m->p->eval->workspace_bytes),
                    m->ws ? 100.0 * (double)m->p->eval->workspace_bytes / (double)m->ws : 0.0);
        else if (m->p->no_eval_why)
            fprintf(out, "%s: no evaluation entry point: %s\n", m->name, m->p->no_eval_why);
        if (m->p->logps)
            fprintf(out,
                    "%s log-probabilities (sbp_step_logps: the forward to each token's label "
                    "log-probability, no gradients): workspace %zu bytes (%s), %.1f%% of the "
                    "training step's\n",
                    m->name, m->p->logps->workspace_bytes,
                    human(h1, sizeof h1, m->p->logps->workspace_bytes),
                    m->ws ? 100.0 * (double)m->p->logps->workspace_bytes / (double)m->ws : 0.0);
        else if (m->p->no_logps_why)
            fprintf(out, "%s: no log-probability entry point: %s\n", m->name,
                    m->p->no_logps_why);
        transfers(out, m->p);
        largest_buffers(out, m, 12);
    }
    free_figures(f, n);
    if (ferror(out))
        return ir_diag_error(d, "writing the report failed");
    return IR_OK;
}

/* ------------------------------------------------------------------ the plot */

static void xml_text(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default:
            if ((unsigned char)*s >= 0x20 || *s == '\n' || *s == '\t')
                fputc(*s, out);
        }
    }
}

/* A round step for about n ticks over [0, max]. */
static double nice_step(double max, int n)
{
    double raw = max / n, p = 1;
    while (p * 10 <= raw)
        p *= 10;
    while (p > raw && p > 1e-9)
        p /= 10;
    double steps[] = {1, 2, 2.5, 5, 10};
    for (int i = 0; i < 5; i++)
        if (p * steps[i] >= raw)
            return p * steps[i];
    return p * 10;
}

int sbp_report_plot_svg(FILE *out, const sbp_report_entry *e, int n, ir_diag *d)
{
    figures *f = compute_all(e, n, d);
    if (!f)
        return IR_ERR;
    static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
    const double W = 960, H = 480, L = 90, R = 30, T = 50, B = 60;
    int max_pos = 1;
    size_t max_bytes = 1;
    for (int i = 0; i < n; i++) {
        if (!f[i].p)
            continue;
        if (f[i].m->n_pos > max_pos)
            max_pos = f[i].m->n_pos;
        if (f[i].ws > max_bytes)
            max_bytes = f[i].ws;
    }
    /* y in MiB, KiB or bytes, whichever gives readable ticks */
    double unit = max_bytes >= (1u << 20) * 2.0 ? 1048576.0 : max_bytes >= 2048 ? 1024.0 : 1.0;
    const char *uname = unit == 1048576.0 ? "MiB" : unit == 1024.0 ? "KiB" : "bytes";
    double ymax_u = (double)max_bytes / unit;
    double ystep = nice_step(ymax_u, 5);
    double ytop = ystep * (double)(int)(ymax_u / ystep + 1);
    double xstep = nice_step((double)max_pos, 8);
    double pw = W - L - R, ph = H - T - B;
#define PX(x) (L + (double)(x) / (double)max_pos * pw)
#define PY(y) (T + ph - (double)(y) / unit / ytop * ph)
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    const sbp_train_program *any = NULL;
    for (int i = 0; i < n && !any; i++)
        any = f[i].p;
    fputs("<text x=\"", out);
    fprintf(out, "%.0f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">", L);
    fputs("Workspace bytes live over the training step", out);
    if (any)
        fprintf(out, " (B = %lld, T = %lld)", (long long)any->batch, (long long)any->seq_len);
    fputs("</text>\n", out);
    if (any) {
        char h[32];
        fprintf(out, "<text x=\"%.0f\" y=\"40\" font-size=\"11\" fill=\"#555\">parameters, "
                     "gradients and AdamW state (%s) are constant and not drawn; dashed: each "
                     "plan's arena</text>\n",
                L, human(h, sizeof h, (any->param_elems + 3 * any->grad_elems) * 4));
    }
    /* axes and grid */
    fprintf(out, "<g stroke=\"#ddd\" stroke-width=\"1\">\n");
    for (double y = 0; y <= ytop + 1e-9; y += ystep)
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", L, PY(y * unit),
                L + pw, PY(y * unit));
    fputs("</g>\n", out);
    fprintf(out, "<g stroke=\"black\" stroke-width=\"1\">\n"
                 "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n"
                 "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n</g>\n",
            L, T, L, T + ph, L, T + ph, L + pw, T + ph);
    fputs("<g text-anchor=\"end\">\n", out);
    for (double y = 0; y <= ytop + 1e-9; y += ystep)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", L - 6, PY(y * unit) + 4, y);
    fputs("</g>\n<g text-anchor=\"middle\">\n", out);
    for (double x = 0; x <= max_pos + 1e-9; x += xstep)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">%g</text>\n", PX(x), T + ph + 16, x);
    fputs("</g>\n", out);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">schedule position "
                 "(instructions in execution order)</text>\n",
            L + pw / 2, H - 16);
    fprintf(out, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 "
                 "%.1f)\">workspace bytes live (%s)</text>\n",
            T + ph / 2, T + ph / 2, uname);
    /* one step polyline per strategy, and its planned arena dashed */
    int shown = 0;
    for (int i = 0; i < n; i++) {
        if (!f[i].p)
            continue;
        const char *c = colors[i % 5];
        const memplan *m = f[i].m;
        fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", c);
        for (int q = 0; q < m->n_pos; q++)
            fprintf(out, "%s%.2f,%.2f %.2f,%.2f", q ? " " : "", PX(q), PY(m->live[q]), PX(q + 1),
                    PY(m->live[q]));
        fputs("\"/>\n", out);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.2f\" x2=\"%.1f\" y2=\"%.2f\" stroke=\"%s\" "
                     "stroke-dasharray=\"6 4\" stroke-width=\"1\"/>\n",
                L, PY(f[i].ws), PX(m->n_pos), PY(f[i].ws), c);
        /* legend */
        char h1[32], h2[32];
        double ly = T + 10 + 18 * shown;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                     "stroke-width=\"3\"/>\n",
                L + pw - 330, ly, L + pw - 306, ly, c);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\">", L + pw - 300, ly + 4);
        xml_text(out, f[i].name);
        fprintf(out, ": arena %s, lower bound %s</text>\n", human(h1, sizeof h1, f[i].ws),
                human(h2, sizeof h2, f[i].lower));
        shown++;
    }
#undef PX
#undef PY
    fputs("</svg>\n", out);
    free_figures(f, n);
    if (ferror(out))
        return ir_diag_error(d, "writing the plot failed");
    return IR_OK;
}
