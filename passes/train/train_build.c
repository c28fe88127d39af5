/* train_build.c — the driver of the training half of passes/ (passes/train/): from a graph
 * that ends in its loss to a planned training program (sbp_train_build, train.h).
 *
 * The steps, in order, each one call into the layer below (no file below calls back up;
 * scripts/check-passes-layers.py checks it on every build's objects):
 *
 *   autodiff   autodiff.c      parameters, inputs, layouts, which values need and carry a
 *                              gradient (a missing rule is an error here), segments, regions
 *   stream     sequence.c      stream only: each value's and node's relation to the sequence
 *              stream.c        stream only: chunk sizes, what runs once per layer, what per chunk
 *              autodiff.c      the buffers of the alias groups
 *              stream.c or     the blocks: stream's chunk loops, or store / checkpoint's
 *              autodiff.c      forward + one backward per segment
 *              train_verify.c  operands, loops and row coverage checked; sizes and int
 *                              arguments within what the target and the runtime take
 *              precision.c     bf16 programs: which buffers are stored as bf16
 *   plan       plan.c          lifetimes and offsets in one workspace (bf16: the weights' copy
 *                              after it)
 *              train_verify.c  parameters + gradients + workspace within the address space
 *
 * The stage names are sbpc's --dump-ir names (sbp_train_build_until stops after one), and the
 * file that does each stage's main work is named after it. The
 * memory budget (--memory-budget) is handled here too: the largest stream chunks whose plan
 * fits are found by bisection over whole builds, each from the same graph (a build only reads
 * the graph).
 */
#include "memplan.h"
#include "train_internal.h"

#include <stdlib.h>
#include <string.h>

static sbp_train_program *oom(ir_graph *g)
{
    ir_diag_error(g->diag, "out of memory");
    return NULL;
}

/* The builder's state for one program of g: every value its own alias group, no buffers yet. */
static tctx *new_ctx(ir_graph *g, sbp_train_program *p)
{
    tctx *t = ir_arena_alloc(g->arena, sizeof *t);
    int nn = g->n_nodes, max_id = 0;
    for (int k = 0; k < nn; k++)
        if (g->nodes[k]->id > max_id)
            max_id = g->nodes[k]->id;
    if (!t)
        return NULL;
    t->g = g;
    t->p = p;
    t->v = ir_arena_calloc(g->arena, (size_t)g->n_values + 1, sizeof *t->v);
    t->n = ir_arena_calloc(g->arena, (size_t)nn + 1, sizeof *t->n);
    t->node_index = ir_arena_calloc(g->arena, (size_t)max_id + 1, sizeof *t->node_index);
    if (!t->v || !t->n || !t->node_index)
        return NULL;
    for (int i = 0; i < g->n_values; i++) {
        t->v[i].group = i;
        t->v[i].buf = t->v[i].grad = -1;
        t->v[i].first_node = t->v[i].last_use = -1;
    }
    for (int k = 0; k < nn; k++) {
        t->node_index[g->nodes[k]->id] = k;
        for (int i = 0; i < TN_MAX_IN; i++)
            t->n[k].relayout[i] = t->n[k].relay_buf[i] = t->n[k].relay_grad[i] = -1;
        for (int i = 0; i < TN_MAX_AUX; i++)
            t->n[k].aux[i] = -1;
    }
    return t;
}

/* One build at the options' chunk sizes (no budget search). */
static sbp_train_program *build_inner(ir_graph *g, sbp_objective objective,
                                      const sbp_train_options *opt, sbp_train_stage stop,
                                      sp_undo *undo)
{
    ir_graph_compact(g);
    if (g->n_outputs != 1) {
        ir_diag_error(g->diag, "the graph must end in one loss (run the objective pass)");
        return NULL;
    }
    const ir_value *loss = g->outputs[0];
    if (!loss->producer || (loss->producer->op != IR_OP_CROSS_ENTROPY &&
                            loss->producer->op != IR_OP_SOFTMAX_CE_LOSS)) {
        ir_diag_error(g->diag, "the loss '%s' must be made by a CrossEntropy node", loss->name);
        return NULL;
    }
    sbp_train_program *p = ir_arena_alloc(g->arena, sizeof *p);
    tctx *t = p ? new_ctx(g, p) : NULL;
    if (!t)
        return oom(g);
    p->g = g;
    t->sp_undo = undo;
    /* the autodiff stage's program is the plain reverse-mode one: every value kept (store) */
    p->strategy = stop == SBP_TRAIN_UNTIL_AUTODIFF ? SBP_STRATEGY_STORE
                  : opt                            ? opt->strategy
                                                   : SBP_STRATEGY_STORE;
    p->objective = objective;
    p->forward_only = opt && opt->forward_only;
    p->logp_only = p->forward_only && opt->logp_only;
    if (p->logp_only && objective != SBP_OBJECTIVE_DPO && objective != SBP_OBJECTIVE_GRPO) {
        ir_diag_error(g->diag, "a log-probability program is for the dpo and grpo objectives, "
                               "not %s", sbp_objective_name(objective));
        return NULL;
    }
    p->packed = opt && opt->packed;
    p->per_document = opt && opt->per_document;
    if (p->per_document && (!p->packed || (objective != SBP_OBJECTIVE_DPO &&
                                           objective != SBP_OBJECTIVE_GRPO))) {
        ir_diag_error(g->diag, "--per-document applies to --packed steps of the dpo and grpo "
                               "objectives, not %s%s",
                      p->packed ? "" : "unpacked ", sbp_objective_name(objective));
        return NULL;
    }
    p->seq_parallel = opt && opt->seq_parallel >= 1 ? opt->seq_parallel : 0;
    if (p->seq_parallel >= 1) {
        const char *why = opt->bf16 ? "--precision bf16 (the exchanging kernels are fp32)"
                          : opt->offload_checkpoints || opt->offload_optimizer
                              ? "--offload"
                          : objective == SBP_OBJECTIVE_DPO || objective == SBP_OBJECTIVE_GRPO
                              ? "the dpo and grpo objectives (a row's log-probability and "
                                "token count would be summed over the ranks)"
                              : NULL;
        if (why) {
            ir_diag_error(g->diag, "--seq-parallel does not yet support %s", why);
            return NULL;
        }
    }
    const char *red = ir_attr_string(loss->producer, "reduction", "mean");
    p->loss_is_mean = strcmp(red, "sum") != 0;
    p->vocab = loss->producer->in[0]->rank > 0
                   ? loss->producer->in[0]->dims[loss->producer->in[0]->rank - 1].value
                   : 0;
    ir_node **nodes = g->nodes;
    int nn = g->n_nodes;

    /* autodiff */
    if (lower_analyze(t, loss, opt) != IR_OK)
        return NULL;
    /* stream (the strategy's schedule) */
    bool stream = p->strategy == SBP_STRATEGY_STREAM;
    /* one token: nothing to cut into chunks, and the sequence axis is one of several of size 1,
     * which the analysis cannot tell apart: the length is the cause, not the model */
    if (stream && p->seq_len == 1) {
        ir_diag_error(g->diag, "stream: a sequence length of 1 has no chunks to stream over: "
                      "compile with --seq-len 2 or more, or --strategy checkpoint");
        return NULL;
    }
    if ((stream || p->seq_parallel >= 1) && seq_analyze(t, nodes, nn) != IR_OK)
        return NULL;
    /* sequence parallelism: the rank's share of every row (seqpar.c) */
    p->seq_len_global = p->seq_len;
    if (p->seq_parallel >= 1 && sp_localize(t, nodes, nn) != IR_OK)
        return NULL;
    if (stream && stream_plan(t, nodes, nn, loss, opt) != IR_OK)
        return NULL;
    if (lower_group_buffers(t) != IR_OK)
        return NULL;
    p->loss_buf = tx_root(t, loss)->buf;
    if ((stream ? stream_emit(t, nodes, nn, loss) : lower_emit_blocks(t, nodes, nn, loss)) !=
            IR_OK ||
        g->diag->n_errors)
        return NULL;
    if (sbp_train_verify(p, g->diag) != IR_OK)
        return NULL;
    p->bf16 = opt && opt->bf16; /* precision.c: bf16 storage, sized by the plan */
    if (p->bf16 && sbp_train_mark_bf16(p, g->diag) != IR_OK)
        return NULL;
    p->shadow_elems = p->param_elems; /* the bf16 copy's range, unless base_bf16 narrows it */
    if (p->bf16 && (opt->base_bf16 || opt->offload_optimizer) &&
        sbp_train_place_base_bf16(p, opt->offload_optimizer, g->diag) != IR_OK)
        return NULL;
    p->offload_optimizer = opt && opt->offload_optimizer;
    /* offload: part of the strategy's program (its transfers show in the stream dump); the
     * optimizer's: the gradients leave the device as the backward finishes them */
    bool ck = opt && opt->offload_checkpoints, gr = p->offload_optimizer;
    if ((ck || gr) && !p->forward_only && sbp_train_offload(p, ck, gr, g->diag) != IR_OK)
        return NULL;
    if (opt && opt->host_budget && sbp_train_host_state_bytes(p) > opt->host_budget) {
        ir_diag_error(g->diag, "--host-budget %zu bytes cannot hold the offloaded %s: they need "
                      "%zu bytes of host memory", opt->host_budget,
                      p->offload_optimizer && p->n_transfers ? "checkpoints and optimizer state"
                      : p->offload_optimizer                ? "optimizer state"
                                                            : "checkpoints",
                      sbp_train_host_state_bytes(p));
        return NULL;
    }
    if (stop < SBP_TRAIN_UNTIL_PLAN)
        return p;
    /* plan */
    if (sbp_memplan(p, g->diag) != IR_OK)
        return NULL;
    if (p->bf16)
        sbp_train_place_bf16_shadow(p);
    if (sbp_train_check_totals(p, g->diag) != IR_OK)
        return NULL;
    return p;
}

/* build_inner, with the graph's dims as they were after it: a sequence-parallel build
 * shrinks the sequence axes (seqpar.c), and the next build of the same graph (the budget's
 * search, the evaluation program) starts from the whole rows again. */
static sbp_train_program *build_once(ir_graph *g, sbp_objective objective,
                                     const sbp_train_options *opt, sbp_train_stage stop)
{
    sp_undo undo = {0};
    sbp_train_program *p = build_inner(g, objective, opt, stop, &undo);
    sp_restore(g, &undo);
    return p;
}

/* ------------------------------------------------------------------ the memory budget */

size_t sbp_train_device_grad_bytes(const sbp_train_program *p)
{
    return p->grads_on_host ? 0 : p->grad_elems * sizeof(float);
}

size_t sbp_train_planned_peak(const sbp_train_program *p)
{
    return p->param_elems * sizeof(float) + sbp_train_device_grad_bytes(p) + p->workspace_bytes;
}

size_t sbp_train_host_state_bytes(const sbp_train_program *p)
{
    size_t masters = 0;
    for (int i = 0; p->offload_optimizer && i < p->n_params; i++)
        if (p->params[i].tied_to < 0)
            masters += p->params[i].numel;
    /* fp32 masters, AdamW's m and v and the gradients' host copy, and the checkpoints */
    return p->host_bytes +
           (p->offload_optimizer ? (masters + 3 * p->grad_elems) * sizeof(float) : 0);
}

static sbp_train_program *build_at(ir_graph *g, sbp_objective objective,
                                   const sbp_train_options *base, int64_t chunk, int64_t lc)
{
    sbp_train_options o = *base;
    o.memory_budget = 0;
    o.chunk = chunk;
    o.logits_chunk = lc;
    return build_once(g, objective, &o, SBP_TRAIN_UNTIL_PLAN);
}

/* The largest x in [lo, hi] whose plan fits (lo's does; the peak grows with the chunk, so a
 * bisection finds it). which: 0 the layer chunk, 1 the logits chunk. */
static sbp_train_program *largest_fitting(ir_graph *g, sbp_objective objective,
                                          const sbp_train_options *opt, sbp_train_program *best,
                                          int which, int64_t lo, int64_t hi)
{
    while (lo < hi && best) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        sbp_train_program *p = build_at(g, objective, opt, which ? best->chunk : mid,
                                        which ? mid : best->logits_chunk);
        if (!p)
            return NULL;
        if (sbp_train_planned_peak(p) <= opt->memory_budget) {
            best = p;
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

/* The plan that fits opt->memory_budget: stream's largest chunks among those not given (the
 * layer chunk first, then the logits chunk, each by bisection); other strategies have one plan,
 * which fits or not. Too small: NULL and the smallest budget that would fit. */
static sbp_train_program *fit_budget(ir_graph *g, sbp_objective objective,
                                     const sbp_train_options *opt)
{
    bool stream = opt->strategy == SBP_STRATEGY_STREAM;
    int64_t c0 = opt->chunk > 0 || !stream ? opt->chunk : 1;
    int64_t l0 = opt->logits_chunk > 0 || !stream ? opt->logits_chunk : 1;
    sbp_train_program *p = build_at(g, objective, opt, c0, l0);
    if (!p)
        return NULL;
    size_t need = sbp_train_planned_peak(p);
    if (need > opt->memory_budget) {
        ir_diag_error(g->diag,
                      "memory budget of %zu bytes is too small: the smallest %s plan%s needs "
                      "%zu bytes (parameters %zu + gradients %zu + workspace %zu)",
                      opt->memory_budget, sbp_strategy_name(opt->strategy),
                      stream ? ir_arena_printf(g->arena, " (chunk %lld, logits chunk %lld)",
                                               (long long)p->chunk, (long long)p->logits_chunk)
                             : "",
                      need, p->param_elems * sizeof(float), sbp_train_device_grad_bytes(p),
                      p->workspace_bytes);
        return NULL;
    }
    if (!stream)
        return p;
    /* the logits chunk at most one sequence, as the automatic choice: B*T*V never exists */
    if (opt->chunk <= 0)
        p = largest_fitting(g, objective, opt, p, 0, p->chunk, p->seq_len);
    if (p && opt->logits_chunk <= 0)
        p = largest_fitting(g, objective, opt, p, 1, p->logits_chunk, p->seq_len);
    if (p)
        ir_diag_add(g->diag, IR_SEV_NOTE, NULL, NULL,
                    "memory budget %zu bytes: chunk %lld, logits chunk %lld, planned peak %zu "
                    "bytes",
                    opt->memory_budget, (long long)p->chunk, (long long)p->logits_chunk,
                    sbp_train_planned_peak(p));
    return p;
}

/* ------------------------------------------------------------------ entry points */

const char *sbp_strategy_name(sbp_strategy s)
{
    return s == SBP_STRATEGY_CHECKPOINT ? "checkpoint" : s == SBP_STRATEGY_STREAM ? "stream"
                                                                                 : "store";
}

const char *sbp_grpo_norm_name(sbp_grpo_norm n)
{
    return n == SBP_GRPO_NORM_TOKEN ? "token" : "sequence";
}

const char *sbp_train_stage_name(sbp_train_stage s)
{
    return s == SBP_TRAIN_UNTIL_AUTODIFF ? "autodiff" : s == SBP_TRAIN_UNTIL_SCHEDULE ? "stream"
                                                                                      : "plan";
}

/* used[i]: program q uses buffer i somewhere ([n_bufs], malloc'd; NULL when out of memory). */
static bool *used_bufs(const sbp_train_program *q)
{
    bool *used = calloc((size_t)q->n_bufs + 1, sizeof *used);
    for (int b = 0; used && b < q->n_blocks; b++)
        for (int k = 0; k < q->blocks[b]->n_insts; k++)
            for (int j = 0; j < TP_MAX_BUFS; j++)
                if (q->blocks[b]->insts[k].buf[j] >= 0)
                    used[q->blocks[b]->insts[k].buf[j]] = true;
    return used;
}

static int cmp_buf_name(const void *x, const void *y)
{
    return strcmp((*(const tp_buf *const *)x)->name, (*(const tp_buf *const *)y)->name);
}

/* The evaluation program is emitted into the training step's file and shares what the file
 * holds once: the parameter block's layout and the constants (codegen prints the training
 * program's, by name). NULL when it can, else why not. */
static const char *eval_shares(const sbp_train_program *p, const sbp_train_program *e)
{
    ir_arena *a = p->g->arena;
    if (e->n_params != p->n_params || e->param_elems != p->param_elems)
        return "its parameter table differs";
    for (int i = 0; i < p->n_params; i++)
        if (e->params[i].value != p->params[i].value || e->params[i].offset != p->params[i].offset)
            return ir_arena_printf(a, "parameter '%s' is laid out differently",
                                   p->params[i].value->name);
    bool *ue = used_bufs(e), *up = used_bufs(p);
    const tp_buf **tc = malloc(sizeof *tc * ((size_t)p->n_bufs + 1)); /* p's constants by name */
    const char *why = !ue || !up || !tc ? "out of memory" : NULL;
    size_t nc = 0;
    for (int k = 0; !why && k < p->n_bufs; k++)
        if (p->bufs[k]->kind == TP_BUF_CONST && up[k])
            tc[nc++] = p->bufs[k];
    if (!why)
        qsort(tc, nc, sizeof *tc, cmp_buf_name);
    for (int i = 0; !why && i < e->n_bufs; i++) {
        const tp_buf *b = e->bufs[i];
        if (b->kind != TP_BUF_CONST || !ue[i])
            continue;
        const tp_buf *key = b, **hit = bsearch(&key, tc, nc, sizeof *tc, cmp_buf_name);
        const tp_buf *t = hit ? *hit : NULL;
        if (!t || t->numel != b->numel || t->is_int != b->is_int ||
            (b->numel && memcmp(t->data, b->data, b->numel * 4) != 0))
            why = ir_arena_printf(a, "its constant '%s' is not the training step's", b->name);
    }
    free(tc);
    free(ue);
    free(up);
    return why;
}

/* The evaluation program of training program p (train.h, "Evaluation"): the same graph and
 * options at p's chunk sizes, forward only, its blocks renamed eval_*. For DPO / GRPO, whose
 * loss needs inputs of its own, the log-probability program instead (train.h,
 * "Log-probabilities"; blocks logp_*, in p->logps) and p->no_eval_why says why there is no
 * evaluation. NULL with a diagnostic when the build fails (it should not once the training
 * program built: same graph, fewer rules). */
static int build_eval(ir_graph *g, sbp_train_program *p, const sbp_train_options *opt)
{
    bool pref = p->objective == SBP_OBJECTIVE_DPO || p->objective == SBP_OBJECTIVE_GRPO;
    if (pref)
        p->no_eval_why = ir_arena_printf(g->arena,
                                         "the %s objective has no evaluation entry point (it "
                                         "needs its own inputs; sbp_step_logps computes its "
                                         "log-probabilities)",
                                         sbp_objective_name(p->objective));
    sbp_train_options o = *opt;
    o.memory_budget = 0;
    o.eval = false;
    o.forward_only = true;
    o.logp_only = pref;
    o.chunk = p->chunk;
    o.logits_chunk = p->logits_chunk;
    const char *what = pref ? "log-probability" : "evaluation";
    sbp_train_program *e = build_once(g, p->objective, &o, SBP_TRAIN_UNTIL_PLAN);
    if (!e)
        return ir_diag_error(g->diag, "building the %s program failed", what);
    const char *why = eval_shares(p, e);
    if (why) { /* not expected: the emitted step would then lack the entry point */
        if (pref)
            p->no_logps_why = why;
        else
            p->no_eval_why = why;
        ir_diag_add(g->diag, IR_SEV_WARNING, NULL, NULL, "no %s entry point: %s", what, why);
        return IR_OK;
    }
    for (int b = 0; b < e->n_blocks; b++)
        e->blocks[b]->name =
            ir_arena_printf(g->arena, "%s_%s", pref ? "logp" : "eval", e->blocks[b]->name);
    if (pref)
        p->logps = e;
    else
        p->eval = e;
    return IR_OK;
}

/* The automatic logits chunk (stream without --logits-chunk or a budget): the first guess, about
 * 2^22 floats of logits (stream.c), is 64 rows for a 150k vocabulary, and every LM-head chunk
 * reads the head weight and reads and writes its gradient (0.6 GB each for Qwen3-0.6B): at 64
 * rows that traffic, 64 times a step at T = 4096, and a GEMM too thin for tensor cores cost
 * more than the head's arithmetic. Grown by bisection to the largest chunk whose planned peak
 * stays within 1/STREAM_HEAD_GROWTH above the first guess's (up to a whole sequence), so the
 * head's buffers stay a small part of the peak. p: planned at the first guess. */
#define STREAM_HEAD_GROWTH 8
static sbp_train_program *grow_logits_chunk(ir_graph *g, sbp_objective objective,
                                            const sbp_train_options *opt, sbp_train_program *p)
{
    const size_t peak0 = sbp_train_planned_peak(p);
    const int64_t lc0 = p->logits_chunk;
    sbp_train_options o = *opt;
    o.memory_budget = peak0 + peak0 / STREAM_HEAD_GROWTH;
    sbp_train_program *best = largest_fitting(g, objective, &o, p, 1, lc0, p->seq_len);
    if (best && best->logits_chunk != lc0)
        ir_diag_add(g->diag, IR_SEV_NOTE, NULL, NULL,
                    "logits chunk %lld rows (automatic): the largest up to a sequence whose "
                    "planned peak, %zu bytes, is within 1/%d of the %lld-row chunk's %zu bytes "
                    "(fewer passes over the LM head's weight and gradient); --logits-chunk or "
                    "--memory-budget choose otherwise",
                    (long long)best->logits_chunk, sbp_train_planned_peak(best),
                    STREAM_HEAD_GROWTH, (long long)lc0, peak0);
    return best;
}

sbp_train_program *sbp_train_build_until(ir_graph *g, sbp_objective objective,
                                         const sbp_train_options *opt, sbp_train_stage stop)
{
    sbp_train_program *p;
    /* a program of its own chunks (evaluation, log-probabilities) takes them as given */
    const bool auto_head = opt && !opt->memory_budget && opt->strategy == SBP_STRATEGY_STREAM &&
                           opt->logits_chunk <= 0 && !opt->forward_only;
    if (!opt || !opt->memory_budget) {
        p = build_once(g, objective, opt, auto_head ? SBP_TRAIN_UNTIL_PLAN : stop);
        if (p && auto_head && p->logits_chunk < p->seq_len)
            p = grow_logits_chunk(g, objective, opt, p);
    } else {
        p = fit_budget(g, objective, opt);
    }
    if (p && stop == SBP_TRAIN_UNTIL_PLAN && opt && opt->eval && !opt->forward_only &&
        build_eval(g, p, opt) != IR_OK)
        return NULL;
    if (!p || stop == SBP_TRAIN_UNTIL_PLAN || !opt || (!opt->memory_budget && !auto_head))
        return p;
    /* a dump before the plan shows the program at the chunks the budget chose */
    sbp_train_options o = *opt;
    o.memory_budget = 0;
    o.chunk = p->chunk;
    o.logits_chunk = p->logits_chunk;
    return build_once(g, objective, &o, stop);
}

sbp_train_program *sbp_train_build(ir_graph *g, sbp_objective objective,
                                   const sbp_train_options *opt)
{
    return sbp_train_build_until(g, objective, opt, SBP_TRAIN_UNTIL_PLAN);
}
