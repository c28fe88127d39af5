/*
 * test_rope.c — rotary position embedding (rotate-half), full and partial rotary, forward
 * and backward, against a double reference and finite differences; in-place forward;
 * out-of-range positions.
 */
#include "rt_test.h"

#define ROWS 23
#define HEADS 3
#define HD 16
#define MAXPOS 40

/* Hugging Face's table: inv_freq_i = theta^(-2i/rot), angle = pos * inv_freq, and the table
 * row is cat(angles, angles), so entries i and i + rot/2 are equal. */
static void make_tables(float *cs, float *sn, int rot)
{
    for (int p = 0; p < MAXPOS; p++)
        for (int i = 0; i < rot; i++) {
            double f = pow(10000.0, -2.0 * (i % (rot / 2)) / rot);
            cs[p * rot + i] = (float)cos(p * f);
            sn[p * rot + i] = (float)sin(p * f);
        }
}

static void ref_rope(double *out, const double *x, const int32_t *pos, const float *cs,
                     const float *sn, int rot)
{
    int half = rot / 2;
    for (int r = 0; r < ROWS; r++)
        for (int h = 0; h < HEADS; h++) {
            const double *xh = x + (r * HEADS + h) * HD;
            double *yh = out + (r * HEADS + h) * HD;
            const float *c = cs + pos[r] * rot, *s = sn + pos[r] * rot;
            for (int i = 0; i < HD; i++) {
                if (i >= rot)
                    yh[i] = xh[i];
                else if (i < half) /* rotate_half(x)[i] = -x[i + half] */
                    yh[i] = xh[i] * c[i] - xh[i + half] * s[i];
                else /* rotate_half(x)[i] = x[i - half] */
                    yh[i] = xh[i] * c[i] + xh[i - half] * s[i];
            }
        }
}

typedef struct {
    const int32_t *pos;
    const float *cs, *sn;
    int rot;
    const double *w;
    double *x, *out;
} rope_fd;

static double rope_f(void *p)
{
    rope_fd *s = p;
    ref_rope(s->out, s->x, s->pos, s->cs, s->sn, s->rot);
    double f = 0;
    for (int i = 0; i < ROWS * HEADS * HD; i++)
        f += s->w[i] * s->out[i];
    return f;
}

static void check_rope(int rot)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {41 + rot};
    const int n = ROWS * HEADS * HD;
    float *cs = RT_NEW(float, MAXPOS * rot), *sn = RT_NEW(float, MAXPOS * rot);
    make_tables(cs, sn, rot);
    int32_t pos[ROWS];
    for (int i = 0; i < ROWS; i++)
        pos[i] = rt_randint(&r, MAXPOS);
    pos[0] = 0, pos[1] = MAXPOS - 1;
    float *x = rt_random(&r, n, -1, 1), *out = RT_NEW(float, n);
    double *xd = rt_to_double(x, n), *ref = RT_NEW(double, n);
    ref_rope(ref, xd, pos, cs, sn, rot);
    rt_assert_ok(sbprt_rope_forward(ctx, out, x, pos, cs, sn, ROWS, HEADS, HD, rot, MAXPOS));
    rt_assert_err(rt_rel_err(out, ref, n), RT_TOL, "rope fwd");
    float *inplace = rt_copy(x, n);
    rt_assert_ok(
        sbprt_rope_forward(ctx, inplace, inplace, pos, cs, sn, ROWS, HEADS, HD, rot, MAXPOS));
    assert_memory_equal(inplace, out, n * sizeof(float));

    /* backward: the adjoint, (Rᵀ g)_k = Σ_i g_i ∂out_i/∂x_k, built from the reference rows */
    float *dy = rt_random(&r, n, -1, 1), *dx = rt_random(&r, n, -1, 1), *dx0 = rt_copy(dx, n);
    rt_assert_ok(sbprt_rope_backward(ctx, dx, dy, pos, cs, sn, ROWS, HEADS, HD, rot, MAXPOS));
    double *rdx = RT_NEW(double, n), *e = RT_NEW(double, n), *col = RT_NEW(double, n);
    for (int k = 0; k < n; k++) { /* the linear map's column k is R e_k */
        memset(e, 0, n * sizeof(double));
        e[k] = 1;
        ref_rope(col, e, pos, cs, sn, rot);
        double s = 0;
        int base = k / HD * HD; /* only the same head vector is touched */
        for (int i = base; i < base + HD; i++)
            s += dy[i] * col[i];
        rdx[k] = s;
    }
    rt_assert_err(rt_rel_err_delta(dx, dx0, rdx, n), RT_TOL, "rope bwd");
    rope_fd st = {pos, cs, sn, rot, rt_to_double(dy, n), xd, RT_NEW(double, n)};
    rt_assert_err(rt_fd_check(rope_f, NULL, &st, xd, n, dx, dx0, n), RT_TOL, "rope bwd fd");

    /* positions outside the table */
    pos[5] = MAXPOS;
    assert_int_equal(sbprt_rope_forward(ctx, out, x, pos, cs, sn, ROWS, HEADS, HD, rot, MAXPOS),
                     SBPRT_ERR_RANGE);
    pos[5] = -1;
    assert_int_equal(sbprt_rope_backward(ctx, dx, dy, pos, cs, sn, ROWS, HEADS, HD, rot, MAXPOS),
                     SBPRT_ERR_RANGE);
    pos[5] = 0;
    assert_int_equal(sbprt_rope_forward(ctx, out, x, pos, cs, sn, ROWS, HEADS, HD, rot + 1, MAXPOS),
                     SBPRT_ERR_INVALID); /* odd rot_dim */

    free((void *)st.w), free(st.out);
    free(cs), free(sn), free(x), free(out), free(xd), free(ref), free(inplace), free(dy),
        free(dx), free(dx0), free(rdx), free(e), free(col);
    sbprt_ctx_destroy(ctx);
}

static void test_rope_full(void **state)
{
    (void)state;
    check_rope(HD);
}

static void test_rope_partial(void **state)
{
    (void)state;
    check_rope(HD / 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_full),
        cmocka_unit_test(test_rope_partial),
    };
    return cmocka_run_group_tests_name("runtime_rope", tests, NULL, NULL);
}
