/*
 * sbprt.h — the one public API of libsbprt, the runtime that code emitted by sbpc calls.
 *
 * Two backends implement exactly these functions: CPU (runtime/cpu/, OpenBLAS + OpenMP)
 * and CUDA (runtime/cuda/, cuBLAS + .cu kernels; see "CUDA notes" at the end for where it
 * differs).  Everything here is fp32 but the bf16 section near the end.  The API is shaped
 * so that both backends fit behind it:
 *
 *   - Every function takes an opaque `sbprt_ctx *` first.  On the CPU it carries the thread
 *     count and a scratch buffer; on CUDA it will carry the stream and cuBLAS handle.  A
 *     context is used by one host thread at a time (like a CUDA stream).
 *   - Tensors are raw `float *` in backend memory ("device" memory; on the CPU backend that
 *     is host memory).  Index tensors (token ids, positions, labels) are `int32_t *` in
 *     backend memory too.  Every tensor argument carries its shape in a comment.  All
 *     tensors are dense, row-major (last axis contiguous) unless a leading dimension or a
 *     stride is passed explicitly.
 *   - Kernels take outputs first, then inputs, then sizes, then scalar hyper-parameters.
 *   - Forward kernels WRITE (=) their outputs.  Backward kernels ACCUMULATE (+=) into every
 *     gradient output, input gradients included (llm.c's convention): the caller zeroes a
 *     gradient buffer once, and a value with several uses, chunks of a StreamBP loop, or a
 *     residual branch simply add into it.  A gradient output pointer that is NULL means
 *     "not needed" and is skipped where the comment says so.
 *   - Unless a comment says otherwise, an output must not alias any input.
 *   - Functions return an `int` status: SBPRT_OK (0) or a positive error code; on error
 *     nothing has been written unless the comment says otherwise.  Library code never
 *     prints or exits.
 *   - Dimension sizes are `int` (each axis fits in 31 bits); flat element counts are
 *     `size_t`; products are computed in 64 bits internally.  A size of 0 is a no-op.
 *
 * Determinism: on the CPU backend every kernel gives bitwise identical results run to run
 * AND for any thread count, except the GEMMs, which are the same run to run for a given
 * thread count (each thread computes a fixed block of C with single-threaded OpenBLAS).
 * Reductions over rows are partitioned over output columns or done in fixed-size blocks
 * combined in a fixed order; there are no atomics.
 */
#ifndef SBPRT_H
#define SBPRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 2: sbprt_scale became out = alpha * x (it was y *= alpha, with another argument order) */
#define SBPRT_API_VERSION 2

/* ---- status ------------------------------------------------------------------------- */

enum sbprt_status {
    SBPRT_OK = 0,
    SBPRT_ERR_INVALID = 1, /* bad argument: NULL tensor, negative size, inconsistent shapes */
    SBPRT_ERR_RANGE = 2,   /* an index tensor (token id, position, label) is out of range */
    SBPRT_ERR_NOMEM = 3,   /* an allocation failed */
    SBPRT_ERR_BACKEND = 4, /* the backend failed (CUDA / cuBLAS error) */
};

/* A static, human-readable name for a status; never NULL. */
const char *sbprt_status_string(int status);

/* "cpu" or "cuda": which backend this library was built as. */
const char *sbprt_backend_name(void);

/* ---- context ------------------------------------------------------------------------ */

typedef struct sbprt_ctx sbprt_ctx;

/* Creates a context.  nthreads <= 0 means "the OpenMP default" (OMP_NUM_THREADS or the
 * core count).  The CPU backend sets OpenBLAS's thread count (process-wide) to 1: it splits
 * the products over its own OpenMP team, so the cores have one pool of threads, not two. */
int sbprt_ctx_create(sbprt_ctx **out, int nthreads);
void sbprt_ctx_destroy(sbprt_ctx *ctx); /* NULL is allowed */
int sbprt_ctx_nthreads(const sbprt_ctx *ctx);
/* Device work items queued on ctx so far: kernel launches and cuBLAS calls (a cuBLAS call may
 * run more than one kernel; it counts once). What a step costs in launch overhead: a trainer
 * reads it before and after a step. 0 on the CPU backend, which launches nothing. */
unsigned long long sbprt_ctx_launches(const sbprt_ctx *ctx);
/* Waits until all work queued on ctx is done (no-op on the CPU backend). */
int sbprt_sync(sbprt_ctx *ctx);

/* ---- memory ------------------------------------------------------------------------- */

#define SBPRT_ALIGN 64 /* bytes; every arena base is aligned to this */

/* One aligned allocation in backend memory, meant to hold a whole memory plan (parameters,
 * gradients, optimizer state, activations at planned offsets).  Contents are unspecified. */
int sbprt_arena_alloc(sbprt_ctx *ctx, void **out, size_t bytes);
void sbprt_arena_free(sbprt_ctx *ctx, void *base); /* NULL is allowed */

enum sbprt_copy_kind {
    SBPRT_COPY_HOST_TO_DEVICE = 0,
    SBPRT_COPY_DEVICE_TO_HOST = 1,
    SBPRT_COPY_DEVICE_TO_DEVICE = 2,
};
/* Copies bytes between host memory and backend memory (plain memcpy on the CPU backend).
 * dst and src must not overlap. */
int sbprt_memcpy(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind);
/* Sets bytes of backend memory to zero (0.0f for floats). */
int sbprt_memset_zero(sbprt_ctx *ctx, void *dst, size_t bytes);

/* Host memory for what a step keeps off the device (sbpc --offload: the layer checkpoints),
 * aligned to SBPRT_ALIGN; on the CUDA backend page-locked (cudaMallocHost), so that copies from
 * and to it run asynchronously at full bus speed.  Contents are unspecified. */
int sbprt_host_alloc(sbprt_ctx *ctx, void **out, size_t bytes);
void sbprt_host_free(sbprt_ctx *ctx, void *p); /* NULL is allowed */

/* Asynchronous copies between backend memory and host memory (kind as sbprt_memcpy), for the
 * transfers a memory plan schedules.  The copy starts after everything queued on ctx before
 * the call and runs on a stream of its own (CUDA), next to the kernels queued after it;
 * sbprt_copy_wait(ctx, event) makes the work queued after the wait start only once the copy
 * that last named `event` is done.  So: the source must not be written, nor the destination
 * read or written, between the copy and its wait.  event is a small index in [0, 4096) that
 * the caller chooses (the step numbers its transfers); reusing it names the newer copy.  The
 * CPU backend copies at once and its wait is a no-op. */
int sbprt_copy_async(sbprt_ctx *ctx, void *dst, const void *src, size_t bytes, int kind,
                     int event);
int sbprt_copy_wait(sbprt_ctx *ctx, int event);
#define SBPRT_COPY_EVENTS 4096 /* events per context */

/* ---- GEMM --------------------------------------------------------------------------- */

/* c = alpha * op(a) @ op(b) + beta * c, row-major, dense.  op(x) is x or xᵀ.
 *   c: [m, n]
 *   a: [m, k], or [k, m] if trans_a
 *   b: [k, n], or [n, k] if trans_b
 * A linear layer y = x Wᵀ with W: [out, in] is sbprt_gemm(ctx, y, x, W, 0, 1, rows, out,
 * in, 1, 0).  beta = 1 accumulates, as weight-gradient GEMMs do. */
int sbprt_gemm(sbprt_ctx *ctx, float *c, const float *a, const float *b, int trans_a,
               int trans_b, int m, int n, int k, float alpha, float beta);

/* For i in [0, batch): c_i = alpha * op(a_i) @ op(b_i) + beta * c_i, row-major, where
 *   a_i = a + i*stride_a, leading dimension lda (row stride of a_i as stored)
 *   b_i = b + i*stride_b, leading dimension ldb
 *   c_i = c + i*stride_c, leading dimension ldc;  c_i: [m, n] with row stride ldc
 * Strides and leading dimensions are in elements; a stride of 0 broadcasts an operand
 * (only for a and b: the c_i must not overlap). */
int sbprt_gemm_strided_batched(sbprt_ctx *ctx, float *c, const float *a, const float *b,
                               int trans_a, int trans_b, int m, int n, int k, float alpha,
                               float beta, int lda, int64_t stride_a, int ldb,
                               int64_t stride_b, int ldc, int64_t stride_c, int batch);

/* y[r, :] += bias for every row (the bias of a linear layer after its GEMM).
 *   y: [n, c]    bias: [c] */
int sbprt_bias_add(sbprt_ctx *ctx, float *y, const float *bias, int n, int c);
/* dbias += column sums of dy.   dbias: [c]    dy: [n, c] */
int sbprt_bias_backward(sbprt_ctx *ctx, float *dbias, const float *dy, int n, int c);

/* ---- elementwise helpers (flat, n elements) ------------------------------------------ */

/* out = a + b.   out, a, b: [n]; out may alias a or b. */
int sbprt_add(sbprt_ctx *ctx, float *out, const float *a, const float *b, size_t n);
/* y += x.   y, x: [n] */
int sbprt_accumulate(sbprt_ctx *ctx, float *y, const float *x, size_t n);
/* A tensor times or divided by a scalar constant (Mul / Div by a one-element constant, e.g.
 * Gemma's embedding normaliser or its final-logit soft-cap): the constant is an argument, not
 * a tensor, so a bf16 step's activations need no fp32 operand.  Each element is one fp32
 * product (quotient) and, in the backward, one fp32 sum, rounded in that order: bitwise what
 * sbprt_broadcast_forward / sbprt_broadcast_backward give for a one-element operand.  The
 * divisions divide (they do not multiply by 1 / divisor, which rounds differently).
 * out = alpha * x.   out may alias x.   out, x: [n] */
int sbprt_scale(sbprt_ctx *ctx, float *out, const float *x, size_t n, float alpha);
/* dx += alpha * dy (the backward of sbprt_scale).   dx, dy: [n] */
int sbprt_scale_accumulate(sbprt_ctx *ctx, float *dx, const float *dy, size_t n, float alpha);
/* out = x / divisor.   out may alias x.   out, x: [n] */
int sbprt_div_scalar(sbprt_ctx *ctx, float *out, const float *x, size_t n, float divisor);
/* dx += dy / divisor (the backward of sbprt_div_scalar).   dx, dy: [n] */
int sbprt_div_scalar_accumulate(sbprt_ctx *ctx, float *dx, const float *dy, size_t n,
                                float divisor);
/* out[0] += Σ x² (summed in double in fixed-size blocks combined in order; for gradient
 * norm clipping).   out: [1]    x: [n] */
int sbprt_sum_squares(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* *out += Σ x², summed in double as sbprt_sum_squares sums (the same blocks, the same order)
 * and never rounded to fp32; out is HOST memory (the call waits for the device).  For the
 * global gradient norm of sbp-train's --clip-grad-norm, added up over the parameters in
 * double.   out: [1] (host)    x: [n] */
int sbprt_grad_sq_norm(sbprt_ctx *ctx, double *out, const float *x, size_t n);

/* ---- embedding ---------------------------------------------------------------------- */

/* out[r, :] = table[ids[r], :].  Any id outside [0, v) gives SBPRT_ERR_RANGE.
 *   out: [n, c]    table: [v, c]    ids: [n] */
int sbprt_embedding_forward(sbprt_ctx *ctx, float *out, const float *table, const int32_t *ids,
                            int n, int v, int c);
/* dtable[ids[r], :] += dout[r, :] for r in order (deterministic scatter-add, partitioned
 * over columns).  Any id outside [0, v) gives SBPRT_ERR_RANGE.
 *   dtable: [v, c]    dout: [n, c]    ids: [n] */
int sbprt_embedding_backward(sbprt_ctx *ctx, float *dtable, const float *dout,
                             const int32_t *ids, int n, int v, int c);

/* ---- normalisation ------------------------------------------------------------------ */

/* LayerNorm over the last axis: out = (x - mean) * rstd * gamma + beta, with
 * rstd = 1 / sqrt(var + eps) (biased variance).  mean and rstd are saved for the backward
 * and may be NULL when not needed; beta may be NULL (no bias).  out may alias x.
 *   out: [n, c]    mean: [n]    rstd: [n]    x: [n, c]    gamma: [c]    beta: [c] */
int sbprt_layernorm_forward(sbprt_ctx *ctx, float *out, float *mean, float *rstd,
                            const float *x, const float *gamma, const float *beta, int n, int c,
                            float eps);
/* dx += ∂L/∂x, dgamma += ∂L/∂gamma, dbeta += ∂L/∂beta; any of the three may be NULL.
 *   dx: [n, c]    dgamma: [c]    dbeta: [c]
 *   dout: [n, c]    x: [n, c]    gamma: [c]    mean: [n]    rstd: [n] (from the forward) */
int sbprt_layernorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma, float *dbeta,
                             const float *dout, const float *x, const float *gamma,
                             const float *mean, const float *rstd, int n, int c);

/* RMSNorm over the last axis: out = x * rstd * gamma, rstd = 1 / sqrt(mean(x²) + eps).
 * rstd may be NULL.  out may alias x.
 *   out: [n, c]    rstd: [n]    x: [n, c]    gamma: [c] */
int sbprt_rmsnorm_forward(sbprt_ctx *ctx, float *out, float *rstd, const float *x,
                          const float *gamma, int n, int c, float eps);
/* dx += ∂L/∂x, dgamma += ∂L/∂gamma; either may be NULL.
 *   dx: [n, c]    dgamma: [c]    dout: [n, c]    x: [n, c]    gamma: [c]    rstd: [n] */
int sbprt_rmsnorm_backward(sbprt_ctx *ctx, float *dx, float *dgamma, const float *dout,
                           const float *x, const float *gamma, const float *rstd, int n, int c);

/* ---- activations (flat; forward outputs may alias their input) ---------------------- */

/* GELU, tanh approximation: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))).
 *   out: [n]    x: [n] */
int sbprt_gelu_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout * gelu_tanh'(x).   dx, dout, x: [n] */
int sbprt_gelu_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                             size_t n);
/* GELU, exact form: 0.5 x (1 + erf(x / √2)).   out, x: [n] */
int sbprt_gelu_erf_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout * gelu_erf'(x).   dx, dout, x: [n] */
int sbprt_gelu_erf_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x,
                            size_t n);
/* SiLU: x * sigmoid(x).   out, x: [n] */
int sbprt_silu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout * silu'(x).   dx, dout, x: [n] */
int sbprt_silu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x, size_t n);
/* ReLU: max(x, 0); a NaN stays NaN.   out, x: [n] */
int sbprt_relu_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout where the ReLU's input is > 0 (the derivative at 0 is taken as 0, as PyTorch).
 * `x` may be the forward's input or its output: both are > 0 at the same elements, so the
 * caller passes whichever it keeps anyway.   dx, dout, x: [n] */
int sbprt_relu_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *x, size_t n);
/* tanh.   out, x: [n] */
int sbprt_tanh_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout * (1 - y²), with y = tanh(x) the forward's OUTPUT (as PyTorch's tanh_backward),
 * so that the input need not be kept.   dx, dout, y: [n] */
int sbprt_tanh_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *y, size_t n);
/* Sigmoid: 1 / (1 + exp(-x)).   out, x: [n] */
int sbprt_sigmoid_forward(sbprt_ctx *ctx, float *out, const float *x, size_t n);
/* dx += dout * y (1 - y), with y = sigmoid(x) the forward's OUTPUT (as PyTorch's
 * sigmoid_backward), so that the input need not be kept.   dx, dout, y: [n] */
int sbprt_sigmoid_backward(sbprt_ctx *ctx, float *dx, const float *dout, const float *y,
                           size_t n);
/* SwiGLU product: out = silu(gate) * up.  out may alias gate or up.
 *   out, gate, up: [n] */
int sbprt_swiglu_forward(sbprt_ctx *ctx, float *out, const float *gate, const float *up,
                         size_t n);
/* dgate += dout * up * silu'(gate), dup += dout * silu(gate); either may be NULL.
 *   dgate, dup, dout, gate, up: [n] */
int sbprt_swiglu_backward(sbprt_ctx *ctx, float *dgate, float *dup, const float *dout,
                          const float *gate, const float *up, size_t n);

/* ---- rotary position embedding ------------------------------------------------------ */

/* RoPE, rotate-half convention (GPT-NeoX / Llama / Qwen in Hugging Face): for each row r,
 * head h, with p = pos[r], half = rot_dim / 2, and i < half:
 *   out[i]        = x[i]        * cos[p, i]        - x[i + half] * sin[p, i]
 *   out[i + half] = x[i + half] * cos[p, i + half] + x[i]        * sin[p, i + half]
 * Dimensions rot_dim..head_dim-1 pass through unchanged (partial rotary; rot_dim ==
 * head_dim is the usual case).  rot_dim must be even and <= head_dim.  Any position outside
 * [0, max_pos) gives SBPRT_ERR_RANGE.  out may alias x.
 *   out: [rows, heads, head_dim]    x: [rows, heads, head_dim]    pos: [rows]
 *   cos_tab, sin_tab: [max_pos, rot_dim] */
int sbprt_rope_forward(sbprt_ctx *ctx, float *out, const float *x, const int32_t *pos,
                       const float *cos_tab, const float *sin_tab, int rows, int heads,
                       int head_dim, int rot_dim, int max_pos);
/* dx += Rᵀ dout (the transposed rotation).   dx, dout: [rows, heads, head_dim]; the rest as
 * in the forward. */
int sbprt_rope_backward(sbprt_ctx *ctx, float *dx, const float *dout, const int32_t *pos,
                        const float *cos_tab, const float *sin_tab, int rows, int heads,
                        int head_dim, int rot_dim, int max_pos);

/* ---- causal self-attention (grouped-query, chunked-query) --------------------------- */

/* Causal attention for a chunk of query rows.  Query row i (0 <= i < t) sits at absolute
 * position q_start + i and attends keys 0 .. q_start + i:
 *   out[b, i, h, :] = Σ_j softmax_j(scale * q[b,i,h,:] · k[b,j,g,:]) v[b,j,g,:]
 * with g = h / (hq / hkv) (grouped-query attention; hq must be a multiple of hkv; hq == hkv
 * is multi-head, hkv == 1 multi-query).  Requires q_start >= 0 and q_start + t <= tk; keys
 * beyond q_start + t - 1 are never read.  q_start = 0 and t = tk is ordinary causal
 * self-attention; StreamBP calls it per query chunk with the whole K/V prefix.
 * Computed in tiles with an online softmax: no [t, tk] buffer exists, fully masked tiles
 * are skipped.  lse (the natural-log logsumexp of each row's scaled scores) is saved for
 * the backward; it may be NULL when no backward follows.
 *   out: [b, t, hq, d]    lse: [b, hq, t]
 *   q: [b, t, hq, d]    k: [b, tk, hkv, d]    v: [b, tk, hkv, d] */
int sbprt_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                            const float *k, const float *v, int b, int t, int tk, int hq,
                            int hkv, int d, int q_start, float scale);
/* Backward of the same chunk (FlashAttention-2 style: scores are recomputed from q, k and
 * the saved lse, and rowsum(dout ∘ out) is computed once up front).
 *   dq += ∂L/∂q for the chunk's rows;
 *   dk, dv += the chunk's contribution, over the keys it reads (rows 0 .. q_start + t - 1);
 * so running every chunk of a sequence accumulates the full dk, dv.  dq may be NULL, and
 * dk and dv may both be NULL (then that part is skipped).
 *   dq: [b, t, hq, d]    dk: [b, tk, hkv, d]    dv: [b, tk, hkv, d]
 *   dout, out: [b, t, hq, d]    q: [b, t, hq, d]    k, v: [b, tk, hkv, d]    lse: [b, hq, t] */
int sbprt_attention_backward(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, int b, int t, int tk, int hq,
                             int hkv, int d, int q_start, float scale);

/* The same two with the variants of Mistral / Gemma local layers and Gemma-2 (the functions
 * above are these with window = 0, softcap = 0):
 *   window >= 0: 0 is plain causal; w > 0 is a sliding window: the row at absolute position
 *     p attends keys j with p - w < j <= p only (the w latest keys, itself included; as
 *     transformers' `kv_idx > q_idx - sliding_window`).  Key tiles wholly before a row
 *     tile's window are skipped, so the work is O(t * w), not O(t * (q_start + t)).  The
 *     chunk reads only keys max(0, q_start - w + 1) .. q_start + t - 1 (the rows before it
 *     may hold anything), and the backward adds into exactly those rows of dk and dv.
 *     w >= q_start + t is plain causal.
 *   softcap >= 0: 0 is none; c > 0 replaces each scaled score s = scale * q·k by
 *     c * tanh(s / c) before the mask and the softmax (Gemma-2's attention logit
 *     soft-capping); lse is the logsumexp of the capped scores, and the backward applies
 *     the cap's derivative 1 - tanh(s / c)^2.
 * window < 0, or softcap negative or not finite, gives SBPRT_ERR_INVALID.  Shapes and the
 * other arguments as above. */
int sbprt_attention_forward_ex(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                               const float *k, const float *v, int b, int t, int tk, int hq,
                               int hkv, int d, int q_start, float scale, int window,
                               float softcap);
int sbprt_attention_backward_ex(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse, int b,
                                int t, int tk, int hq, int hkv, int d, int q_start, float scale,
                                int window, float softcap);

/* Packed documents: several documents share a row, none attends across a boundary, and
 * (with sbprt_doc_positions for RoPE) positions restart per document.  These are the _ex
 * functions with a block-diagonal causal mask; doc_start = NULL means one document per row,
 * and the _ex functions are exactly these with NULL (bitwise the same results).
 *   doc_start[b, p], for each absolute position p of row b, is the position where p's
 *     document starts: 0 <= doc_start[p] <= p and non-decreasing along the row (constant
 *     within a document, jumping to p where one starts).  sbprt_doc_starts derives it from
 *     document ids.
 *   The query at absolute position P = q_start + i attends exactly the keys j with
 *     doc_start[b, P] <= j <= P (and P - window < j with a window > 0).
 * Only doc_start[b, q_start .. q_start + t - 1] is read; a value there that is negative,
 * past its position, or smaller than the one before it (within the chunk) gives
 * SBPRT_ERR_RANGE with nothing written (CUDA: see the CUDA notes).  Key tiles wholly before a
 * query tile's first key (its first row's document start or window) are skipped, in the
 * forward and in both halves of the backward, so a row of n equal documents costs about 1/n
 * of the causal work (plus the tiles that straddle a boundary).
 * The chunk reads only keys from max(doc_start[b, q_start], q_start - window + 1) to
 * q_start + t - 1 (the rows before may hold anything: a StreamBP chunk passes K/V from its
 * first document's start on), and the backward adds into exactly those rows of dk and dv.
 *   doc_start: [b, tk] (int32); the other tensors as in sbprt_attention_forward_ex /
 *   sbprt_attention_backward_ex. */
int sbprt_attention_forward_packed(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                                   const float *k, const float *v, const int32_t *doc_start,
                                   int b, int t, int tk, int hq, int hkv, int d, int q_start,
                                   float scale, int window, float softcap);
int sbprt_attention_backward_packed(sbprt_ctx *ctx, float *dq, float *dk, float *dv,
                                    const float *dout, const float *q, const float *k,
                                    const float *v, const float *out, const float *lse,
                                    const int32_t *doc_start, int b, int t, int tk, int hq,
                                    int hkv, int d, int q_start, float scale, int window,
                                    float softcap);

/* What a compiled step derives from the user's document ids (runtime/cpu/docs.c).
 * doc_ids[b, p] names the document of position p; each row is non-decreasing (a document is
 * one run of equal ids); a decrease gives SBPRT_ERR_RANGE (CUDA: see the CUDA notes).
 *   doc_start[b, p] = the first position of p's run: the mask argument above.
 *   pos[b, p] = p - doc_start[b, p]: the position within the document (for RoPE or a
 *     position embedding).
 *   doc_start, pos, doc_ids: [b, t] (int32) */
int sbprt_doc_starts(sbprt_ctx *ctx, int32_t *doc_start, const int32_t *doc_ids, int b, int t);
int sbprt_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_ids, int b, int t);

/* ---- sequence parallelism (sbpc --seq-parallel N; runtime/cpu/seqpar.c) ----------------
 * A sequence-parallel step runs on N ranks (a group), each holding tl = T / N consecutive tokens
 * of every row: rank r holds the tokens at positions r*tl .. r*tl + tl - 1 of each sequence.
 * Everything but attention is token-wise and runs on the rank's own tokens. At each attention
 * (DeepSpeed Ulysses' scheme) an all-to-all turns [tl local rows, all heads] into [all T rows,
 * this rank's heads] for Q, K and V, the attention runs on the rank's heads over the whole
 * sequence, and an all-to-all turns its output back; the backward mirrors it.
 *
 * Heads: rank r holds query heads r*hq/N .. (r+1)*hq/N - 1 (hq % N == 0) and the kv heads they
 * read: hkv_r = hkv / N of them from kv0(r) = r * hkv / N when hkv % N == 0, or one, kv0(r) =
 * (r * hq / N) / (hq / hkv), replicated on N / hkv ranks, when N % hkv == 0 (the query heads of
 * a rank then share one group). Any other hq, hkv, N gives SBPRT_ERR_INVALID. Within a rank the
 * attention is the ordinary grouped-query one with hq / N query and hkv_r kv heads.
 *
 * The collective itself is the caller's: the context carries a communicator (below), which
 * sbp-train implements with MPI_Alltoall (cpu steps, and the CUDA emulator) or ncclSend /
 * ncclRecv in a group (cuda steps). Every rank of a group must make the same calls in the same
 * order with the same sizes (the compiled steps do: every rank runs one program). Each kernel
 * here takes nranks, the N it was compiled for, and gives SBPRT_ERR_INVALID when the context
 * has no communicator of that size (a one-rank kernel with nranks == 1 needs none). A failed
 * all-to-all gives SBPRT_ERR_BACKEND. */

typedef struct sbprt_comm {
    int rank; /* 0 .. size - 1: this rank's place in its group (which tokens it holds) */
    int size; /* N, the ranks that share each sequence */
    /* All-to-all of equal blocks of `bytes` bytes: block i of send [size, bytes] goes to rank
     * i, and block i of recv [size, bytes] is what rank i sent to this one. Buffers are backend
     * memory (device memory on CUDA) and do not overlap. Returns 0 on success. stream is the
     * context's CUDA stream (cudaStream_t; NULL on the CPU backend): with stream_ordered set
     * the call only queues the exchange on it (NCCL); otherwise the CUDA backend first waits
     * for its stream, so the callback may read send at once and must have filled recv when it
     * returns (MPI on host or emulated memory). */
    int (*alltoall)(void *user, const void *send, void *recv, size_t bytes, void *stream);
    void *user;
    int stream_ordered;
} sbprt_comm;

/* Installs a copy of *comm in ctx (NULL removes it). SBPRT_ERR_INVALID when size < 1, rank is
 * not in [0, size) or alltoall is NULL. */
int sbprt_ctx_set_comm(sbprt_ctx *ctx, const sbprt_comm *comm);
/* The communicator's size and rank: 1 and 0 without one. */
int sbprt_ctx_comm_size(const sbprt_ctx *ctx);
int sbprt_ctx_comm_rank(const sbprt_ctx *ctx);

/* pos[b, i] = rank * tl + i: each local token's position in its whole sequence.
 *   pos: [b, tl] (int32) */
int sbprt_sp_positions(sbprt_ctx *ctx, int32_t *pos, int b, int tl, int nranks);

/* The whole sequence of every row from each rank's share (document ids, for packed steps):
 *   all[b, n * tl + i] = rank n's mine[b, i].
 *   all: [b, nranks * tl] (int32)    mine: [b, tl] (int32)    scratch: [nranks, tl] (int32) */
int sbprt_sp_gather_rows(sbprt_ctx *ctx, int32_t *all, const int32_t *mine, int32_t *scratch,
                         int b, int tl, int nranks);

/* Packed steps: each local token's position in its document, from the whole rows' document
 * starts (sbprt_doc_starts over `all` above):
 *   pos[b, i] = rank * tl + i - doc_start[b, rank * tl + i].
 *   pos: [b, tl] (int32)    doc_start: [b, nranks * tl] (int32) */
int sbprt_sp_doc_positions(sbprt_ctx *ctx, int32_t *pos, const int32_t *doc_start, int b,
                           int tl, int nranks);

/* K or V for this rank's heads over the whole sequence, from every rank's local rows:
 *   kh[b, n * tl + i, j, :] = rank n's k[b, i, kv0(rank) + j, :]   (0 <= j < hkv_r)
 * (one all-to-all per batch row). Used for V as well.
 *   kh: [b, nranks * tl, hkv_r, d]    k: [b, tl, hkv, d]    scratch: [nranks, tl, hkv_r, d] */
int sbprt_sp_kv_gather(sbprt_ctx *ctx, float *kh, const float *k, float *scratch, int b,
                       int tl, int hq, int hkv, int d, int nranks);
/* Its backward, ACCUMULATED: every rank's dkh rows of this rank's tokens, added to the kv heads
 * they belong to (replicated heads: the ranks' contributions in rank order):
 *   dk[b, i, kv0(n) + j, :] += rank n's dkh[b, rank * tl + i, j, :]   for every rank n.
 * dkh is read only. dkh: [b, nranks * tl, hkv_r, d]    dk: [b, tl, hkv, d]
 *   scratch: [nranks, tl, hkv_r, d] */
int sbprt_sp_kv_scatter(sbprt_ctx *ctx, float *dk, const float *dkh, float *scratch, int b,
                        int tl, int hq, int hkv, int d, int nranks);

/* Causal attention of a chunk of this rank's query rows (local rows q_start .. q_start + t - 1
 * of its tl, all heads), as sbprt_attention_forward_packed over the whole sequence: the same
 * chunk of every rank is exchanged, so this rank computes its heads for N chunks, the one of
 * rank n at absolute positions n * tl + q_start + i, against kh, vh (sbprt_sp_kv_gather's);
 * then the outputs go back to the ranks that own the rows.
 *   out: [b, t, hq, d]    q: [b, t, hq, d]    kh, vh: [b, nranks * tl, hkv_r, d]
 *   lse: [nranks, b, hq / nranks, t] (this rank's heads, for the backward)
 *   doc_start: [b, nranks * tl] (int32) the whole rows' document starts, or NULL (one
 *   document per row)    s1, s2: scratch of b * t * hq * d floats each
 * window and softcap as sbprt_attention_forward_ex. */
int sbprt_sp_attention_forward(sbprt_ctx *ctx, float *out, float *lse, const float *q,
                               const float *kh, const float *vh, const int32_t *doc_start,
                               float *s1, float *s2, int b, int t, int tl, int hq, int hkv,
                               int d, int q_start, float scale, int window, float softcap,
                               int nranks);
/* Its backward, ACCUMULATED into dq [b, t, hq, d] (this rank's rows, all heads) and into dkh,
 * dvh [b, nranks * tl, hkv_r, d] (this rank's heads, the whole sequence; sbprt_sp_kv_scatter
 * then returns them to the ranks that own the rows). dout, out, q: [b, t, hq, d] (this rank's
 * rows); lse as the forward wrote it; s1 .. s4: scratch of b * t * hq * d floats each. */
int sbprt_sp_attention_backward(sbprt_ctx *ctx, float *dq, float *dkh, float *dvh,
                                const float *dout, const float *q, const float *kh,
                                const float *vh, const float *out, const float *lse,
                                const int32_t *doc_start, float *s1, float *s2, float *s3,
                                float *s4, int b, int t, int tl, int hq, int hkv, int d,
                                int q_start, float scale, int window, float softcap,
                                int nranks);

/* ---- Mixture-of-Experts (runtime/cpu/moe.c, runtime/cuda/moe.cu) --------------------- */

/* A routed layer of SwiGLU experts (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE) over n token rows:
 *   z[r, :]  = x[r] wrᵀ                      the router's logits over the e experts
 *   p[r, :]  = softmax(z[r, :])               probs: [n, e] (written, for the backward)
 *   sel[r, :] the k largest p[r, :] in descending order; equal values: the lower expert
 *             index first (ONNX TopK)         sel: [n, k] int32 (written)
 *   v[r, j]  = p[r, sel[r, j]]
 *   wts[r, j] = norm_topk ? v[r, j] / Σ_j' v[r, j'] : v[r, j]     wts: [n, k] (written)
 *   y[r]     = Σ_{j = 0 .. k-1, in this order} wts[r, j] · FFN_{sel[r, j]}(x[r])
 *   FFN_i(u) = w2[i] (silu(w1[i][0:f] u) ⊙ (w1[i][f:2f] u))
 * with x: [n, d], wr: [e, d], w1: [e, 2f, d] (rows [0, f) the gate projection, [f, 2f) the up
 * projection, each out x in, as transformers' fused gate_up_proj), w2: [e, d, f]
 * (down_proj), y: [n, d].  Only the experts a row selects run on it: the n*k (row, choice)
 * pairs are sorted by expert (stably: row, then choice, within an expert) and each expert's
 * matrices are one GEMM over its own rows, so the work is proportional to k, not e.
 * stats: [2e] or NULL; when given it ACCUMULATES the load-balancing loss's sums,
 *   stats[i] += #{(r, j) : sel[r, j] = i},    stats[e + i] += Σ_r p[r, i]
 * (the forward that counts each row once passes it; a recomputation passes NULL).
 * y NULL: the routing alone (probs, sel, wts and stats), no expert runs and w1, w2 are not
 * read: what a recomputation before the backward needs, since the backward recomputes the
 * experts' activations itself.
 * scratch: sbprt_moe_scratch_floats(n, d, e, k, f) floats, the same for every routing, so a
 * memory plan can hold it.  1 <= k <= e. */
int sbprt_moe_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel, float *wts,
                      float *stats, const float *x, const float *wr, const float *w1,
                      const float *w2, float *scratch, int n, int d, int e, int k, int f,
                      int norm_topk);
/* Its backward, ACCUMULATED into dx [n, d], dwr [e, d], dw1 [e, 2f, d] and dw2 [e, d, f]
 * (each may be NULL: not computed), from dy [n, d] and the forward's x, weights, probs, sel
 * and wts; the experts' activations are recomputed here from x (they are not kept).  The
 * router's gradient flows through wts (the renormalisation, then the softmax); the selection
 * itself has none.  The load-balancing term aux_scale · Σ_i c_i P_i, with c_i = stats[i] the
 * step's counts and P_i the probabilities summed over the step's rows, adds
 * aux_scale · stats[i] to dL/dp[r, i] for every row r (aux_scale 0 or stats NULL: nothing).
 * scratch: as the forward's.
 * CUDA: each call copies the e+1 expert offsets of its sort to the host once, synchronously
 * (cuBLAS takes each expert's row count from the host); a sel entry outside [0, e) makes the
 * call write nothing and the next sbprt_sync return SBPRT_ERR_RANGE, as a bad label does. */
int sbprt_moe_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                       const float *dy, const float *x, const float *wr, const float *w1,
                       const float *w2, const float *probs, const int32_t *sel,
                       const float *wts, const float *stats, float *scratch, int n, int d,
                       int e, int k, int f, int norm_topk, float aux_scale);
/* Floats of scratch the two calls above need: the sorted copies of the rows and their
 * activations (n*k rows of d, 2f, f, d floats), their gradients, and the routing tables (the
 * sort's order and each expert's first row, stored as int32 in float slots), each piece
 * rounded up to 64 floats.  It depends on the sizes alone, never on the routing. */
static inline size_t sbprt_moe_scratch_floats(int n, int d, int e, int k, int f)
{
    size_t nk = (size_t)n * (size_t)k;
    return nk * (2 * (size_t)d + 6 * (size_t)f + 3) + (size_t)n * (size_t)e + (size_t)e + 1 +
           16 * 64;
}

/* The same layer with LoRA on the experts (PEFT's target_parameters on the fused tensors,
 * peft 0.21's ParamWrapper layout): the gate/up projection of expert i becomes
 *   w1[i] + scale · B1_i A1_i   with A1_i = a1[i r : (i+1) r, :]   (a1: [e r, d])
 *                                    B1_i[o, j] = b1[o, j e + i]    (b1: [2f, r e])
 * and the down projection likewise with a2: [e r, f], b2: [d, r e].  Either pair may be NULL
 * (that projection not adapted).  The adapters are applied as they are factored: rows x of
 * expert i get x A1_iᵀ [r] and then · B1_iᵀ, so no per-expert delta matrix is ever formed
 * (each call copies b1 / b2 into expert-major tiles [e, out, r], the adapters' own size).
 * r: the rank (ignored when both pairs are NULL: the plain calls above); scale: alpha / r.
 * scratch: sbprt_moe_lora_scratch_floats(n, d, e, k, f, r) floats. */
int sbprt_moe_lora_forward(sbprt_ctx *ctx, float *y, float *probs, int32_t *sel, float *wts,
                           float *stats, const float *x, const float *wr, const float *w1,
                           const float *w2, const float *a1, const float *b1, const float *a2,
                           const float *b2, float *scratch, int n, int d, int e, int k, int f,
                           int norm_topk, int r, float scale);
/* Its backward: as sbprt_moe_backward, and ACCUMULATED into da1 [e r, d], db1 [2f, r e],
 * da2 [e r, f], db2 [d, r e] (each may be NULL; a NULL adapter has none). */
int sbprt_moe_lora_backward(sbprt_ctx *ctx, float *dx, float *dwr, float *dw1, float *dw2,
                            float *da1, float *db1, float *da2, float *db2, const float *dy,
                            const float *x, const float *wr, const float *w1, const float *w2,
                            const float *a1, const float *b1, const float *a2, const float *b2,
                            const float *probs, const int32_t *sel, const float *wts,
                            const float *stats, float *scratch, int n, int d, int e, int k,
                            int f, int norm_topk, float aux_scale, int r, float scale);
/* Floats of scratch the two calls above need: sbprt_moe_scratch_floats's, then the adapters'
 * products and their gradients (4 of n*k rows of r floats) and the expert-major copies of b1,
 * b2 and of their gradients (2 e (2f + d) r), each piece aligned to 64 floats; r = 0 gives
 * sbprt_moe_scratch_floats's figure.  It depends on the sizes alone, never on the routing. */
static inline size_t sbprt_moe_lora_scratch_floats(int n, int d, int e, int k, int f, int r)
{
    size_t base = sbprt_moe_scratch_floats(n, d, e, k, f);
    if (r <= 0)
        return base;
    size_t nk = (size_t)n * (size_t)k;
    return base + (size_t)r * (4 * nk + 2 * (size_t)e * (2 * (size_t)f + (size_t)d)) + 9 * 64;
}

/* ---- losses ------------------------------------------------------------------------- */

#define SBPRT_IGNORE_INDEX (-100) /* a label that is not scored (as torch's ignore_index) */

/* Fused softmax cross-entropy with its gradient.  For each row r with a scored label
 * (0 <= labels[r] < v):  loss_r = logsumexp(logits[r]) - logits[r, labels[r]],
 *   dlogits[r, :] = (softmax(logits[r]) - onehot(labels[r])) * scale;
 * rows labelled SBPRT_IGNORE_INDEX get loss 0 and dlogits 0.  loss_sum[0] += Σ_r loss_r.
 * The caller passes scale = 1 / (global number of scored tokens) so chunks of a sequence
 * combine into the mean loss's gradient.  dlogits may be NULL (loss only) and may alias
 * logits (the gradient then overwrites the logits row by row).  Any other label gives
 * SBPRT_ERR_RANGE.
 *   loss_sum: [1]    dlogits: [n, v]    logits: [n, v]    labels: [n] */
int sbprt_cross_entropy_forward_backward(sbprt_ctx *ctx, float *loss_sum, float *dlogits,
                                         const float *logits, const int32_t *labels, int n,
                                         int v, float scale);

/* Per-row log-probability of the label (for DPO / GRPO objectives):
 *   logp[r] = logits[r, labels[r]] - logsumexp(logits[r]),  0 for ignored rows;
 *   lse[r]  = logsumexp(logits[r]) (saved for the backward; may be NULL).
 *   logp: [n]    lse: [n]    logits: [n, v]    labels: [n] */
int sbprt_label_logprob_forward(sbprt_ctx *ctx, float *logp, float *lse, const float *logits,
                                const int32_t *labels, int n, int v);
/* dlogits[r, :] += dlogp[r] * (onehot(labels[r]) - softmax(logits[r])); ignored rows add 0.
 *   dlogits: [n, v]    dlogp: [n]    logits: [n, v]    labels: [n]    lse: [n] (forward's) */
int sbprt_label_logprob_backward(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                                 const float *logits, const int32_t *labels, const float *lse,
                                 int n, int v);

/* ---- optimizers (flat over n parameters; param, m, v are updated in place) -----------
 * Hyper-parameters are double, as Python floats are in torch.optim: derived constants such
 * as 1 - beta2 are formed in double and rounded to fp32 once, as torch does (forming them
 * from an fp32 beta2 = 0.999 would be off by 1e-5 relative). */

/* Plain SGD as torch.optim.SGD without momentum: param -= lr * (grad + weight_decay*param).
 *   param, grad: [n] */
int sbprt_sgd_update(sbprt_ctx *ctx, float *param, const float *grad, size_t n, double lr,
                     double weight_decay);
/* AdamW exactly as torch.optim.AdamW (amsgrad = False, maximize = False), for the step
 * numbered `step` (1 for the first update; the caller counts):
 *   param *= 1 - lr * weight_decay                 (decoupled weight decay, first)
 *   m = lerp(m, grad, 1 - beta1);   v = beta2 * v + (1 - beta2) * grad²
 *   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 *   param, m, v, grad: [n] */
int sbprt_adamw_update(sbprt_ctx *ctx, float *param, float *m, float *v, const float *grad,
                       size_t n, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int step);

/* ---- multi-tensor forms: the optimizer of a whole step in a few calls ---------------
 * A trainer updates hundreds of tensors a step; one call per tensor is one launch per tensor
 * on a GPU, and the norm one host synchronisation per tensor. The forms below take the list
 * of tensors (spans of the flat parameter, gradient and optimizer-state blocks) and do the
 * same arithmetic as the per-tensor calls in list order, element for element: their results
 * are bitwise those of calling the per-tensor function once per span. The CUDA backend runs
 * each in one to three launches (the norm with one synchronisation), keeping a device copy of
 * the last span list so that a list given again (every step) is not uploaded again. */

/* One tensor in the flat blocks: elements [param, param + n) of the parameter block,
 * [grad, grad + n) of the gradient block, [state, state + n) of AdamW's m and v. */
typedef struct sbprt_span {
    size_t param; /* offset in the parameter block (elements) */
    size_t grad;  /* offset in the gradient block */
    size_t state; /* offset in the optimizer state blocks */
    size_t n;     /* elements; 0: the span is skipped */
} sbprt_span;

/* *out += t_0 + t_1 + ... (summed in double, in order, from 0), t_i = Σ grads[span i]² as
 * sbprt_grad_sq_norm sums it: from *out = 0, bitwise what calling sbprt_grad_sq_norm once per
 * span gives. out is HOST memory; the call waits for the device once.
 *   out: [1] (host)    grads: the gradient block    spans: [nspans] (host) */
int sbprt_grad_sq_norm_multi(sbprt_ctx *ctx, double *out, const float *grads,
                             const sbprt_span *spans, int nspans);
/* grads[span i] = alpha * grads[span i] for every span (sbprt_scale in place, per span). */
int sbprt_scale_multi(sbprt_ctx *ctx, float *grads, const sbprt_span *spans, int nspans,
                      float alpha);
/* sbprt_sgd_update(params + param, grads + grad, n, ...) for every span. */
int sbprt_sgd_update_multi(sbprt_ctx *ctx, float *params, const float *grads,
                           const sbprt_span *spans, int nspans, double lr, double weight_decay);
/* sbprt_adamw_update(params + param, m + state, v + state, grads + grad, n, ...) for every
 * span, with the same hyper-parameters and step. */
int sbprt_adamw_update_multi(sbprt_ctx *ctx, float *params, float *m, float *v,
                             const float *grads, const sbprt_span *spans, int nspans, double lr,
                             double beta1, double beta2, double eps, double weight_decay,
                             int step);

/* ---- layout and broadcasting helpers (runtime/cpu/extra.c) ---------------------------
 * What compiled steps need between the semantic ops: the exporter's Transpose, Split / Slice /
 * Concat, and broadcasting Add / Sub / Mul / Div.  Ranks are at most 8; dims are the
 * row-major extents. */

/* out = x with its axes permuted: out axis i is x axis perm[i] (as ONNX Transpose).
 *   out: [dims[perm[0]], ..., dims[perm[rank-1]]]    x: [dims[0], ..., dims[rank-1]] */
int sbprt_permute_forward(sbprt_ctx *ctx, float *out, const float *x, int rank, const int *dims,
                          const int *perm);
/* dx += the inverse permutation of dout (dims and perm as in the forward).
 *   dx: [dims...]    dout: [dims[perm[0]], ...] */
int sbprt_permute_backward(sbprt_ctx *ctx, float *dx, const float *dout, int rank,
                           const int *dims, const int *perm);

/* A block of w columns of `rows` rows: dst[r*dst_ld + dst_off + j] = (or += when
 * accumulate) src[r*src_ld + src_off + j], for r < rows, j < w.  A Split / Slice / Concat
 * along axis a of a tensor [outer, extent_a, inner] is this with rows = outer and columns
 * counted in units of inner.  dst and src must not overlap.
 *   dst: [rows, dst_ld]    src: [rows, src_ld] */
int sbprt_copy_cols(sbprt_ctx *ctx, float *dst, const float *src, int rows, int w, int dst_ld,
                    int dst_off, int src_ld, int src_off, int accumulate);

enum sbprt_binop { SBPRT_BIN_ADD = 0, SBPRT_BIN_SUB = 1, SBPRT_BIN_MUL = 2, SBPRT_BIN_DIV = 3 };
/* out = a OP b with numpy broadcasting: a_dims and b_dims are the operands' extents aligned
 * to the output's rank (1 where an operand is broadcast).  out may alias an operand whose
 * dims equal dims.
 *   out: [dims]    a: [a_dims]    b: [b_dims] */
int sbprt_broadcast_forward(sbprt_ctx *ctx, float *out, const float *a, const float *b, int op,
                            int rank, const int *dims, const int *a_dims, const int *b_dims);
/* da += ∂L/∂a, db += ∂L/∂b, each reduced over its broadcast axes (either may be NULL).
 *   da: [a_dims]    db: [b_dims]    dout: [dims]    a: [a_dims]    b: [b_dims] */
int sbprt_broadcast_backward(sbprt_ctx *ctx, float *da, float *db, const float *dout,
                             const float *a, const float *b, int op, int rank, const int *dims,
                             const int *a_dims, const int *b_dims);

/* ---- backend options ----------------------------------------------------------------
 * Settings and diagnostics that only some backends act on; every backend accepts them. */

/* enable != 0 lets GEMMs round their inputs to TF32 on tensor cores (CUDA: roughly 1e-3
 * relative error instead of fp32's 1e-6, several times the speed).  Off by default.  Affects
 * sbprt_gemm and sbprt_gemm_strided_batched only.  The CPU backend accepts and ignores it. */
int sbprt_ctx_set_tf32(sbprt_ctx *ctx, int enable);

/* A one-line description of the last failure on ctx (what failed, where, and for an
 * allocation the bytes asked and the bytes free), or "" if there is none; valid until the
 * next call on ctx.  With ctx == NULL: the last failed sbprt_ctx_create on this thread.  The
 * CPU backend records nothing and always returns "". */
const char *sbprt_ctx_last_error(const sbprt_ctx *ctx);

/* Memory of the backend's device as ctx sees it now, in bytes: *used is what is allocated
 * on it (by every process and the driver, this context's arena and scratch included) and
 * *total its capacity.  CUDA: total - free from cudaMemGetInfo on ctx's device (so it
 * includes the CUDA context itself, a few hundred MiB, and other processes' memory).  CPU:
 * the resident set of this process (/proc/self/statm) and the machine's physical memory;
 * SBPRT_ERR_INVALID where those cannot be read.  Either pointer may be NULL. */
int sbprt_device_memory(sbprt_ctx *ctx, size_t *used, size_t *total);

/* ---- CUDA notes ----------------------------------------------------------------------
 * The CUDA backend (library sbprt_cuda; sbprt_backend_name() == "cuda") differs from the
 * CPU backend in these ways, and only these:
 *
 *   - Tensors, index tensors included, are device pointers; sbprt_arena_alloc is cudaMalloc
 *     (256-byte aligned).  A context works on the device that was current when it was
 *     created, through its own stream and cuBLAS handle; keep that device current.
 *     sbprt_ctx_create's nthreads is only reported back by sbprt_ctx_nthreads.
 *   - Kernels and device-to-device copies are queued on the context's stream and return
 *     before they run.  Host<->device sbprt_memcpy waits for the stream, so its host buffer
 *     may be used as soon as it returns.  sbprt_sync waits for everything queued.
 *   - Index ranges (token ids, positions, labels) are checked on the device, since the
 *     indices are in device memory: a call meeting an out-of-range index still returns
 *     SBPRT_OK, skips the rows with bad indices (their outputs are left as they were, a bad
 *     label's loss counts as 0) and raises a flag in the context; the next sbprt_sync
 *     returns SBPRT_ERR_RANGE and clears it.  So check sbprt_sync's status after a step.
 *     Other argument errors (SBPRT_ERR_INVALID) are found on the host, up front, as on the
 *     CPU backend.  Document starts and ids are index tensors too: a bad doc_start of a
 *     packed attention call, or a decreasing id of sbprt_doc_starts / sbprt_doc_positions,
 *     raises the flag; the outputs of that call are then unspecified (but nothing outside
 *     its arguments is read or written).
 *   - Errors of the CUDA runtime or cuBLAS give SBPRT_ERR_BACKEND (SBPRT_ERR_NOMEM for a
 *     failed allocation) and a diagnostic in sbprt_ctx_last_error.  A fault inside a kernel
 *     shows up at a later call, at the latest at sbprt_sync.  On a machine without a usable
 *     device sbprt_ctx_create fails with SBPRT_ERR_BACKEND and sbprt_ctx_last_error(NULL)
 *     starts with "no CUDA device".
 *   - Attention supports head sizes d <= 256 (a larger d gives SBPRT_ERR_INVALID), and
 *     b and hq (forward, pass 1) or hkv (dk/dv pass) up to 65535.
 *   - Determinism: no kernel uses float atomics; every reduction has a fixed partition and
 *     order, so results are bitwise identical run to run on one device (cuBLAS GEMMs
 *     included, for a given GPU model and library version).  They are not bitwise equal to
 *     the CPU backend's (different summation orders, FMA contraction, math library):
 *     tests/gpu holds every kernel to 1e-5 normalised relative error against its CPU twin
 *     (1e-3 for TF32 GEMMs, 1e-2 for the bf16 entry points, whose twins are
 *     runtime/cpu/bf16.c).  The embedding backward adds rows in row order like the CPU
 *     twin and is bitwise equal to it. */

/* ---- preference / RL objectives (runtime/cpu/objectives.c, runtime/cuda/objectives.cu) --
 * What the DPO and GRPO objectives add at the LM head (passes/train/objective_pref.c): the
 * per-token log-probability of the label comes from sbprt_label_logprob_forward; these turn a
 * gradient by it into dlogits, and compute GRPO's per-token loss and its derivative. */

/* dlogits as the gradient of Σ_r dlogp[r]·logp[r], WRITTEN: for each row r with a scored
 * label, dlogits[r, :] = dlogp[r] * (onehot(labels[r]) - softmax(logits[r])); rows labelled
 * SBPRT_IGNORE_INDEX get 0.  lse: each row's logsumexp from sbprt_label_logprob_forward, or
 * NULL (computed here).  dlogits may alias logits (the gradient then overwrites the logits
 * row by row, as with the fused cross-entropy).  Any other label gives SBPRT_ERR_RANGE.
 *   dlogits: [n, v]    dlogp: [n]    logits: [n, v]    labels: [n]    lse: [n] */
int sbprt_label_logprob_grad(sbprt_ctx *ctx, float *dlogits, const float *dlogp,
                             const float *logits, const int32_t *labels, const float *lse,
                             int n, int v);

/* GRPO's per-token loss (clipped policy ratio plus the k3 estimate of the KL divergence to a
 * reference policy) and its derivative by the token's log-probability.  Row i < n is token
 * r = r0 + i of the batch, in sequence s = r / seq_len.  For each row with a scored label:
 *   lp = logp[i],  old = old_logp ? old_logp[r] : lp,  ratio = exp(lp - old),
 *   A = advantages[s],  w = row_weight[s],  d = ref_logp[r] - lp,
 *   l = -min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon) * A) + beta * (exp(d) - d - 1),
 *   loss_sum[0] += Σ_i w * l   (in double, in row order);
 *   dlogp[i] = w * dl/dlp = w * (g - beta * (exp(d) - 1)),  g = -A * ratio where the unclipped
 *              term is the minimum or ratio is in [1 - epsilon, 1 + epsilon], else 0;
 * rows labelled SBPRT_IGNORE_INDEX add 0 and get dlogp 0.  old_logp NULL is on-policy: old is
 * lp itself, not differentiated (ratio 1 in value, its gradient that of lp).  With beta == 0
 * the KL term is left out and ref_logp is not read (may be NULL).  dlogp may be NULL (the loss
 * only).  Requires seq_len > 0, r0 >= 0.
 *   loss_sum: [1]    dlogp, logp, labels: [n]    old_logp, ref_logp: [r0 + n] (read at r0 + i)
 *   advantages, row_weight: [(r0 + n - 1) / seq_len + 1] */
int sbprt_grpo_token_loss(sbprt_ctx *ctx, float *loss_sum, float *dlogp, const float *logp,
                          const int32_t *labels, const float *old_logp, const float *ref_logp,
                          const float *advantages, const float *row_weight, int n, int r0,
                          int seq_len, float beta, float epsilon);

/* ---- bf16 mixed precision (sbpc --precision bf16; runtime/cuda/, runtime/cpu/bf16.c) --
 * A bf16 step keeps its parameters, their gradients and the optimizer state in fp32 (the
 * "master weights") and stores activations and activation gradients as bfloat16: the upper
 * 16 bits of an IEEE fp32 (8-bit exponent, 7-bit mantissa, ~3 significant digits).  The
 * functions below are the fp32 ones with the ACTIVATION operands typed sbprt_bf16 (a distinct
 * type, so a float buffer passed by mistake is a compile-time warning) and everything else as
 * before: parameters (gamma, beta, bias, embedding tables), parameter gradients (dgamma,
 * dbeta, dbias, dtable, a GEMM's C when it is a weight gradient: *_f32 variants), statistics
 * (mean, rstd, lse) and loss sums stay float.  Semantics are exactly the fp32 function's
 * applied to the bf16 values converted to fp32: every kernel converts on load, computes and
 * accumulates in fp32 (reductions as in fp32: double where the fp32 kernel uses double), and
 * rounds each bf16 output once, to nearest even (NaN stays NaN); an accumulating output
 * (dx +=) is read, added to in fp32 and rounded back.  GEMMs are cuBLAS with bf16 A and B,
 * fp32 accumulation (CUBLAS_COMPUTE_32F) and alpha/beta in fp32; C bf16 or fp32.  The CPU
 * backend implements every one of them as that definition (convert to fp32 temporaries, call
 * its fp32 kernel, round): the reference twin of the CUDA kernels (tests/gpu, 1e-2 relative).
 * Aliasing, NULL and size rules are those of the fp32 function.  Element counts and leading
 * dimensions are in elements, as for fp32. */

typedef struct sbprt_bf16 {
    uint16_t bits; /* the upper half of an fp32's bits */
} sbprt_bf16;

/* dst[i] = bf16(src[i]) (round to nearest even) and dst[i] = (float)src[i] (exact).
 *   dst, src: [n] */
int sbprt_convert_f32_to_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const float *src, size_t n);
int sbprt_convert_bf16_to_f32(sbprt_ctx *ctx, float *dst, const sbprt_bf16 *src, size_t n);

/* sbprt_gemm with bf16 a, b and c; the _f32 form writes (beta = 1: accumulates into) an fp32
 * c, e.g. a weight gradient in the fp32 gradient block.  Shapes as sbprt_gemm. */
int sbprt_gemm_bf16(sbprt_ctx *ctx, sbprt_bf16 *c, const sbprt_bf16 *a, const sbprt_bf16 *b,
                    int trans_a, int trans_b, int m, int n, int k, float alpha, float beta);
int sbprt_gemm_bf16_f32(sbprt_ctx *ctx, float *c, const sbprt_bf16 *a, const sbprt_bf16 *b,
                        int trans_a, int trans_b, int m, int n, int k, float alpha, float beta);
/* y: [n, c] bf16    bias: [c] fp32 */
int sbprt_bias_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const float *bias, int n, int c);
/* dbias: [c] fp32 (summed in fp32)    dy: [n, c] bf16 */
int sbprt_bias_backward_bf16(sbprt_ctx *ctx, float *dbias, const sbprt_bf16 *dy, int n, int c);
int sbprt_add_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a, const sbprt_bf16 *b,
                   size_t n);
int sbprt_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *y, const sbprt_bf16 *x, size_t n);
/* out, x (dx, dy): bf16; alpha and divisor fp32 */
int sbprt_scale_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n, float alpha);
int sbprt_scale_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dy, size_t n,
                                float alpha);
int sbprt_div_scalar_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n,
                          float divisor);
int sbprt_div_scalar_accumulate_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dy,
                                     size_t n, float divisor);
/* out: [n, c] bf16    table: [v, c] fp32 */
int sbprt_embedding_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const float *table,
                                 const int32_t *ids, int n, int v, int c);
/* The same lookup from a table kept as bf16 (a frozen embedding, sbpc --base-precision bf16):
 * out[r, :] = table[ids[r], :] copied exactly (the bf16 value, as a GEMM reads the same table),
 * so it equals sbprt_embedding_forward_bf16 on the fp32 table those bf16 values widen to.
 *   out: [n, c] bf16    table: [v, c] bf16 */
int sbprt_embedding_forward_bf16_table(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *table,
                                       const int32_t *ids, int n, int v, int c);
/* dtable: [v, c] fp32    dout: [n, c] bf16 */
int sbprt_embedding_backward_bf16(sbprt_ctx *ctx, float *dtable, const sbprt_bf16 *dout,
                                  const int32_t *ids, int n, int v, int c);
/* out, x: bf16; mean, rstd, gamma, beta: fp32 */
int sbprt_layernorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *mean, float *rstd,
                                 const sbprt_bf16 *x, const float *gamma, const float *beta,
                                 int n, int c, float eps);
/* dx, dout, x: bf16; dgamma, dbeta, gamma, mean, rstd: fp32 */
int sbprt_layernorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma, float *dbeta,
                                  const sbprt_bf16 *dout, const sbprt_bf16 *x,
                                  const float *gamma, const float *mean, const float *rstd,
                                  int n, int c);
int sbprt_rmsnorm_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *rstd,
                               const sbprt_bf16 *x, const float *gamma, int n, int c, float eps);
int sbprt_rmsnorm_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, float *dgamma,
                                const sbprt_bf16 *dout, const sbprt_bf16 *x, const float *gamma,
                                const float *rstd, int n, int c);
int sbprt_gelu_tanh_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n);
int sbprt_gelu_tanh_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                  const sbprt_bf16 *x, size_t n);
int sbprt_gelu_erf_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n);
int sbprt_gelu_erf_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                 const sbprt_bf16 *x, size_t n);
int sbprt_silu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n);
int sbprt_silu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *x, size_t n);
int sbprt_relu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n);
int sbprt_relu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *x, size_t n);
int sbprt_tanh_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, size_t n);
/* y: the forward's output, as sbprt_tanh_backward */
int sbprt_tanh_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const sbprt_bf16 *y, size_t n);
int sbprt_swiglu_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *gate,
                              const sbprt_bf16 *up, size_t n);
int sbprt_swiglu_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dgate, sbprt_bf16 *dup,
                               const sbprt_bf16 *dout, const sbprt_bf16 *gate,
                               const sbprt_bf16 *up, size_t n);
/* out, x (dx, dout): bf16; cos_tab, sin_tab: fp32 */
int sbprt_rope_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x,
                            const int32_t *pos, const float *cos_tab, const float *sin_tab,
                            int rows, int heads, int head_dim, int rot_dim, int max_pos);
int sbprt_rope_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                             const int32_t *pos, const float *cos_tab, const float *sin_tab,
                             int rows, int heads, int head_dim, int rot_dim, int max_pos);
/* q, k, v, out (and their gradients): bf16; lse: fp32.  Scores, the online softmax and the
 * accumulators are fp32 as in the fp32 kernel. */
int sbprt_attention_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                 const sbprt_bf16 *q, const sbprt_bf16 *k, const sbprt_bf16 *v,
                                 int b, int t, int tk, int hq, int hkv, int d, int q_start,
                                 float scale);
int sbprt_attention_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                  sbprt_bf16 *dv, const sbprt_bf16 *dout, const sbprt_bf16 *q,
                                  const sbprt_bf16 *k, const sbprt_bf16 *v,
                                  const sbprt_bf16 *out, const float *lse, int b, int t, int tk,
                                  int hq, int hkv, int d, int q_start, float scale);
int sbprt_attention_forward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                    const sbprt_bf16 *q, const sbprt_bf16 *k,
                                    const sbprt_bf16 *v, int b, int t, int tk, int hq, int hkv,
                                    int d, int q_start, float scale, int window, float softcap);
int sbprt_attention_backward_ex_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                     sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                     const sbprt_bf16 *q, const sbprt_bf16 *k,
                                     const sbprt_bf16 *v, const sbprt_bf16 *out,
                                     const float *lse, int b, int t, int tk, int hq, int hkv,
                                     int d, int q_start, float scale, int window,
                                     float softcap);
/* doc_start: [b, tk] int32, as sbprt_attention_forward_packed */
int sbprt_attention_forward_packed_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, float *lse,
                                        const sbprt_bf16 *q, const sbprt_bf16 *k,
                                        const sbprt_bf16 *v, const int32_t *doc_start, int b,
                                        int t, int tk, int hq, int hkv, int d, int q_start,
                                        float scale, int window, float softcap);
int sbprt_attention_backward_packed_bf16(sbprt_ctx *ctx, sbprt_bf16 *dq, sbprt_bf16 *dk,
                                         sbprt_bf16 *dv, const sbprt_bf16 *dout,
                                         const sbprt_bf16 *q, const sbprt_bf16 *k,
                                         const sbprt_bf16 *v, const sbprt_bf16 *out,
                                         const float *lse, const int32_t *doc_start, int b,
                                         int t, int tk, int hq, int hkv, int d, int q_start,
                                         float scale, int window, float softcap);
/* logits, dlogits: bf16; loss_sum: fp32 (the row's logsumexp and loss in fp32) */
int sbprt_cross_entropy_forward_backward_bf16(sbprt_ctx *ctx, float *loss_sum,
                                              sbprt_bf16 *dlogits, const sbprt_bf16 *logits,
                                              const int32_t *labels, int n, int v, float scale);
int sbprt_permute_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x, int rank,
                               const int *dims, const int *perm);
int sbprt_permute_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                int rank, const int *dims, const int *perm);
int sbprt_copy_cols_bf16(sbprt_ctx *ctx, sbprt_bf16 *dst, const sbprt_bf16 *src, int rows,
                         int w, int dst_ld, int dst_off, int src_ld, int src_off,
                         int accumulate);
int sbprt_broadcast_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *a,
                                 const sbprt_bf16 *b, int op, int rank, const int *dims,
                                 const int *a_dims, const int *b_dims);
int sbprt_broadcast_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *da, sbprt_bf16 *db,
                                  const sbprt_bf16 *dout, const sbprt_bf16 *a,
                                  const sbprt_bf16 *b, int op, int rank, const int *dims,
                                  const int *a_dims, const int *b_dims);

#ifdef __cplusplus
}
#endif

#endif /* SBPRT_H */
