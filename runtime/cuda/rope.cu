/*
 * rope.cu — rotary position embedding, rotate-half convention, forward and backward.
 *
 * One thread per element slot e of a head vector (rows × heads × head_dim slots): a slot
 * e < half owns the pair (e, e + half) and writes both after reading both, which keeps the
 * forward safe in place; slots in [half, rot_dim) have nothing to do; slots from rot_dim on
 * pass their element through.  Formulas as in the CPU twin (cpu/rope.c), the backward being
 * the transposed rotation.  A position outside [0, max_pos) skips the row and raises the
 * index-error flag that sbprt_sync reports.  The bf16 entry points are the same kernel on
 * cu_bf16 elements (fp32 arithmetic, fp32 tables, one rounding per output).
 */
#include "cuda.h"

#define ROPE_THREADS 256

template <class T>
__global__ void rope_kernel(int backward, T *out, const T *x, const int32_t *pos,
                            const float *cos_tab, const float *sin_tab, int rows, int heads,
                            int head_dim, int rot_dim, int max_pos, int *flag)
{
    const size_t total = (size_t)rows * heads * head_dim;
    const int half = rot_dim / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(e % head_dim);
        const size_t head = e / head_dim; /* (row, head) index */
        const int r = (int)(head / heads);
        const int p = pos[r];
        if (p < 0 || p >= max_pos) {
            if (i == 0)
                cu_flag_range(flag);
            continue;
        }
        const T *xh = x + head * head_dim;
        T *yh = out + head * head_dim;
        if (i < half) {
            const float *cs = cos_tab + (size_t)p * rot_dim;
            const float *sn = sin_tab + (size_t)p * rot_dim;
            const float x1 = xh[i], x2 = xh[i + half];
            if (!backward) {
                yh[i] = x1 * cs[i] - x2 * sn[i];
                yh[i + half] = x2 * cs[i + half] + x1 * sn[i + half];
            } else {
                yh[i] += x1 * cs[i] + x2 * sn[i + half];
                yh[i + half] += x2 * cs[i + half] - x1 * sn[i];
            }
        } else if (i >= rot_dim) {
            if (backward)
                yh[i] += xh[i];
            else if (yh != xh)
                yh[i] = xh[i];
        }
    }
}

template <class T>
static int rope_run(sbprt_ctx *ctx, int backward, T *out, const T *x, const int32_t *pos,
                    const float *cos_tab, const float *sin_tab, int rows, int heads, int head_dim,
                    int rot_dim, int max_pos)
{
    CU_CHECK(ctx);
    CU_CHECK(rows >= 0 && heads >= 0 && head_dim >= 0 && max_pos >= 0 && rot_dim >= 0 &&
             rot_dim <= head_dim && rot_dim % 2 == 0);
    if (rows == 0)
        return SBPRT_OK;
    CU_CHECK(out && x && pos && (rot_dim == 0 || (cos_tab && sin_tab)));
    const size_t total = (size_t)rows * heads * head_dim;
    if (total == 0)
        return SBPRT_OK; /* (the CPU twin still checks the positions here) */
    CU_LAUNCH(ctx, rope_kernel<T>, cu_blocks(total, ROPE_THREADS), ROPE_THREADS, 0, backward, out,
              x, pos, cos_tab, sin_tab, rows, heads, head_dim, rot_dim, max_pos, ctx->dev_flag);
    return SBPRT_OK;
}

extern "C" int sbprt_rope_forward(sbprt_ctx *ctx, float *out, const float *x, const int32_t *pos,
                                  const float *cos_tab, const float *sin_tab, int rows, int heads,
                                  int head_dim, int rot_dim, int max_pos)
{
    return rope_run(ctx, 0, out, x, pos, cos_tab, sin_tab, rows, heads, head_dim, rot_dim,
                    max_pos);
}

extern "C" int sbprt_rope_backward(sbprt_ctx *ctx, float *dx, const float *dout,
                                   const int32_t *pos, const float *cos_tab, const float *sin_tab,
                                   int rows, int heads, int head_dim, int rot_dim, int max_pos)
{
    return rope_run(ctx, 1, dx, dout, pos, cos_tab, sin_tab, rows, heads, head_dim, rot_dim,
                    max_pos);
}

extern "C" int sbprt_rope_forward_bf16(sbprt_ctx *ctx, sbprt_bf16 *out, const sbprt_bf16 *x,
                                       const int32_t *pos, const float *cos_tab,
                                       const float *sin_tab, int rows, int heads, int head_dim,
                                       int rot_dim, int max_pos)
{
    return rope_run(ctx, 0, cu_bf(out), cu_bf(x), pos, cos_tab, sin_tab, rows, heads, head_dim,
                    rot_dim, max_pos);
}

extern "C" int sbprt_rope_backward_bf16(sbprt_ctx *ctx, sbprt_bf16 *dx, const sbprt_bf16 *dout,
                                        const int32_t *pos, const float *cos_tab,
                                        const float *sin_tab, int rows, int heads, int head_dim,
                                        int rot_dim, int max_pos)
{
    return rope_run(ctx, 1, cu_bf(dx), cu_bf(dout), pos, cos_tab, sin_tab, rows, heads, head_dim,
                    rot_dim, max_pos);
}
