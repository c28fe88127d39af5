/* objective_pref.c — DPO and GRPO at the LM head: the lowering of the loss node for them.
 *
 * Conventions (shared by both): labels[b,t] is the target of position t, -100 where the
 * position is not scored; lp(b,t) = log softmax(logits[b,t])[labels[b,t]], and the logp of a row
 * is Σ_t lp(b,t) over its scored positions. Full logits never exist with stream: lp comes out
 * of the head's chunk loop (sbprt_label_logprob_forward), and the gradient goes back into it as
 * dlogits = dL/dlp * (onehot - softmax) (sbprt_label_logprob_grad, written over the logits
 * chunk in place, as the fused cross-entropy does).
 *
 * GRPO is separable over tokens given its inputs (advantages [B], old_logps [B*T] or none,
 * ref_logps [B*T]): per scored token, ratio = exp(lp - old),
 *   l = -min(ratio*A, clip(ratio, 1-ε, 1+ε)*A) + β (exp(ref - lp) - (ref - lp) - 1),
 * and the loss is Σ w(b) l over tokens with w(b) = 1 / (scored tokens of row b * rows) for the
 * sequence normalisation, 1 / (scored tokens of the batch) for the token one. The weights are
 * computed from the labels before the loss runs (GRPO_WEIGHTS, a host step), so each chunk of
 * the head computes its tokens' weighted losses and dL/dlp (sbprt_grpo_token_loss) on its own:
 *   store / checkpoint: forward  GRPO_WEIGHTS, lp, the loss;
 *                       backward GRPO_WEIGHTS, lp and lse, the loss (to scratch) and dL/dlp,
 *                                dlogits (the loss rule recomputes, as cross-entropy's does);
 *   stream head chunk:  lp and lse, the loss (+=) and dL/dlp, dlogits in place.
 *
 * DPO is not separable: pair i = (row i, row B/2 + i), z = β ((logp_c - ref_c) - (logp_r -
 * ref_r)), L = mean over pairs of -log σ(z), so dL/dlp(b,t) = dL/dlogp(b) is one coefficient per
 * row, known only once every token of both rows of the pair has been seen. The per-token lp go
 * to tok_logp [B*T]; a host step (DPO_COEF) sums them per row, computes the loss and the
 * coefficients ±β σ(-z) / pairs and writes them per token to tok_dlogp; the backward then takes
 * dL/dlp = tok_dlogp:
 *   store / checkpoint: forward  lp into tok_logp, DPO_COEF;  backward dlogits;
 *   stream:             a first chunk loop over the head computing tok_logp (no gradient),
 *                       DPO_COEF, then the head's usual fused loop with dlogits from tok_dlogp
 *                       (stream.c): exact; the LM head's forward (norm + GEMM) runs twice.
 *
 * Per document (p->per_document, sbpc --per-document; codegen/sbp_step.h, "Per document"): the
 * unit of either objective is each document of a row. DPO keeps its program: DPO_COEF reads
 * the document ids and pairs document k of row i with document k of row B/2 + i. GRPO's
 * weights and advantages become per token (GRPO_DOC_WEIGHTS into the flat tok_weight and
 * tok_adv buffers, [B*T] and never sliced: GRPO_DOC_LOSS reads them at the chunk's absolute
 * rows, as it reads old and ref).
 *
 * The log-probability program of either objective (logp_only, train.h) stops at tok_logp: the
 * loss node lowers to LOGPROB_FWD alone (store / checkpoint: pref_loss_fwd; stream: the head's
 * one chunk loop is DPO's first pass, stream.c), and the step's sbp_step_logps reads tok_logp.
 *
 * The loss buffer holds the loss itself (loss_is_mean false); the normalisation uses the step's
 * denominator when one is given (gradient accumulation: GRPO sequence rows, GRPO token scored
 * tokens, DPO pairs, over all micro-batches), see codegen/emit_objective.c.
 */
#include "train_internal.h"

#include <math.h>
#include <string.h>

#define BUFS(...) ((const int[]){__VA_ARGS__})
#define ARGS(...) ((const tp_arg[]){__VA_ARGS__})

bool pref_objective(const sbp_train_program *p)
{
    return p->objective == SBP_OBJECTIVE_DPO || p->objective == SBP_OBJECTIVE_GRPO;
}

int pref_setup(tctx *t, const sbp_train_options *opt)
{
    sbp_train_program *p = t->p;
    p->tok_logp_buf = p->tok_dlogp_buf = p->row_weight_buf = -1;
    p->tok_weight_buf = p->tok_adv_buf = -1;
    if (!pref_objective(p))
        return IR_OK;
    p->beta = opt ? opt->beta : 0;
    p->epsilon = opt ? opt->epsilon : 0;
    p->grpo_norm = opt ? opt->grpo_norm : SBP_GRPO_NORM_SEQUENCE;
    p->loss_is_mean = false; /* the loss buffer holds the loss (normalised by the weights) */
    const char *name = sbp_objective_name(p->objective);
    if (!isfinite(p->beta) || p->beta < 0)
        return ir_diag_error(t->g->diag, "--objective %s: beta must be a finite number >= 0 "
                                         "(got %g)", name, p->beta);
    if (p->objective == SBP_OBJECTIVE_GRPO && (!isfinite(p->epsilon) || p->epsilon < 0))
        return ir_diag_error(t->g->diag, "--objective grpo: epsilon must be a finite number >= "
                                         "0 (got %g)", p->epsilon);
    if (p->objective == SBP_OBJECTIVE_DPO && p->batch % 2 != 0)
        return ir_diag_error(t->g->diag, "--objective dpo pairs row i (chosen) with row B/2 + i "
                                         "(rejected): the batch must be even, not %lld",
                             (long long)p->batch);
    if (p->labels_buf < 0)
        return ir_diag_error(t->g->diag, "--objective %s: the loss has no labels input", name);
    return IR_OK;
}

/* The layouts of obj_buf: one value per token, [B, T], sliced by chunk loops (OBJ_TOKENS) or
 * flat (OBJ_FLAT: never sliced, a kernel indexes it at the chunk's absolute rows), or one
 * value per row, [B] (OBJ_ROWS). */
typedef enum { OBJ_ROWS, OBJ_TOKENS, OBJ_FLAT } obj_layout;

/* A program-level float buffer of the layout. */
static int obj_buf(tctx *t, int *slot, const char *name, obj_layout layout, const char *what)
{
    if (*slot >= 0)
        return *slot;
    sbp_train_program *p = t->p;
    size_t n = (size_t)(layout != OBJ_ROWS ? p->batch * p->seq_len : p->batch);
    int b = tx_new_buf(t, TP_BUF_WS, name, NULL, n, false, false, TP_REGION_PERSIST, what);
    if (b < 0)
        return ir_diag_error(t->g->diag, "out of memory"), -1;
    tp_buf *buf = p->bufs[b];
    if (layout != OBJ_ROWS) {
        buf->rank = 2;
        buf->dims[0] = p->batch;
        buf->dims[1] = p->seq_len;
    }
    if (layout == OBJ_TOKENS) { /* (OBJ_FLAT keeps rows 0: chunk loops pass the whole buffer) */
        buf->rows = p->batch * p->seq_len; /* one row per token: chunk loops slice it */
        buf->row_elems = 1;
    }
    return *slot = b;
}

static int tok_logp(tctx *t)
{
    return obj_buf(t, &t->p->tok_logp_buf, "obj_token_logp", OBJ_TOKENS,
                   "each token's label log-probability");
}

static int tok_dlogp(tctx *t)
{
    return obj_buf(t, &t->p->tok_dlogp_buf, "obj_token_dlogp", OBJ_TOKENS,
                   t->p->per_document ? "dL/dlogp of each token: its document's coefficient"
                                      : "dL/dlogp of each token: its row's coefficient");
}

static int row_weight(tctx *t)
{
    return obj_buf(t, &t->p->row_weight_buf, "obj_row_weight", OBJ_ROWS,
                   "each row's weight of its token losses");
}

static int tok_weight(tctx *t)
{
    return obj_buf(t, &t->p->tok_weight_buf, "obj_token_weight", OBJ_FLAT,
                   "each token's weight of its loss: its document's");
}

static int tok_adv(tctx *t)
{
    return obj_buf(t, &t->p->tok_adv_buf, "obj_token_advantage", OBJ_FLAT,
                   "each token's advantage: its document's");
}

static size_t numel(const ir_value *v) { return tx_numel(v); }
static int64_t vocab(const ir_value *logits) { return logits->dims[logits->rank - 1].value; }

int pref_emit_row_weights(tctx *t)
{
    if (t->p->objective != SBP_OBJECTIVE_GRPO)
        return IR_OK;
    const char *what = t->cur_what;
    if (t->p->per_document) {
        int w = tok_weight(t), a = tok_adv(t);
        if (w < 0 || a < 0)
            return IR_ERR;
        t->cur_what = "document weights and advantages";
        tx_emit(t, TP_K_GRPO_DOC_WEIGHTS, BUFS(w, a, t->p->labels_buf), NULL);
        t->cur_what = what;
        return IR_OK;
    }
    int w = row_weight(t);
    if (w < 0)
        return IR_ERR;
    t->cur_what = "row weights";
    tx_emit(t, TP_K_GRPO_WEIGHTS, BUFS(w, t->p->labels_buf), NULL);
    t->cur_what = what;
    return IR_OK;
}

int pref_emit_coefficients(tctx *t)
{
    if (t->p->objective != SBP_OBJECTIVE_DPO)
        return IR_OK;
    int lp = tok_logp(t), dlp = tok_dlogp(t);
    if (lp < 0 || dlp < 0)
        return IR_ERR;
    const char *what = t->cur_what;
    t->cur_what = t->p->per_document ? "loss and document coefficients"
                                     : "loss and row coefficients";
    tx_emit(t, TP_K_DPO_COEF, BUFS(dlp, t->p->loss_buf, lp), NULL);
    t->cur_what = what;
    return IR_OK;
}

/* GRPO: lp (and lse when `lse`) of the rows, then the weighted loss into `loss` and dL/dlp into
 * dlp (-1: not wanted). r0: the rows' first token (the chunk's start in a stream head loop). */
static int grpo_loss(tctx *t, const ir_node *n, int loss, int dlp, int lse)
{
    const ir_value *logits = n->in[0], *labels = n->in[1];
    int64_t N = (int64_t)numel(labels), V = vocab(logits);
    int lp = tx_aux(t, n, 2, (size_t)N, false, false, "logp");
    bool doc = t->p->per_document;
    int w = doc ? tok_weight(t) : row_weight(t), a = doc ? tok_adv(t) : -1;
    if (lp < 0 || w < 0 || (doc && a < 0))
        return IR_ERR;
    tx_emit(t, TP_K_LOGPROB_FWD, BUFS(lp, lse, tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(N), A_I(V)));
    if (doc) { /* each token's weight and advantage at its absolute row r0 + i */
        tx_emit(t, TP_K_GRPO_DOC_LOSS, BUFS(loss, dlp, lp, tx_in(t, n, 1), w, a),
                ARGS(A_I(N), t->chunk ? A_T0(0) : A_I(0), A_F(t->p->beta),
                     A_F(t->p->epsilon)));
        return IR_OK;
    }
    tx_emit(t, TP_K_GRPO_LOSS, BUFS(loss, dlp, lp, tx_in(t, n, 1), w),
            ARGS(A_I(N), t->chunk ? A_T0(0) : A_I(0), A_I(t->T), A_F(t->p->beta),
                 A_F(t->p->epsilon)));
    return IR_OK;
}

int pref_loss_fwd(tctx *t, const ir_node *n)
{
    if (t->p->logp_only) /* the log-probability program: each token's, and nothing after */
        return pref_loss_logp(t, n);
    const ir_value *logits = n->in[0], *labels = n->in[1];
    int64_t N = (int64_t)numel(labels), V = vocab(logits);
    int loss = tx_out(t, n, 0);
    if (t->p->objective == SBP_OBJECTIVE_DPO) {
        int lp = tok_logp(t);
        if (lp < 0)
            return IR_ERR;
        tx_emit(t, TP_K_LOGPROB_FWD, BUFS(lp, -1, tx_in(t, n, 0), tx_in(t, n, 1)),
                ARGS(A_I(N), A_I(V)));
        return pref_emit_coefficients(t);
    }
    tx_emit(t, TP_K_MEMSET_ZERO, BUFS(loss), ARGS(A_I(4)));
    if (pref_emit_row_weights(t) != IR_OK)
        return IR_ERR;
    return grpo_loss(t, n, loss, -1, -1);
}

int pref_loss_logp(tctx *t, const ir_node *n)
{
    int lp = tok_logp(t);
    if (lp < 0)
        return IR_ERR;
    tx_emit(t, TP_K_LOGPROB_FWD, BUFS(lp, -1, tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I((int64_t)numel(n->in[1])), A_I(vocab(n->in[0]))));
    return IR_OK;
}

/* The logits' gradient: written over it when the loss is its last reader (or reads a relayout
 * copy), else into scratch that is then added (as cross-entropy's rule does). */
int pref_loss_bwd(tctx *t, const ir_node *n)
{
    int gl = tx_gin(t, n, 0);
    const ir_value *logits = n->in[0], *labels = n->in[1];
    int64_t N = (int64_t)numel(labels), V = vocab(logits);
    bool fused = t->chunk && t->chunk->fused_loss;
    bool grpo = t->p->objective == SBP_OBJECTIVE_GRPO;
    if (gl < 0) {
        /* nothing trainable before the head: the fused chunk still owes the GRPO loss */
        return fused && grpo ? grpo_loss(t, n, tx_out(t, n, 0), -1, -1) : IR_OK;
    }
    bool last_reader = tx_node(t, n)->relayout[0] >= 0 ||
                       tx_root(t, logits)->last_use == tx_index(t, n);
    int dst = last_reader ? gl : tx_aux(t, n, 1, (size_t)(N * V), false, true, "dlogits");
    int dlp, lse = -1;
    if (grpo) {
        if (!t->chunk && pref_emit_row_weights(t) != IR_OK)
            return IR_ERR;
        /* fused: this call is the loss's forward too; else the loss goes to scratch */
        int loss = fused ? tx_out(t, n, 0) : tx_aux(t, n, 0, 1, false, false, "loss_again");
        if (!fused)
            tx_emit(t, TP_K_MEMSET_ZERO, BUFS(loss), ARGS(A_I(4)));
        dlp = tx_aux(t, n, 3, (size_t)N, false, false, "dlogp");
        lse = tx_aux(t, n, 4, (size_t)N, false, false, "lse");
        if (grpo_loss(t, n, loss, dlp, lse) != IR_OK)
            return IR_ERR;
    } else {
        dlp = tok_dlogp(t); /* DPO_COEF wrote it */
        if (dlp < 0)
            return IR_ERR;
    }
    tx_emit(t, TP_K_LOGPROB_GRAD, BUFS(dst, dlp, tx_in(t, n, 0), tx_in(t, n, 1), lse),
            ARGS(A_I(N), A_I(V)));
    if (!last_reader)
        tx_emit(t, TP_K_ACCUMULATE, BUFS(gl, dst), ARGS(A_I(N * V)));
    return IR_OK;
}
