/*
 * rope.c — rotary position embedding, rotate-half convention, forward and backward.
 *
 * The rotation acts on pairs (i, i + half) of each head vector; both elements of a pair
 * are read before either is written, which is what makes the forward safe in place.  The
 * backward applies the transposed rotation — the inverse rotation when the table holds
 * true cos/sin values, but written as the transpose so it stays the exact adjoint of the
 * forward for any table contents (e.g. a scaled table).
 */
#include <string.h>

#include "cpu.h"

static int rope_check(const void *out, const void *x, const int32_t *pos, const float *cos_tab,
                      const float *sin_tab, int rows, int heads, int head_dim, int rot_dim,
                      int max_pos)
{
    if (rows < 0 || heads < 0 || head_dim < 0 || max_pos < 0 || rot_dim < 0 ||
        rot_dim > head_dim || rot_dim % 2 != 0)
        return SBPRT_ERR_INVALID;
    if (rows == 0)
        return SBPRT_OK;
    if (!out || !x || !pos || (rot_dim > 0 && (!cos_tab || !sin_tab)))
        return SBPRT_ERR_INVALID;
    for (int r = 0; r < rows; r++)
        if (pos[r] < 0 || pos[r] >= max_pos)
            return SBPRT_ERR_RANGE;
    return SBPRT_OK;
}

int sbprt_rope_forward(sbprt_ctx *ctx, float *out, const float *x, const int32_t *pos,
                       const float *cos_tab, const float *sin_tab, int rows, int heads,
                       int head_dim, int rot_dim, int max_pos)
{
    CPU_CHECK(ctx);
    int st = rope_check(out, x, pos, cos_tab, sin_tab, rows, heads, head_dim, rot_dim, max_pos);
    if (st || rows == 0)
        return st;
    int half = rot_dim / 2;
    size_t row_len = (size_t)heads * head_dim;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (rows * row_len >= CPU_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        const float *cs = cos_tab + (size_t)pos[r] * rot_dim;
        const float *sn = sin_tab + (size_t)pos[r] * rot_dim;
        for (int h = 0; h < heads; h++) {
            const float *xh = x + r * row_len + (size_t)h * head_dim;
            float *yh = out + r * row_len + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                float x1 = xh[i], x2 = xh[i + half];
                yh[i] = x1 * cs[i] - x2 * sn[i];
                yh[i + half] = x2 * cs[i + half] + x1 * sn[i + half];
            }
            if (yh != xh && rot_dim < head_dim)
                memcpy(yh + rot_dim, xh + rot_dim, (size_t)(head_dim - rot_dim) * sizeof(float));
        }
    }
    return SBPRT_OK;
}

int sbprt_rope_backward(sbprt_ctx *ctx, float *dx, const float *dout, const int32_t *pos,
                        const float *cos_tab, const float *sin_tab, int rows, int heads,
                        int head_dim, int rot_dim, int max_pos)
{
    CPU_CHECK(ctx);
    int st = rope_check(dx, dout, pos, cos_tab, sin_tab, rows, heads, head_dim, rot_dim,
                        max_pos);
    if (st || rows == 0)
        return st;
    int half = rot_dim / 2;
    size_t row_len = (size_t)heads * head_dim;
#pragma omp parallel for schedule(static) num_threads(ctx->nthreads) \
    if (rows * row_len >= CPU_PARALLEL_MIN)
    for (int r = 0; r < rows; r++) {
        const float *cs = cos_tab + (size_t)pos[r] * rot_dim;
        const float *sn = sin_tab + (size_t)pos[r] * rot_dim;
        for (int h = 0; h < heads; h++) {
            const float *gh = dout + r * row_len + (size_t)h * head_dim;
            float *dh = dx + r * row_len + (size_t)h * head_dim;
            for (int i = 0; i < half; i++) {
                float g1 = gh[i], g2 = gh[i + half];
                dh[i] += g1 * cs[i] + g2 * sn[i + half];
                dh[i + half] += g2 * cs[i + half] - g1 * sn[i];
            }
            for (int i = rot_dim; i < head_dim; i++)
                dh[i] += gh[i];
        }
    }
    return SBPRT_OK;
}
