/* grad_rules.c — the gradient rule table: for every op a training step can contain, its layout
 * plan, its forward lowering to runtime calls and its gradient rule.
 *
 * Reverse mode over the canonical IR: autodiff.c walks the nodes backwards and calls each
 * node's gradient rule, which reads the node's saved forward values and the gradient of its
 * outputs and ACCUMULATES into the gradients of its inputs (the runtime's backward kernels
 * add, and every gradient buffer is zeroed once), so a value with several uses gets the sum of
 * their contributions without any bookkeeping here. An op with no row, or whose row has no
 * gradient rule while a gradient must flow through it, is a compile error naming the node.
 *
 * The `diff` column lists the input slots a gradient flows to: weights, activations; never
 * token ids, labels, RoPE tables or shape operands.
 *
 * Conventions of the rules below: x/y/g... are program buffer ids (-1: none, printed as NULL);
 * a rule emits nothing for a gradient nobody wants. Shapes come from the IR (all known after
 * bind-dims); row-wise ops treat their operand as [rows, last dim] whatever its layout.
 */
#include "train_internal.h"

#include "sbprt.h" /* sbprt_moe_scratch_floats */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define BUFS(...) ((const int[]){__VA_ARGS__})
#define ARGS(...) ((const tp_arg[]){__VA_ARGS__})

static int64_t dim(const ir_value *v, int i) { return v->dims[i < 0 ? v->rank + i : i].value; }
static int64_t numel(const ir_value *v) { return (int64_t)tx_numel(v); }
static int64_t rows_of(const ir_value *v)
{
    int64_t d = v->rank > 0 ? dim(v, -1) : 1;
    return d > 0 ? numel(v) / d : 0;
}

static bool same_dims(const ir_value *a, const ir_value *b)
{
    if (a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i].value != b->dims[i].value)
            return false;
    return true;
}

/* Checks that every count a kernel takes as `int` fits. */
static int fits_int(tctx *t, const ir_node *n, int64_t x)
{
    if (x < 0 || x > INT32_MAX)
        return tx_error(t, n, "an extent of %lld does not fit the runtime's int sizes",
                        (long long)x);
    return IR_OK;
}

/* Physical dims of input slot as stored (axes 1 and 2 exchanged when swapped). */
static void stored_dims(tctx *t, const ir_node *n, int slot, int64_t *d)
{
    const ir_value *v = n->in[slot];
    for (int i = 0; i < v->rank; i++)
        d[i] = v->dims[i].value;
    if (t->v[v->id].layout == TL_SWAP) {
        int64_t x = d[1];
        d[1] = d[2];
        d[2] = x;
    }
}

static const int64_t swap12[4] = {0, 2, 1, 3};

/* ------------------------------------------------------------------ views */

static int plan_cast(tctx *t, const ir_node *n)
{
    ir_dtype a = n->in[0]->dtype, b = n->out[0]->dtype;
    if (!((ir_dtype_is_float(a) && ir_dtype_is_float(b)) ||
          (ir_dtype_is_int(a) && ir_dtype_is_int(b))))
        return tx_error(t, n, "Cast from %s to %s at run time is not supported in a training "
                              "step", ir_dtype_name(a), ir_dtype_name(b));
    return plan_view(t, n);
}

/* A view op whose input is stored swapped: put the data in logical order. */
static int view_fwd(tctx *t, const ir_node *n)
{
    int64_t d[4];
    stored_dims(t, n, 0, d);
    tx_emit(t, TP_K_PERMUTE_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)),
            ARGS(A_I(4), A_IS(t, d, 4), A_IS(t, swap12, 4)));
    return IR_OK;
}

static int view_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int64_t d[4];
    stored_dims(t, n, 0, d);
    tx_emit(t, TP_K_PERMUTE_BWD, BUFS(gx, gy), ARGS(A_I(4), A_IS(t, d, 4), A_IS(t, swap12, 4)));
    return IR_OK;
}

/* ------------------------------------------------------------------ Transpose */

/* The permutation to apply to the input as stored: out axis i is stored-input axis q[i]. */
static int transpose_perm(tctx *t, const ir_node *n, int64_t *q)
{
    const ir_value *x = n->in[0];
    int r = x->rank;
    const ir_attr *a = ir_attr_get(n, "perm");
    int64_t p[IR_MAX_RANK];
    for (int i = 0; i < r; i++)
        p[i] = a ? (i < a->n ? a->ints[i] : -1) : r - 1 - i;
    for (int i = 0; i < r; i++)
        if (p[i] < 0 || p[i] >= r)
            return tx_error(t, n, "invalid perm");
    bool swapped = t->v[x->id].layout == TL_SWAP;
    for (int i = 0; i < r; i++)
        q[i] = swapped ? swap12[p[i]] : p[i];
    return IR_OK;
}

static int plan_transpose(tctx *t, const ir_node *n)
{
    tn *r = tx_node(t, n);
    int64_t q[IR_MAX_RANK];
    int rank = n->in[0]->rank;
    if (transpose_perm(t, n, q) != IR_OK)
        return IR_ERR;
    bool ident = true, is_swap = rank == 4;
    for (int i = 0; i < rank; i++) {
        ident = ident && q[i] == i;
        if (rank == 4)
            is_swap = is_swap && q[i] == swap12[i];
    }
    r->view = ident || is_swap;
    r->out_layout = is_swap ? TL_SWAP : TL_NAT;
    return IR_OK;
}

static int transpose_fwd(tctx *t, const ir_node *n)
{
    int64_t q[IR_MAX_RANK], d[IR_MAX_RANK];
    int rank = n->in[0]->rank;
    transpose_perm(t, n, q);
    stored_dims(t, n, 0, d);
    tx_emit(t, TP_K_PERMUTE_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)),
            ARGS(A_I(rank), A_IS(t, d, rank), A_IS(t, q, rank)));
    return IR_OK;
}

static int transpose_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int64_t q[IR_MAX_RANK], d[IR_MAX_RANK];
    int rank = n->in[0]->rank;
    transpose_perm(t, n, q);
    stored_dims(t, n, 0, d);
    tx_emit(t, TP_K_PERMUTE_BWD, BUFS(gx, gy), ARGS(A_I(rank), A_IS(t, d, rank), A_IS(t, q, rank)));
    return IR_OK;
}

/* ------------------------------------------------------------------ Embedding / Gather */

static int plan_embedding(tctx *t, const ir_node *n)
{
    const ir_value *table = n->in[0], *ids = n->in[1];
    if (table->rank != 2 || !ir_dtype_is_int(ids->dtype))
        return tx_error(t, n, "an embedding needs a [V,D] table and integer ids");
    if (n->op == IR_OP_GATHER && ir_attr_int(n, "axis", 0) != 0)
        return tx_error(t, n, "Gather along axis %lld is not supported in a training step",
                        (long long)ir_attr_int(n, "axis", 0));
    if (fits_int(t, n, numel(ids)) || fits_int(t, n, dim(table, 0)) || fits_int(t, n, dim(table, 1)))
        return IR_ERR;
    tx_node(t, n)->out_layout = TL_NAT;
    return IR_OK;
}

static int embedding_fwd(tctx *t, const ir_node *n)
{
    const ir_value *table = n->in[0], *ids = n->in[1];
    tx_emit(t, TP_K_EMBEDDING_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(numel(ids)), A_I(dim(table, 0)), A_I(dim(table, 1))));
    return IR_OK;
}

static int embedding_bwd(tctx *t, const ir_node *n)
{
    const ir_value *table = n->in[0], *ids = n->in[1];
    int gt = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gt < 0 || gy < 0)
        return IR_OK;
    tx_emit(t, TP_K_EMBEDDING_BWD, BUFS(gt, gy, tx_in(t, n, 1)),
            ARGS(A_I(numel(ids)), A_I(dim(table, 0)), A_I(dim(table, 1))));
    return IR_OK;
}

/* ------------------------------------------------------------------ Linear */

static int plan_linear(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0], *w = n->in[1], *y = n->out[0];
    if (w->rank != 2 || x->rank < 1)
        return tx_error(t, n, "Linear needs a 2-D weight");
    int64_t k = dim(x, -1), nn = dim(y, -1);
    bool tw = ir_attr_int(n, "trans_w", 0) != 0;
    if ((tw ? dim(w, 1) : dim(w, 0)) != k || (tw ? dim(w, 0) : dim(w, 1)) != nn)
        return tx_error(t, n, "Linear weight shape does not match its input and output");
    if (fits_int(t, n, rows_of(x)) || fits_int(t, n, k) || fits_int(t, n, nn))
        return IR_ERR;
    return plan_rowwise(t, n);
}

static int linear_fwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0], *y = n->out[0];
    int64_t R = rows_of(x), K = dim(x, -1), N = dim(y, -1);
    int64_t tw = ir_attr_int(n, "trans_w", 0) != 0;
    int out = tx_out(t, n, 0);
    tx_emit(t, TP_K_GEMM, BUFS(out, tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(0), A_I(tw), A_I(R), A_I(N), A_I(K), A_F(1), A_F(0)));
    if (n->n_in > 2 && n->in[2])
        tx_emit(t, TP_K_BIAS_ADD, BUFS(out, tx_in(t, n, 2)), ARGS(A_I(R), A_I(N)));
    return IR_OK;
}

static int linear_bwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0], *y = n->out[0];
    int64_t R = rows_of(x), K = dim(x, -1), N = dim(y, -1);
    bool tw = ir_attr_int(n, "trans_w", 0) != 0;
    int gy = tx_gout(t, n, 0), gx = tx_gin(t, n, 0), gw = tx_gin(t, n, 1), gb = tx_gin(t, n, 2);
    int xb = tx_in(t, n, 0), wb = tx_in(t, n, 1);
    if (gy < 0)
        return IR_OK;
    if (gw >= 0) {
        if (tw) /* dW[N,K] += dYᵀ X */
            tx_emit(t, TP_K_GEMM, BUFS(gw, gy, xb),
                    ARGS(A_I(1), A_I(0), A_I(N), A_I(K), A_I(R), A_F(1), A_F(1)));
        else /* dW[K,N] += Xᵀ dY */
            tx_emit(t, TP_K_GEMM, BUFS(gw, xb, gy),
                    ARGS(A_I(1), A_I(0), A_I(K), A_I(N), A_I(R), A_F(1), A_F(1)));
    }
    if (gb >= 0)
        tx_emit(t, TP_K_BIAS_BACKWARD, BUFS(gb, gy), ARGS(A_I(R), A_I(N)));
    if (gx >= 0) /* dX[R,K] += dY op(W)ᵀ */
        tx_emit(t, TP_K_GEMM, BUFS(gx, gy, wb),
                ARGS(A_I(0), A_I(tw ? 0 : 1), A_I(R), A_I(K), A_I(N), A_F(1), A_F(1)));
    return IR_OK;
}

/* ------------------------------------------------------------------ norms */

static int plan_norm(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    if (x->rank < 1 || fits_int(t, n, rows_of(x)) || fits_int(t, n, dim(x, -1)))
        return IR_ERR;
    for (int i = 1; i < n->n_in; i++)
        if (n->in[i] && numel(n->in[i]) != dim(x, -1))
            return tx_error(t, n, "norm weight %d must have %lld elements", i,
                            (long long)dim(x, -1));
    return plan_rowwise(t, n);
}

static int layernorm_fwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int64_t R = rows_of(x), D = dim(x, -1);
    int mean = tx_aux(t, n, 0, (size_t)R, false, false, "mean");
    int rstd = tx_aux(t, n, 1, (size_t)R, false, false, "rstd");
    tx_emit(t, TP_K_LAYERNORM_FWD,
            BUFS(tx_out(t, n, 0), mean, rstd, tx_in(t, n, 0), tx_in(t, n, 1), tx_in(t, n, 2)),
            ARGS(A_I(R), A_I(D), A_F(ir_attr_float(n, "epsilon", 1e-5))));
    return IR_OK;
}

static int layernorm_bwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int64_t R = rows_of(x), D = dim(x, -1);
    int gy = tx_gout(t, n, 0), gx = tx_gin(t, n, 0), gg = tx_gin(t, n, 1), gb = tx_gin(t, n, 2);
    if (gy < 0 || (gx < 0 && gg < 0 && gb < 0))
        return IR_OK;
    tx_emit(t, TP_K_LAYERNORM_BWD,
            BUFS(gx, gg, gb, gy, tx_in(t, n, 0), tx_in(t, n, 1), tx_node(t, n)->aux[0],
                 tx_node(t, n)->aux[1]),
            ARGS(A_I(R), A_I(D)));
    return IR_OK;
}

static int rms_gamma(tctx *t, const ir_node *n)
{
    return n->n_in > 1 && n->in[1] ? tx_in(t, n, 1) : tx_ones(t, dim(n->in[0], -1));
}

static int rmsnorm_fwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int64_t R = rows_of(x), D = dim(x, -1);
    int rstd = tx_aux(t, n, 0, (size_t)R, false, false, "rstd");
    tx_emit(t, TP_K_RMSNORM_FWD, BUFS(tx_out(t, n, 0), rstd, tx_in(t, n, 0), rms_gamma(t, n)),
            ARGS(A_I(R), A_I(D), A_F(ir_attr_float(n, "epsilon", 1e-5))));
    return IR_OK;
}

static int rmsnorm_bwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int64_t R = rows_of(x), D = dim(x, -1);
    int gy = tx_gout(t, n, 0), gx = tx_gin(t, n, 0), gg = tx_gin(t, n, 1);
    if (gy < 0 || (gx < 0 && gg < 0))
        return IR_OK;
    tx_emit(t, TP_K_RMSNORM_BWD,
            BUFS(gx, gg, gy, tx_in(t, n, 0), rms_gamma(t, n), tx_node(t, n)->aux[0]),
            ARGS(A_I(R), A_I(D)));
    return IR_OK;
}

/* ------------------------------------------------------------------ activations */

static bool gelu_tanh(const ir_node *n)
{
    return strcmp(ir_attr_string(n, "approximate", "none"), "tanh") == 0;
}

static int gelu_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, gelu_tanh(n) ? TP_K_GELU_TANH_FWD : TP_K_GELU_ERF_FWD,
            BUFS(tx_out(t, n, 0), tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int gelu_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx >= 0 && gy >= 0)
        tx_emit(t, gelu_tanh(n) ? TP_K_GELU_TANH_BWD : TP_K_GELU_ERF_BWD,
                BUFS(gx, gy, tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int silu_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, TP_K_SILU_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int silu_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx >= 0 && gy >= 0)
        tx_emit(t, TP_K_SILU_BWD, BUFS(gx, gy, tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

/* Relu and Tanh differentiate through their OUTPUT, as torch does: the backward then keeps the
 * activation the next op reads anyway, not the input as well. The exception is an output that
 * its own gradient overwrites (a stream head chunk's logits, when one of these makes them: the
 * fused cross-entropy writes dlogits over the logits): Relu then reads its mask from the input,
 * which is > 0 at the same elements, and Tanh recomputes its output from the input into a
 * node-owned scratch. */
static bool out_overwritten(tctx *t, const ir_node *n)
{
    return tx_root(t, n->out[0])->grad_in_place;
}

/* Relu also exists on integers (exporters' index arithmetic): at run time only float data is
 * supported, like the binary ops. */
static int plan_float_unary(tctx *t, const ir_node *n)
{
    if (!ir_dtype_is_float(n->in[0]->dtype))
        return tx_error(t, n, "%s on %s values at run time is not supported in a training step",
                        ir_op_name(n->op), ir_dtype_name(n->in[0]->dtype));
    return plan_rowwise(t, n);
}

static int relu_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, TP_K_RELU_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int relu_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int mask = out_overwritten(t, n) ? tx_in(t, n, 0) : tx_out(t, n, 0);
    tx_emit(t, TP_K_RELU_BWD, BUFS(gx, gy, mask), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int tanh_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, TP_K_TANH_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int tanh_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int y = tx_out(t, n, 0);
    if (out_overwritten(t, n)) {
        y = tx_aux(t, n, 0, tx_numel(n->out[0]), false, false, "tanh_again");
        tx_emit(t, TP_K_TANH_FWD, BUFS(y, tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    }
    tx_emit(t, TP_K_TANH_BWD, BUFS(gx, gy, y), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int plan_swiglu(tctx *t, const ir_node *n)
{
    if (!same_dims(n->in[0], n->in[1]))
        return tx_error(t, n, "SwiGLU operands must have the same shape");
    return plan_rowwise(t, n);
}

static int swiglu_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, TP_K_SWIGLU_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int swiglu_bwd(tctx *t, const ir_node *n)
{
    int gg = tx_gin(t, n, 0), gu = tx_gin(t, n, 1), gy = tx_gout(t, n, 0);
    if (gy >= 0 && (gg >= 0 || gu >= 0))
        tx_emit(t, TP_K_SWIGLU_BWD, BUFS(gg, gu, gy, tx_in(t, n, 0), tx_in(t, n, 1)),
                ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

static int sigmoid_fwd(tctx *t, const ir_node *n)
{
    tx_emit(t, TP_K_SIGMOID_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)),
            ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

/* From the output, as tanh (recomputed into a scratch when the output's gradient overwrote
 * it). */
static int sigmoid_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int y = tx_out(t, n, 0);
    if (out_overwritten(t, n)) {
        y = tx_aux(t, n, 0, tx_numel(n->out[0]), false, false, "sigmoid_again");
        tx_emit(t, TP_K_SIGMOID_FWD, BUFS(y, tx_in(t, n, 0)), ARGS(A_I(numel(n->in[0]))));
    }
    tx_emit(t, TP_K_SIGMOID_BWD, BUFS(gx, gy, y), ARGS(A_I(numel(n->in[0]))));
    return IR_OK;
}

/* ------------------------------------------------------------------ Mixture-of-Experts */

/* MoE(x [R,d], router [E,d], gate_up [E,2F,d], down [E,d,F]) attrs k, norm_topk. The forward
 * keeps each row's router probabilities, chosen experts and routing weights (R*(E + 2k), node-
 * owned, so a recomputation refills them); the experts' activations live only in the call's
 * scratch, whose size depends on R alone (sbprt_moe_scratch_floats), never on the routing: the
 * plan holds for any routing. The backward recomputes them inside its call. */
/* The experts' LoRA rank (attribute lora_rank), 0 without adapters on them. */
static int64_t moe_lora_rank(const ir_node *n)
{
    return n->n_in > 4 ? ir_attr_int(n, "lora_rank", 0) : 0;
}

static int plan_moe(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0], *wr = n->in[1], *w1 = n->in[2], *w2 = n->in[3];
    if (x->rank < 1 || wr->rank != 2 || w1->rank != 3 || w2->rank != 3)
        return tx_error(t, n, "MoE needs x [..., d], router [E, d], gate_up [E, 2F, d] and "
                              "down [E, d, F]");
    int64_t d = dim(x, -1), E = dim(wr, 0), F = dim(w2, 2), k = ir_attr_int(n, "k", 0);
    if (dim(wr, 1) != d || dim(w1, 0) != E || dim(w1, 1) != 2 * F || dim(w1, 2) != d ||
        dim(w2, 0) != E || dim(w2, 1) != d)
        return tx_error(t, n, "MoE: the router and expert tensors do not match [E, d], "
                              "[E, 2F, d], [E, d, F] with d = %lld", (long long)d);
    if (k < 1 || k > E)
        return tx_error(t, n, "MoE: top-k %lld is outside [1, %lld experts]", (long long)k,
                        (long long)E);
    if (t->p->bf16)
        return tx_error(t, n, "Mixture-of-Experts layers have no bf16 form yet: compile with "
                              "--precision fp32");
    if (t->p->seq_parallel >= 1)
        return tx_error(t, n, "Mixture-of-Experts layers are not supported with "
                              "--seq-parallel yet");
    if (t->p->moe_stats_buf >= 0 && t->p->moe_experts != E)
        return tx_error(t, n, "MoE layers with different expert counts (%lld and %lld): the "
                              "load-balancing loss pools them over one set of experts",
                        (long long)t->p->moe_experts, (long long)E);
    if (fits_int(t, n, rows_of(x)) || fits_int(t, n, d) || fits_int(t, n, E) ||
        fits_int(t, n, F) || fits_int(t, n, rows_of(x) * k))
        return IR_ERR;
    /* LoRA on the experts (passes/graph/lora.c): slots 4, 5 adapt gate_up, 6, 7 down, in
     * PEFT's layout A [E r, in], B [out, r E] */
    const int64_t r = moe_lora_rank(n);
    for (int s = 0; s < 2 && n->n_in > 4; s++) {
        const ir_value *a = n->n_in > 4 + 2 * s ? n->in[4 + 2 * s] : NULL;
        const ir_value *b = n->n_in > 5 + 2 * s ? n->in[5 + 2 * s] : NULL;
        int64_t in = s ? F : d, out = s ? d : 2 * F;
        if (!a != !b || (a && (r < 1 || a->rank != 2 || b->rank != 2 || dim(a, 0) != E * r ||
                               dim(a, 1) != in || dim(b, 0) != out || dim(b, 1) != r * E)))
            return tx_error(t, n, "MoE: the %s adapter is not the pair A [%lld, %lld], B "
                                  "[%lld, %lld] of rank %lld",
                            s ? "down" : "gate_up", (long long)(E * r), (long long)in,
                            (long long)out, (long long)(r * E), (long long)r);
    }
    if (r > 0 && fits_int(t, n, r * E))
        return IR_ERR;
    return plan_natural(t, n);
}

static void moe_args(tctx *t, const ir_node *n, tp_arg *a)
{
    (void)t;
    a[0] = A_I(rows_of(n->in[0]));
    a[1] = A_I(dim(n->in[0], -1));
    a[2] = A_I(dim(n->in[1], 0));
    a[3] = A_I(ir_attr_int(n, "k", 1));
    a[4] = A_I(dim(n->in[3], 2));
    a[5] = A_I(ir_attr_int(n, "norm_topk", 0) != 0);
}

static int moe_scratch(tctx *t, const ir_node *n)
{
    size_t numel = sbprt_moe_lora_scratch_floats(
        (int)rows_of(n->in[0]), (int)dim(n->in[0], -1), (int)dim(n->in[1], 0),
        (int)ir_attr_int(n, "k", 1), (int)dim(n->in[3], 2), (int)moe_lora_rank(n));
    return tx_node_buf(t, n, numel, false, false, "routing scratch (any routing)");
}

static int moe_fwd(tctx *t, const ir_node *n)
{
    size_t R = (size_t)rows_of(n->in[0]), E = (size_t)dim(n->in[1], 0);
    size_t K = (size_t)ir_attr_int(n, "k", 1);
    int probs = tx_aux(t, n, 0, R * E, false, false, "router probabilities");
    int sel = tx_aux(t, n, 1, R * K, true, false, "chosen experts");
    int wts = tx_aux(t, n, 2, R * K, false, false, "routing weights");
    /* the load-balancing sums count each row once: in the forward, not when recomputed */
    bool counts = !(t->cur_what && strcmp(t->cur_what, "recompute") == 0);
    int stats = counts ? t->p->moe_stats_buf : -1;
    /* recomputed for its routing alone (nothing reads y: the backward recomputes the experts'
     * activations itself), the experts do not run */
    int y = t->outs_unread ? -1 : tx_out(t, n, 0);
    tp_arg a[8];
    moe_args(t, n, a);
    if (moe_lora_rank(n) > 0) {
        a[6] = A_I(moe_lora_rank(n));
        a[7] = A_F(ir_attr_float(n, "lora_scale", 1.0));
        tx_emit(t, TP_K_MOE_LORA_FWD,
                BUFS(y, probs, sel, wts, stats, tx_in(t, n, 0), tx_in(t, n, 1),
                     tx_in(t, n, 2), tx_in(t, n, 3), tx_in(t, n, 4), tx_in(t, n, 5),
                     tx_in(t, n, 6), tx_in(t, n, 7), moe_scratch(t, n)),
                a);
        return IR_OK;
    }
    tx_emit(t, TP_K_MOE_FWD,
            BUFS(y, probs, sel, wts, stats, tx_in(t, n, 0), tx_in(t, n, 1),
                 tx_in(t, n, 2), tx_in(t, n, 3), moe_scratch(t, n)),
            a);
    return IR_OK;
}

static int moe_bwd(tctx *t, const ir_node *n)
{
    int gy = tx_gout(t, n, 0), gx = tx_gin(t, n, 0), gr = tx_gin(t, n, 1);
    int g1 = tx_gin(t, n, 2), g2 = tx_gin(t, n, 3);
    int ga1 = tx_gin(t, n, 4), gb1 = tx_gin(t, n, 5), ga2 = tx_gin(t, n, 6),
        gb2 = tx_gin(t, n, 7);
    if (gy < 0 || (gx < 0 && gr < 0 && g1 < 0 && g2 < 0 && ga1 < 0 && gb1 < 0 && ga2 < 0 &&
                   gb2 < 0))
        return IR_OK;
    const tn *r = tx_node(t, n);
    double scale = t->p->moe_aux_scale;
    tp_arg a[9];
    moe_args(t, n, a);
    a[6] = A_F(scale);
    if (moe_lora_rank(n) > 0) {
        a[7] = A_I(moe_lora_rank(n));
        a[8] = A_F(ir_attr_float(n, "lora_scale", 1.0));
        tx_emit(t, TP_K_MOE_LORA_BWD,
                BUFS(gx, gr, g1, g2, ga1, gb1, ga2, gb2, gy, tx_in(t, n, 0), tx_in(t, n, 1),
                     tx_in(t, n, 2), tx_in(t, n, 3), tx_in(t, n, 4), tx_in(t, n, 5),
                     tx_in(t, n, 6), tx_in(t, n, 7), r->aux[0], r->aux[1], r->aux[2],
                     scale != 0 ? t->p->moe_stats_buf : -1, moe_scratch(t, n)),
                a);
        return IR_OK;
    }
    tx_emit(t, TP_K_MOE_BWD,
            BUFS(gx, gr, g1, g2, gy, tx_in(t, n, 0), tx_in(t, n, 1), tx_in(t, n, 2),
                 tx_in(t, n, 3), r->aux[0], r->aux[1], r->aux[2],
                 scale != 0 ? t->p->moe_stats_buf : -1, moe_scratch(t, n)),
            a);
    return IR_OK;
}

/* ------------------------------------------------------------------ Rope */

/* Rows, heads and positions of the kernel call: x [..., T, hd] stored naturally is rows of one
 * head each at position r % T; stored swapped ([B,T,H,hd]) it is B*T rows of H heads. */
static int rope_args(tctx *t, const ir_node *n, tp_arg *a, int *pos)
{
    const ir_value *x = n->in[0], *cs = n->in[1];
    int64_t T = dim(cs, 0), rot = dim(cs, 1), hd = dim(x, -1), rows, heads;
    if (tx_layout(t, n, 0) == TL_SWAP) {
        rows = dim(x, 0) * dim(x, 2);
        heads = dim(x, 1);
    } else {
        rows = rows_of(x);
        heads = 1;
    }
    /* in a chunk body rows is the chunk's: its positions are the chunk's rows of the table of
     * every token (sliced by the loop) */
    *pos = tx_positions(t, t->chunk ? t->B * t->T : rows, T);
    a[0] = A_I(rows);
    a[1] = A_I(heads);
    a[2] = A_I(hd);
    a[3] = A_I(rot);
    a[4] = A_I(T);
    return IR_OK;
}

static int plan_rope(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0], *c = n->in[1], *s = n->in[2];
    if (x->rank < 2 || c->rank != 2 || !same_dims(c, s))
        return tx_error(t, n, "Rope needs x [..., T, hd] and cos/sin tables [T, rot]");
    if (dim(x, -2) != dim(c, 0) || dim(c, 1) > dim(x, -1) || dim(c, 1) % 2)
        return tx_error(t, n, "Rope tables [%lld,%lld] do not fit x's [T=%lld, hd=%lld]",
                        (long long)dim(c, 0), (long long)dim(c, 1), (long long)dim(x, -2),
                        (long long)dim(x, -1));
    if (!ir_value_is_const(c) || !ir_value_is_const(s))
        return tx_error(t, n, "Rope tables must be constants");
    if (fits_int(t, n, rows_of(x)))
        return IR_ERR;
    return plan_rowwise(t, n);
}

static int rope_fwd(tctx *t, const ir_node *n)
{
    tp_arg a[5];
    int pos;
    rope_args(t, n, a, &pos);
    tx_emit(t, TP_K_ROPE_FWD,
            BUFS(tx_out(t, n, 0), tx_in(t, n, 0), pos, tx_in(t, n, 1), tx_in(t, n, 2)), a);
    return IR_OK;
}

static int rope_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    tp_arg a[5];
    int pos;
    rope_args(t, n, a, &pos);
    tx_emit(t, TP_K_ROPE_BWD, BUFS(gx, gy, pos, tx_in(t, n, 1), tx_in(t, n, 2)), a);
    return IR_OK;
}

/* ------------------------------------------------------------------ Attention */

static int plan_attention(tctx *t, const ir_node *n)
{
    const ir_value *q = n->in[0], *k = n->in[1], *v = n->in[2];
    if (q->rank != 4 || k->rank != 4 || !same_dims(k, v) || dim(q, 0) != dim(k, 0) ||
        dim(q, 3) != dim(k, 3) || dim(q, 2) != dim(k, 2) || dim(k, 1) <= 0 ||
        dim(q, 1) % dim(k, 1) != 0)
        return tx_error(t, n, "Attention needs q [B,Hq,T,hd] and k, v [B,Hkv,T,hd] with Hq a "
                              "multiple of Hkv");
    if (ir_attr_int(n, "causal", 1) != 1)
        return tx_error(t, n, "only causal attention is supported");
    if (ir_attr_int(n, "window", 0) < 0 || ir_attr_int(n, "window", 0) > INT32_MAX ||
        !(ir_attr_float(n, "softcap", 0.0) >= 0) || !isfinite(ir_attr_float(n, "softcap", 0.0)))
        return tx_error(t, n, "Attention: window must be in [0, 2^31) and softcap finite and >= 0");
    tn *r = tx_node(t, n);
    for (int i = 0; i < 3; i++)
        if (t->v[n->in[i]->id].layout != TL_SWAP)
            r->relayout[i] = TL_SWAP;
    r->out_layout = TL_SWAP;
    return IR_OK;
}

/* In a chunk body (stream) the call is one query chunk of one sequence: batch 1, t = the
 * chunk's rows, q_start = t0, and k, v (and dk, dv) are the whole layer's [B, T, Hkv, hd]
 * buffers at sequence b (tp_off.per_batch); keys past the chunk's last row are never read. */
static void attention_args(tctx *t, const ir_node *n, tp_arg *a)
{
    const ir_value *q = n->in[0], *k = n->in[1];
    a[0] = A_I(dim(q, 0));
    a[1] = A_I(dim(q, 2));
    a[2] = A_I(t->chunk ? t->T : dim(k, 2));
    a[3] = A_I(dim(q, 1));
    a[4] = A_I(dim(k, 1));
    a[5] = A_I(dim(q, 3));
    a[6] = t->chunk ? A_T0(0) : A_I(0);
    a[7] = A_F(ir_attr_float(n, "scale", 1.0));
    /* variants (0: off): a sliding window of w keys, and Gemma-2's c*tanh(s/c) on the scores */
    a[8] = A_I(ir_attr_int(n, "window", 0));
    a[9] = A_F(ir_attr_float(n, "softcap", 0.0));
}

/* Chunk body: operands ops[0..n) are whole-layer K/V buffers, at sequence b. */
static void kv_at_batch(tctx *t, const ir_node *n, tp_inst *in, const int *ops, int nops)
{
    if (!t->chunk || !in)
        return;
    const ir_value *k = n->in[1];
    for (int i = 0; i < nops; i++)
        in->off[ops[i]].per_batch = t->T * dim(k, 1) * dim(k, 3);
}

/* Packed: the document starts [B, T] (indexed by absolute position, like k) at sequence b in
 * a chunk body. */
static void doc_start_at_batch(tctx *t, tp_inst *in, int op)
{
    if (t->chunk && in)
        in->off[op].per_batch = t->T;
}

/* ---- sequence parallelism (train.h, "Sequence parallelism"; runtime/sbprt.h) */

enum { SP_AUX_KH = 3, SP_AUX_VH, SP_AUX_DKH, SP_AUX_DVH, SP_AUX_KV_X, SP_AUX_S1 };

static bool sp_on(const tctx *t) { return t->p->seq_parallel >= 1; }

/* Rank-heads K/V over the whole sequence ([B, N*T/N, hkv_r, hd]) and their gradients: made
 * outside any chunk body (they span every token), read at sequence b inside one. */
static int sp_kv_buf(tctx *t, const ir_node *n, int idx, bool grad, const char *what)
{
    const ir_value *q = n->in[0], *k = n->in[1];
    const char *why;
    int64_t hr = sp_kv_heads(dim(q, 1), dim(k, 1), t->p->seq_parallel, &why);
    int b = tx_aux(t, n, idx, (size_t)(t->B * t->p->seq_len_global * hr * dim(k, 3)), false,
                   grad, what);
    if (b >= 0) {
        t->p->bufs[b]->chunk_local = false;
        t->p->bufs[b]->rows = 0; /* not one row per local token: never sliced */
    }
    return b;
}

/* The all-to-all's scratch of the K/V exchange: [N, T/N, hkv_r, hd] (one batch row). */
static int sp_kv_scratch(tctx *t, const ir_node *n)
{
    const ir_value *q = n->in[0], *k = n->in[1];
    const char *why;
    int64_t hr = sp_kv_heads(dim(q, 1), dim(k, 1), t->p->seq_parallel, &why);
    int b = tx_aux(t, n, SP_AUX_KV_X, (size_t)(t->p->seq_len_global * hr * dim(k, 3)), false,
                   false, "kv_exchange");
    if (b >= 0)
        t->p->bufs[b]->chunk_local = false;
    return b;
}

/* b, tl, hq, hkv, d, N of the K/V exchange */
static void sp_kv_args(tctx *t, const ir_node *n, tp_arg *a)
{
    const ir_value *q = n->in[0], *k = n->in[1];
    a[0] = A_I(t->B);
    a[1] = A_I(t->T);
    a[2] = A_I(dim(q, 1));
    a[3] = A_I(dim(k, 1));
    a[4] = A_I(dim(k, 3));
    a[5] = A_I(t->p->seq_parallel);
}

int sp_kv_gather(tctx *t, const ir_node *n)
{
    int kh = sp_kv_buf(t, n, SP_AUX_KH, false, "k_heads");
    int vh = sp_kv_buf(t, n, SP_AUX_VH, false, "v_heads");
    int x = sp_kv_scratch(t, n);
    if (kh < 0 || vh < 0 || x < 0)
        return IR_ERR;
    tp_arg a[6];
    sp_kv_args(t, n, a);
    t->cur_node = n;
    t->cur_what = t->cur_what && strcmp(t->cur_what, "recompute") == 0 ? "recompute" : "forward";
    tx_emit(t, TP_K_SP_KV_GATHER, BUFS(kh, tx_in(t, n, 1), x), a);
    tx_emit(t, TP_K_SP_KV_GATHER, BUFS(vh, tx_in(t, n, 2), x), a);
    return IR_OK;
}

int sp_kv_scatter(tctx *t, const ir_node *n)
{
    int gk = tx_gin(t, n, 1), gv = tx_gin(t, n, 2);
    if (tx_gout(t, n, 0) < 0 || (gk < 0 && gv < 0))
        return IR_OK;
    int dkh = sp_kv_buf(t, n, SP_AUX_DKH, true, "dk_heads");
    int dvh = sp_kv_buf(t, n, SP_AUX_DVH, true, "dv_heads");
    int x = sp_kv_scratch(t, n);
    if (dkh < 0 || dvh < 0 || x < 0)
        return IR_ERR;
    tp_arg a[6];
    sp_kv_args(t, n, a);
    t->cur_node = n;
    t->cur_what = "gradient";
    if (gk >= 0)
        tx_emit(t, TP_K_SP_KV_SCATTER, BUFS(gk, dkh, x), a);
    if (gv >= 0)
        tx_emit(t, TP_K_SP_KV_SCATTER, BUFS(gv, dvh, x), a);
    return IR_OK;
}

/* b, t, tl, hq, hkv, d, q_start, scale, window, softcap, N of the exchanging attention: in a
 * chunk body one query chunk of one sequence, as attention_args */
static void sp_attention_args(tctx *t, const ir_node *n, tp_arg *a)
{
    const ir_value *q = n->in[0], *k = n->in[1];
    a[0] = A_I(dim(q, 0));
    a[1] = A_I(dim(q, 2));
    a[2] = A_I(t->T);
    a[3] = A_I(dim(q, 1));
    a[4] = A_I(dim(k, 1));
    a[5] = A_I(dim(q, 3));
    a[6] = t->chunk ? A_T0(0) : A_I(0);
    a[7] = A_F(ir_attr_float(n, "scale", 1.0));
    a[8] = A_I(ir_attr_int(n, "window", 0));
    a[9] = A_F(ir_attr_float(n, "softcap", 0.0));
    a[10] = A_I(t->p->seq_parallel);
}

/* Chunk body: the rank-heads K/V (and their gradients) and the whole rows' document starts
 * at sequence b. */
static void sp_at_batch(tctx *t, const ir_node *n, tp_inst *in, const int *ops, int nops,
                        int doc_op)
{
    if (!t->chunk || !in)
        return;
    const ir_value *q = n->in[0], *k = n->in[1];
    const char *why;
    int64_t hr = sp_kv_heads(dim(q, 1), dim(k, 1), t->p->seq_parallel, &why);
    for (int i = 0; i < nops; i++)
        in->off[ops[i]].per_batch = t->p->seq_len_global * hr * dim(k, 3);
    if (t->p->packed)
        in->off[doc_op].per_batch = t->p->seq_len_global;
}

static int sp_attention_fwd(tctx *t, const ir_node *n)
{
    const ir_value *q = n->in[0];
    if (!t->chunk && sp_kv_gather(t, n) != IR_OK)
        return IR_ERR;
    t->cur_node = n;
    t->cur_what = "forward";
    int lse = tx_aux(t, n, 0, (size_t)(dim(q, 0) * dim(q, 1) * dim(q, 2)), false, false, "lse");
    int s1 = tx_aux(t, n, SP_AUX_S1, tx_numel(q), false, false, "sp_exchange_1");
    int s2 = tx_aux(t, n, SP_AUX_S1 + 1, tx_numel(q), false, false, "sp_exchange_2");
    tp_arg a[11];
    sp_attention_args(t, n, a);
    tp_inst *in = tx_emit(t, TP_K_SP_ATTENTION_FWD,
                          BUFS(tx_out(t, n, 0), lse, tx_in(t, n, 0), tx_node(t, n)->aux[SP_AUX_KH],
                               tx_node(t, n)->aux[SP_AUX_VH],
                               t->p->packed ? t->p->doc_start_buf : -1, s1, s2),
                          a);
    sp_at_batch(t, n, in, (const int[]){3, 4}, 2, 5);
    return IR_OK;
}

static int sp_attention_bwd(tctx *t, const ir_node *n)
{
    const ir_value *q = n->in[0];
    int gy = tx_gout(t, n, 0), gq = tx_gin(t, n, 0), gk = tx_gin(t, n, 1), gv = tx_gin(t, n, 2);
    if (gy < 0 || (gq < 0 && gk < 0 && gv < 0))
        return IR_OK;
    /* the kernel computes dk and dv of the rank's heads always (they are exchanged back only
     * where wanted: sp_kv_scatter) */
    int dkh = sp_kv_buf(t, n, SP_AUX_DKH, true, "dk_heads");
    int dvh = sp_kv_buf(t, n, SP_AUX_DVH, true, "dv_heads");
    int s[4];
    for (int i = 0; i < 4; i++)
        s[i] = tx_aux(t, n, SP_AUX_S1 + i, tx_numel(q), false, false,
                      ir_arena_printf(t->g->arena, "sp_exchange_%d", i + 1));
    if (gq < 0) /* every rank's dq comes back through the exchange: a scratch for it */
        gq = tx_aux(t, n, TN_MAX_AUX - 1, tx_numel(q), false, true, "unused_dq");
    tp_arg a[11];
    sp_attention_args(t, n, a);
    tn *r = tx_node(t, n);
    tp_inst *in = tx_emit(t, TP_K_SP_ATTENTION_BWD,
                          BUFS(gq, dkh, dvh, gy, tx_in(t, n, 0), r->aux[SP_AUX_KH],
                               r->aux[SP_AUX_VH], tx_out(t, n, 0), r->aux[0],
                               t->p->packed ? t->p->doc_start_buf : -1, s[0], s[1], s[2], s[3]),
                          a);
    sp_at_batch(t, n, in, (const int[]){1, 2, 5, 6}, 4, 9);
    if (!t->chunk)
        return sp_kv_scatter(t, n);
    return IR_OK;
}

static int attention_fwd(tctx *t, const ir_node *n)
{
    if (sp_on(t))
        return sp_attention_fwd(t, n);
    const ir_value *q = n->in[0];
    int lse = tx_aux(t, n, 0, (size_t)(dim(q, 0) * dim(q, 1) * dim(q, 2)), false, false, "lse");
    tp_arg a[10];
    attention_args(t, n, a);
    const bool packed = t->p->packed; /* block-diagonal: the document starts, last */
    tp_inst *in = tx_emit(t, packed ? TP_K_ATTENTION_PACKED_FWD : TP_K_ATTENTION_FWD,
                          BUFS(tx_out(t, n, 0), lse, tx_in(t, n, 0), tx_in(t, n, 1),
                               tx_in(t, n, 2), packed ? t->p->doc_start_buf : -1),
                          a);
    kv_at_batch(t, n, in, (const int[]){3, 4}, 2);
    if (packed)
        doc_start_at_batch(t, in, 5);
    return IR_OK;
}

/* A whole-layer scratch for the dk or dv nobody wants (in a chunk body it still spans every
 * token: the kernel indexes it like k). */
static int unused_kv_grad(tctx *t, const ir_node *n, int slot, int idx, const char *what)
{
    size_t numel = tx_numel(n->in[slot]);
    if (t->chunk)
        numel = (size_t)(t->B * t->T * dim(n->in[slot], 1) * dim(n->in[slot], 3));
    int b = tx_aux(t, n, idx, numel, false, true, what);
    if (b >= 0 && t->chunk) {
        tp_buf *buf = t->p->bufs[b];
        buf->chunk_local = false;
        buf->rows = t->B * t->T;
        buf->row_elems = dim(n->in[slot], 1) * dim(n->in[slot], 3);
    }
    return b;
}

static int attention_bwd(tctx *t, const ir_node *n)
{
    if (sp_on(t))
        return sp_attention_bwd(t, n);
    int gy = tx_gout(t, n, 0), gq = tx_gin(t, n, 0), gk = tx_gin(t, n, 1), gv = tx_gin(t, n, 2);
    if (gy < 0 || (gq < 0 && gk < 0 && gv < 0))
        return IR_OK;
    /* the kernel computes dk and dv together: a scratch for the one nobody wants */
    if (gk < 0 && gv >= 0)
        gk = unused_kv_grad(t, n, 1, 1, "unused_dk");
    if (gv < 0 && gk >= 0)
        gv = unused_kv_grad(t, n, 2, 2, "unused_dv");
    tp_arg a[10];
    attention_args(t, n, a);
    const bool packed = t->p->packed;
    tp_inst *in = tx_emit(t, packed ? TP_K_ATTENTION_PACKED_BWD : TP_K_ATTENTION_BWD,
                          BUFS(gq, gk, gv, gy, tx_in(t, n, 0), tx_in(t, n, 1), tx_in(t, n, 2),
                               tx_out(t, n, 0), tx_node(t, n)->aux[0],
                               packed ? t->p->doc_start_buf : -1),
                          a);
    if (packed)
        doc_start_at_batch(t, in, 9);
    if (gk >= 0)
        kv_at_batch(t, n, in, (const int[]){1, 2, 5, 6}, 4);
    else
        kv_at_batch(t, n, in, (const int[]){5, 6}, 2);
    return IR_OK;
}

/* ------------------------------------------------------------------ elementwise binary */

static int binop_code(ir_op op)
{
    switch (op) {
    case IR_OP_ADD: return 0;
    case IR_OP_SUB: return 1;
    case IR_OP_MUL: return 2;
    default: return 3;
    }
}
static const char *const binop_names[] = {"SBPRT_BIN_ADD", "SBPRT_BIN_SUB", "SBPRT_BIN_MUL",
                                          "SBPRT_BIN_DIV"};

/* Scaling by a constant: x * c, c * x or x / c, where c is a float constant of one element
 * (any rank: [], [1], [1,1,1]) and x a non-constant value of the output's shape (Gemma's
 * embedding normaliser, Gemma-2's final-logit soft-cap, Granite's multipliers). These lower to
 * sbprt_scale / sbprt_div_scalar with c as a float argument rather than to the broadcast
 * kernels, whose bf16 forms want every operand bf16 while constants stay fp32. The
 * arithmetic is the broadcast kernels' for a one-element operand (a product or a true
 * quotient, then the gradient's sum, each rounded to fp32), so fp32 steps are bitwise what
 * they were; the gradient reads neither x nor c, and c, not being an operand, never becomes a
 * buffer. Returns the slot of x, with c and whether to divide; -1 for any other binary op. */
static int scale_form(const ir_node *n, float *c, bool *divide)
{
    if (n->op != IR_OP_MUL && n->op != IR_OP_DIV)
        return -1;
    for (int xs = 0; xs < (n->op == IR_OP_DIV ? 1 : 2); xs++) {
        const ir_value *x = n->in[xs], *k = n->in[1 - xs];
        if (!ir_value_is_const(k) || !ir_dtype_is_float(k->dtype) || tx_numel(k) != 1 ||
            ir_value_is_const(x) || !same_dims(x, n->out[0]))
            continue;
        *c = (float)ir_const_f64(k, 0); /* as const_buf would store it */
        *divide = n->op == IR_OP_DIV;
        return xs;
    }
    return -1;
}

/* The slot of an operand that a binary op may read in either layout, or -1: one of the output's
 * dims, the other (rank-4 output) of extent 1 along axes 1 and 2 (Gemma's per-head norm scale
 * 1 + w, [head_dim], times q or k [B, H, T, head_dim] stored [B, T, H, head_dim]). The swap
 * permutes only the middle block of the flat index, along which the other operand does not
 * vary, so the broadcast kernels, given the logical dims, pair the same elements either way;
 * the output then keeps that operand's layout instead of a copy in natural order, which stream
 * could not slice by token rows for RoPE and attention. */
static int layout_free_operand(const ir_node *n)
{
    const ir_value *y = n->out[0];
    if (y->rank != 4)
        return -1;
    for (int xs = 0; xs < 2; xs++) {
        const ir_value *o = n->in[1 - xs];
        int sh = y->rank - o->rank;
        bool flat = true;
        for (int i = 1; i <= 2; i++)
            if (i >= sh && o->dims[i - sh].value != 1)
                flat = false;
        if (same_dims(n->in[xs], y) && flat)
            return xs;
    }
    return -1;
}

static int plan_binary(tctx *t, const ir_node *n)
{
    const ir_value *a = n->in[0], *b = n->in[1], *y = n->out[0];
    if (!ir_dtype_is_float(y->dtype) || !ir_dtype_is_float(a->dtype) ||
        !ir_dtype_is_float(b->dtype))
        return tx_error(t, n, "%s on %s values at run time is not supported in a training step",
                        ir_op_name(n->op), ir_dtype_name(y->dtype));
    if (y->rank > 8 || a->rank > y->rank || b->rank > y->rank)
        return tx_error(t, n, "unsupported broadcast");
    float c;
    bool divide;
    int xs = scale_form(n, &c, &divide);
    if (xs >= 0) { /* flat over x as stored: any layout; the constant is never read */
        tx_node(t, n)->out_layout = t->v[n->in[xs]->id].layout;
        return IR_OK;
    }
    if (same_dims(a, y) && same_dims(b, y))
        return plan_rowwise(t, n);
    if ((xs = layout_free_operand(n)) >= 0) {
        tn *r = tx_node(t, n);
        if (t->v[n->in[1 - xs]->id].layout != TL_NAT)
            r->relayout[1 - xs] = TL_NAT;
        r->out_layout = t->v[n->in[xs]->id].layout;
        return IR_OK;
    }
    return plan_natural(t, n);
}

/* Operand dims right-aligned to the output's rank (numpy broadcasting). */
static void aligned_dims(const ir_value *v, int rank, int64_t *d)
{
    for (int i = 0; i < rank; i++) {
        int j = i - (rank - v->rank);
        d[i] = j >= 0 ? v->dims[j].value : 1;
    }
}

static void binary_args(tctx *t, const ir_node *n, tp_arg *a)
{
    const ir_value *y = n->out[0];
    int64_t dy[IR_MAX_RANK], da[IR_MAX_RANK], db[IR_MAX_RANK];
    int r = y->rank;
    aligned_dims(y, r, dy);
    aligned_dims(n->in[0], r, da);
    aligned_dims(n->in[1], r, db);
    a[0] = A_E(binop_names[binop_code(n->op)]);
    a[1] = A_I(r);
    a[2] = A_IS(t, dy, r);
    a[3] = A_IS(t, da, r);
    a[4] = A_IS(t, db, r);
}

static bool plain_add(const ir_node *n)
{
    return n->op == IR_OP_ADD && same_dims(n->in[0], n->out[0]) &&
           same_dims(n->in[1], n->out[0]);
}

static int binary_fwd(tctx *t, const ir_node *n)
{
    float c;
    bool divide;
    int xs = scale_form(n, &c, &divide);
    if (xs >= 0) {
        tx_emit(t, divide ? TP_K_DIV_SCALAR : TP_K_SCALE, BUFS(tx_out(t, n, 0), tx_in(t, n, xs)),
                ARGS(A_I(numel(n->out[0])), A_F(c)));
        return IR_OK;
    }
    int y = tx_out(t, n, 0), a = tx_in(t, n, 0), b = tx_in(t, n, 1);
    if (plain_add(n)) {
        tx_emit(t, TP_K_ADD, BUFS(y, a, b), ARGS(A_I(numel(n->out[0]))));
        return IR_OK;
    }
    tp_arg args[5];
    binary_args(t, n, args);
    tx_emit(t, TP_K_BROADCAST_FWD, BUFS(y, a, b), args);
    return IR_OK;
}

static int binary_bwd(tctx *t, const ir_node *n)
{
    int gy = tx_gout(t, n, 0), ga = tx_gin(t, n, 0), gb = tx_gin(t, n, 1);
    if (gy < 0 || (ga < 0 && gb < 0))
        return IR_OK;
    float c;
    bool divide;
    int xs = scale_form(n, &c, &divide);
    if (xs >= 0) { /* dx += c * dy or dy / c; a constant has no gradient */
        int gx = xs ? gb : ga;
        if (gx >= 0)
            tx_emit(t, divide ? TP_K_DIV_SCALAR_ACCUMULATE : TP_K_SCALE_ACCUMULATE, BUFS(gx, gy),
                    ARGS(A_I(numel(n->out[0])), A_F(c)));
        return IR_OK;
    }
    if (plain_add(n)) {
        int64_t c = numel(n->out[0]);
        if (ga >= 0)
            tx_emit(t, TP_K_ACCUMULATE, BUFS(ga, gy), ARGS(A_I(c)));
        if (gb >= 0)
            tx_emit(t, TP_K_ACCUMULATE, BUFS(gb, gy), ARGS(A_I(c)));
        return IR_OK;
    }
    tp_arg args[5];
    binary_args(t, n, args);
    tx_emit(t, TP_K_BROADCAST_BWD, BUFS(ga, gb, gy, tx_in(t, n, 0), tx_in(t, n, 1)), args);
    return IR_OK;
}

/* ------------------------------------------------------------------ Expand */

static int plan_expand(tctx *t, const ir_node *n)
{
    if (!ir_dtype_is_float(n->out[0]->dtype))
        return tx_error(t, n, "Expand of %s values at run time is not supported",
                        ir_dtype_name(n->out[0]->dtype));
    return plan_natural(t, n);
}

static void expand_args(tctx *t, const ir_node *n, tp_arg *a)
{
    const ir_value *y = n->out[0];
    int r = y->rank;
    int64_t dy[IR_MAX_RANK], dx[IR_MAX_RANK], d1[IR_MAX_RANK];
    aligned_dims(y, r, dy);
    aligned_dims(n->in[0], r, dx);
    for (int i = 0; i < r; i++)
        d1[i] = 1;
    a[0] = A_E(binop_names[0]);
    a[1] = A_I(r);
    a[2] = A_IS(t, dy, r);
    a[3] = A_IS(t, dx, r);
    a[4] = A_IS(t, d1, r);
}

static int expand_fwd(tctx *t, const ir_node *n)
{
    tp_arg a[5];
    expand_args(t, n, a);
    tx_emit(t, TP_K_BROADCAST_FWD, BUFS(tx_out(t, n, 0), tx_in(t, n, 0), tx_zero(t)), a);
    return IR_OK;
}

static int expand_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    tp_arg a[5];
    expand_args(t, n, a);
    tx_emit(t, TP_K_BROADCAST_BWD, BUFS(gx, -1, gy, tx_in(t, n, 0), tx_zero(t)), a);
    return IR_OK;
}

/* ------------------------------------------------------------------ Split / Slice / Concat */

/* A tensor seen as [outer, extent of axis, inner]. */
static void axis_split(const ir_value *v, int axis, int64_t *outer, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= v->dims[i].value;
    for (int i = axis + 1; i < v->rank; i++)
        *inner *= v->dims[i].value;
}

static int norm_axis(const ir_node *n, const ir_value *v)
{
    int64_t a = ir_attr_int(n, "axis", 0);
    return (int)(a < 0 ? a + v->rank : a);
}

static int plan_axis_op(tctx *t, const ir_node *n, int axis, const ir_value *ref)
{
    if (axis < 0 || axis >= ref->rank)
        return tx_error(t, n, "axis out of range");
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] && !ir_dtype_is_float(n->in[i]->dtype) && (n->op == IR_OP_CONCAT || i == 0))
            return tx_error(t, n, "%s of %s values at run time is not supported",
                            ir_op_name(n->op), ir_dtype_name(n->in[i]->dtype));
    /* no size check here: the copy_cols extents (rows, columns, leading dimensions, offsets)
     * are checked against the runtime's C int by the verifier (train_verify.c), which names the
     * kernel and the value */
    return axis == ref->rank - 1 ? plan_rowwise(t, n) : plan_natural(t, n);
}

static int plan_split(tctx *t, const ir_node *n)
{
    return plan_axis_op(t, n, norm_axis(n, n->in[0]), n->in[0]);
}

static int split_fwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int axis = norm_axis(n, x);
    int64_t outer, inner, off = 0;
    axis_split(x, axis, &outer, &inner);
    int64_t ld = x->dims[axis].value * inner;
    for (int i = 0; i < n->n_out; i++) {
        if (!n->out[i])
            continue;
        int64_t w = n->out[i]->dims[axis].value * inner;
        tx_emit(t, TP_K_COPY_COLS, BUFS(tx_out(t, n, i), tx_in(t, n, 0)),
                ARGS(A_I(outer), A_I(w), A_I(w), A_I(0), A_I(ld), A_I(off), A_I(0)));
        off += w;
    }
    return IR_OK;
}

static int split_bwd(tctx *t, const ir_node *n)
{
    const ir_value *x = n->in[0];
    int gx = tx_gin(t, n, 0);
    if (gx < 0)
        return IR_OK;
    int axis = norm_axis(n, x);
    int64_t outer, inner, off = 0;
    axis_split(x, axis, &outer, &inner);
    int64_t ld = x->dims[axis].value * inner;
    for (int i = 0; i < n->n_out; i++) {
        if (!n->out[i])
            continue;
        int64_t w = n->out[i]->dims[axis].value * inner;
        int gy = tx_gout(t, n, i);
        if (gy >= 0)
            tx_emit(t, TP_K_COPY_COLS, BUFS(gx, gy),
                    ARGS(A_I(outer), A_I(w), A_I(ld), A_I(off), A_I(w), A_I(0), A_I(1)));
        off += w;
    }
    return IR_OK;
}

/* The one sliced axis of a Slice with step 1 and its start; -1 when unsupported. */
static int slice_axis(const ir_node *n, int64_t *start)
{
    const ir_value *x = n->in[0], *y = n->out[0];
    if (x->rank != y->rank)
        return -1;
    int axis = -1;
    for (int i = 0; i < x->rank; i++)
        if (x->dims[i].value != y->dims[i].value) {
            if (axis >= 0)
                return -1;
            axis = i;
        }
    if (axis < 0)
        axis = x->rank - 1; /* a full slice: any axis, start 0 */
    *start = 0;
    const ir_value *starts = n->in[1], *axes = n->n_in > 3 ? n->in[3] : NULL;
    const ir_value *steps = n->n_in > 4 ? n->in[4] : NULL;
    if (!ir_value_is_const(starts) || (axes && !ir_value_is_const(axes)) ||
        (steps && !ir_value_is_const(steps)))
        return -1;
    for (int64_t j = 0; j < (int64_t)tx_numel(starts); j++) {
        int64_t a = axes ? ir_const_i64(axes, j) : j;
        if (a < 0)
            a += x->rank;
        if (steps && ir_const_i64(steps, j) != 1)
            return -1;
        if (a != axis)
            continue;
        int64_t s = ir_const_i64(starts, j), d = x->dims[axis].value;
        if (s < 0)
            s += d;
        *start = s < 0 ? 0 : s > d ? d : s;
    }
    return axis;
}

static int plan_slice(tctx *t, const ir_node *n)
{
    int64_t start;
    int axis = slice_axis(n, &start);
    if (axis < 0)
        return tx_error(t, n, "only a Slice of one axis with step 1 and constant bounds is "
                              "supported");
    return plan_axis_op(t, n, axis, n->in[0]);
}

static int slice_fwd(tctx *t, const ir_node *n)
{
    int64_t start, outer, inner;
    int axis = slice_axis(n, &start);
    axis_split(n->in[0], axis, &outer, &inner);
    int64_t ld = n->in[0]->dims[axis].value * inner, w = n->out[0]->dims[axis].value * inner;
    tx_emit(t, TP_K_COPY_COLS, BUFS(tx_out(t, n, 0), tx_in(t, n, 0)),
            ARGS(A_I(outer), A_I(w), A_I(w), A_I(0), A_I(ld), A_I(start * inner), A_I(0)));
    return IR_OK;
}

static int slice_bwd(tctx *t, const ir_node *n)
{
    int gx = tx_gin(t, n, 0), gy = tx_gout(t, n, 0);
    if (gx < 0 || gy < 0)
        return IR_OK;
    int64_t start, outer, inner;
    int axis = slice_axis(n, &start);
    axis_split(n->in[0], axis, &outer, &inner);
    int64_t ld = n->in[0]->dims[axis].value * inner, w = n->out[0]->dims[axis].value * inner;
    tx_emit(t, TP_K_COPY_COLS, BUFS(gx, gy),
            ARGS(A_I(outer), A_I(w), A_I(ld), A_I(start * inner), A_I(w), A_I(0), A_I(1)));
    return IR_OK;
}

static int plan_concat(tctx *t, const ir_node *n)
{
    return plan_axis_op(t, n, norm_axis(n, n->out[0]), n->out[0]);
}

static int concat_fwd(tctx *t, const ir_node *n)
{
    const ir_value *y = n->out[0];
    int axis = norm_axis(n, y);
    int64_t outer, inner, off = 0;
    axis_split(y, axis, &outer, &inner);
    int64_t ld = y->dims[axis].value * inner;
    for (int i = 0; i < n->n_in; i++) {
        int64_t w = n->in[i]->dims[axis].value * inner;
        tx_emit(t, TP_K_COPY_COLS, BUFS(tx_out(t, n, 0), tx_in(t, n, i)),
                ARGS(A_I(outer), A_I(w), A_I(ld), A_I(off), A_I(w), A_I(0), A_I(0)));
        off += w;
    }
    return IR_OK;
}

static int concat_bwd(tctx *t, const ir_node *n)
{
    const ir_value *y = n->out[0];
    int gy = tx_gout(t, n, 0);
    if (gy < 0)
        return IR_OK;
    int axis = norm_axis(n, y);
    int64_t outer, inner, off = 0;
    axis_split(y, axis, &outer, &inner);
    int64_t ld = y->dims[axis].value * inner;
    for (int i = 0; i < n->n_in; i++) {
        int64_t w = n->in[i]->dims[axis].value * inner;
        int gx = tx_gin(t, n, i);
        if (gx >= 0)
            tx_emit(t, TP_K_COPY_COLS, BUFS(gx, gy),
                    ARGS(A_I(outer), A_I(w), A_I(w), A_I(0), A_I(ld), A_I(off), A_I(1)));
        off += w;
    }
    return IR_OK;
}

/* ------------------------------------------------------------------ the loss */

static int plan_loss(tctx *t, const ir_node *n)
{
    const ir_value *logits = n->in[0], *labels = n->in[1];
    if (n->op == IR_OP_SOFTMAX_CE_LOSS && n->n_in > 2 && n->in[2])
        return tx_error(t, n, "class weights are not supported");
    if (n->n_out > 1 && n->out[1] && ir_value_use_count(t->g, n->out[1]) > 0)
        return tx_error(t, n, "the log-probability output of the loss is not supported");
    const ir_attr *ig = ir_attr_get(n, "ignore_index");
    if (ig && ig->i != -100)
        return tx_error(t, n, "ignore_index %lld is not supported (only -100)",
                        (long long)ig->i);
    const char *red = ir_attr_string(n, "reduction", "mean");
    if (strcmp(red, "mean") != 0 && strcmp(red, "sum") != 0)
        return tx_error(t, n, "reduction '%s' does not give a scalar loss", red);
    if (!ir_dtype_is_int(labels->dtype) || logits->rank < 1 ||
        numel(logits) != numel(labels) * dim(logits, -1))
        return tx_error(t, n, "the loss needs logits [N..,V] and integer labels [N..]");
    if (fits_int(t, n, numel(labels)) || fits_int(t, n, dim(logits, -1)))
        return IR_ERR;
    return plan_natural(t, n);
}

static int loss_fwd(tctx *t, const ir_node *n)
{
    if (pref_objective(t->p)) /* DPO, GRPO: objective_pref.c */
        return pref_loss_fwd(t, n);
    int loss = tx_out(t, n, 0);
    tx_emit(t, TP_K_MEMSET_ZERO, BUFS(loss), ARGS(A_I(4)));
    tx_emit(t, TP_K_CROSS_ENTROPY, BUFS(loss, -1, tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(numel(n->in[1])), A_I(dim(n->in[0], -1)), A_E("scale")));
    return IR_OK;
}

/* The fused kernel WRITES dlogits. That is an accumulation into the zeroed gradient as long
 * as no other reader of the logits runs its gradient rule before this one, i.e. the loss is
 * their last reader; otherwise it writes a scratch that is then added. */
static int loss_bwd(tctx *t, const ir_node *n)
{
    if (pref_objective(t->p))
        return pref_loss_bwd(t, n);
    int gl = tx_gin(t, n, 0);
    int64_t N = numel(n->in[1]), V = dim(n->in[0], -1);
    /* fused (a stream head chunk): this call is the loss's forward too; it adds the chunk's
     * token losses to the loss sum */
    bool fused = t->chunk && t->chunk->fused_loss;
    if (fused && gl < 0) { /* the loss alone (everything frozen, or evaluation) */
        const char *what = t->cur_what;
        t->cur_what = "forward";
        tx_emit(t, TP_K_CROSS_ENTROPY, BUFS(tx_out(t, n, 0), -1, tx_in(t, n, 0), tx_in(t, n, 1)),
                ARGS(A_I(N), A_I(V), A_E("scale")));
        t->cur_what = what;
        return IR_OK;
    }
    if (gl < 0)
        return IR_OK;
    int again = fused ? tx_out(t, n, 0) : tx_aux(t, n, 0, 1, false, false, "loss_again");
    bool last_reader = tx_node(t, n)->relayout[0] >= 0 ||
                       tx_root(t, n->in[0])->last_use == tx_index(t, n);
    int dst = last_reader ? gl : tx_aux(t, n, 1, (size_t)(N * V), false, true, "dlogits");
    tx_emit(t, TP_K_CROSS_ENTROPY, BUFS(again, dst, tx_in(t, n, 0), tx_in(t, n, 1)),
            ARGS(A_I(N), A_I(V), A_E("scale")));
    if (!last_reader)
        tx_emit(t, TP_K_ACCUMULATE, BUFS(gl, dst), ARGS(A_I(N * V)));
    return IR_OK;
}

/* ------------------------------------------------------------------ the table */

#define D0 1u
#define D01 3u
#define D012 7u
#define DALL 0xffffffffu

static const grad_rule rules[] = {
    /* op                  diff  plan             forward        gradient */
    {IR_OP_EMBEDDING,      D0,   plan_embedding,  embedding_fwd, embedding_bwd},
    {IR_OP_GATHER,         D0,   plan_embedding,  embedding_fwd, embedding_bwd},
    {IR_OP_LINEAR,         D012, plan_linear,     linear_fwd,    linear_bwd},
    {IR_OP_LAYER_NORM,     D012, plan_norm,       layernorm_fwd, layernorm_bwd},
    {IR_OP_RMS_NORM,       D01,  plan_norm,       rmsnorm_fwd,   rmsnorm_bwd},
    {IR_OP_GELU,           D0,   plan_rowwise,    gelu_fwd,      gelu_bwd},
    {IR_OP_SILU,           D0,   plan_rowwise,    silu_fwd,      silu_bwd},
    {IR_OP_RELU,           D0,   plan_float_unary, relu_fwd,     relu_bwd},
    {IR_OP_TANH,           D0,   plan_float_unary, tanh_fwd,     tanh_bwd},
    {IR_OP_SIGMOID,        D0,   plan_float_unary, sigmoid_fwd,  sigmoid_bwd},
    {IR_OP_MOE,            0xffu, plan_moe,        moe_fwd,       moe_bwd},
    {IR_OP_SWIGLU,         D01,  plan_swiglu,     swiglu_fwd,    swiglu_bwd},
    {IR_OP_ROPE,           D0,   plan_rope,       rope_fwd,      rope_bwd},
    {IR_OP_ATTENTION,      D012, plan_attention,  attention_fwd, attention_bwd},
    {IR_OP_CROSS_ENTROPY,  D0,   plan_loss,       loss_fwd,      loss_bwd},
    {IR_OP_SOFTMAX_CE_LOSS, D0,  plan_loss,       loss_fwd,      loss_bwd},
    {IR_OP_ADD,            D01,  plan_binary,     binary_fwd,    binary_bwd},
    {IR_OP_SUB,            D01,  plan_binary,     binary_fwd,    binary_bwd},
    {IR_OP_MUL,            D01,  plan_binary,     binary_fwd,    binary_bwd},
    {IR_OP_DIV,            D01,  plan_binary,     binary_fwd,    binary_bwd},
    {IR_OP_EXPAND,         D0,   plan_expand,     expand_fwd,    expand_bwd},
    {IR_OP_SPLIT,          D0,   plan_split,      split_fwd,     split_bwd},
    {IR_OP_SLICE,          D0,   plan_slice,      slice_fwd,     slice_bwd},
    {IR_OP_CONCAT,         DALL, plan_concat,     concat_fwd,    concat_bwd},
    {IR_OP_TRANSPOSE,      D0,   plan_transpose,  transpose_fwd, transpose_bwd},
    /* views: no instructions unless the input is stored swapped */
    {IR_OP_RESHAPE,        D0,   plan_view,       view_fwd,      view_bwd},
    {IR_OP_FLATTEN,        D0,   plan_view,       view_fwd,      view_bwd},
    {IR_OP_SQUEEZE,        D0,   plan_view,       view_fwd,      view_bwd},
    {IR_OP_UNSQUEEZE,      D0,   plan_view,       view_fwd,      view_bwd},
    {IR_OP_IDENTITY,       D0,   plan_view,       view_fwd,      view_bwd},
    {IR_OP_CAST,           D0,   plan_cast,       view_fwd,      view_bwd},
};

const grad_rule *train_rule(ir_op op)
{
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        if (rules[i].op == op)
            return &rules[i];
    return NULL;
}
