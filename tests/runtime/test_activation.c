/*
 * test_activation.c — GELU (tanh and erf forms), SiLU, ReLU, tanh, sigmoid and the SwiGLU product,
 * forward and backward, against double formulas and finite differences of those formulas.
 * ReLU's backward is also run on the forward's output (the same mask), tanh's takes the
 * forward's output by definition.
 */
#include "rt_test.h"

#define N 20000       /* above the kernels' parallel threshold */
#define FD_POINTS N   /* finite-difference checks per gradient: all of them */

static double ref_gelu_tanh(double x)
{
    const double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}
static double ref_gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_relu(double x) { return x > 0 ? x : 0; }

/* Analytic derivatives, written independently of the kernels' code. */
static double ref_gelu_tanh_grad(double x)
{
    const double k = sqrt(2.0 / 3.14159265358979323846);
    double t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
static double ref_gelu_erf_grad(double x)
{
    return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * 3.14159265358979323846);
}
static double ref_silu_grad(double x)
{
    double s = 1 / (1 + exp(-x));
    return s * (1 + x * (1 - s));
}
static double ref_relu_grad(double x) { return x > 0 ? 1 : 0; }
static double ref_tanh_grad(double x)
{
    double c = cosh(x);
    return 1 / (c * c);
}

typedef int (*fwd_fn)(sbprt_ctx *, float *, const float *, size_t);
typedef int (*bwd_fn)(sbprt_ctx *, float *, const float *, const float *, size_t);

/* f(x) = Σ w_i act(x_i) for the finite differences, summed over [lo, hi) only: element i
 * influences term i alone (see rt_focus_fn). */
typedef struct {
    double (*act)(double);
    const double *w;
    double *x;
    size_t lo, hi;
} act_fd;

static double act_f(void *p)
{
    act_fd *s = p;
    double f = 0;
    for (size_t i = s->lo; i < s->hi; i++)
        f += s->w[i] * s->act(s->x[i]);
    return f;
}

static void act_focus(void *p, size_t i)
{
    act_fd *s = p;
    s->lo = i, s->hi = i + 1;
}

static void check_unary(fwd_fn fwd, bwd_fn bwd, double (*act)(double), double (*grad)(double),
                        const char *name)
{
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {11};
    float *x = rt_random(&r, N, -5, 5), *y = RT_NEW(float, N);
    double *ref = RT_NEW(double, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = act(x[i]);
    rt_assert_ok(fwd(ctx, y, x, N));
    rt_assert_err(rt_rel_err(y, ref, N), RT_TOL, name);
    float *inplace = rt_copy(x, N); /* forward may run in place */
    rt_assert_ok(fwd(ctx, inplace, inplace, N));
    assert_memory_equal(inplace, y, N * sizeof(float));

    float *dy = rt_random(&r, N, -1, 1);
    float *dx = rt_random(&r, N, -1, 1), *dx0 = rt_copy(dx, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = dy[i] * grad(x[i]);
    rt_assert_ok(bwd(ctx, dx, dy, x, N));
    rt_assert_err(rt_rel_err_delta(dx, dx0, ref, N), RT_TOL, name);
    act_fd st = {act, rt_to_double(dy, N), rt_to_double(x, N), 0, N};
    rt_assert_err(rt_fd_check(act_f, act_focus, &st, st.x, N, dx, dx0, FD_POINTS), RT_TOL, name);

    free((void *)st.w), free(st.x);
    free(x), free(y), free(ref), free(inplace), free(dy), free(dx), free(dx0);
    sbprt_ctx_destroy(ctx);
}

static void test_gelu_tanh(void **state)
{
    (void)state;
    check_unary(sbprt_gelu_tanh_forward, sbprt_gelu_tanh_backward, ref_gelu_tanh,
                ref_gelu_tanh_grad, "gelu_tanh");
}

static void test_gelu_erf(void **state)
{
    (void)state;
    check_unary(sbprt_gelu_erf_forward, sbprt_gelu_erf_backward, ref_gelu_erf, ref_gelu_erf_grad,
                "gelu_erf");
}

static void test_silu(void **state)
{
    (void)state;
    check_unary(sbprt_silu_forward, sbprt_silu_backward, ref_silu, ref_silu_grad, "silu");
}

/* ReLU: the finite differences need no input near the kink at 0 (a central difference across
 * it is the mean of the two slopes); inputs within 1e-3 of 0 are moved away. */
static void test_relu(void **state)
{
    (void)state;
    check_unary(sbprt_relu_forward, sbprt_relu_backward, ref_relu, ref_relu_grad, "relu");

    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {13};
    float *x = rt_random(&r, N, -5, 5), *y = RT_NEW(float, N);
    for (size_t i = 0; i < N; i++)
        if (fabsf(x[i]) < 1e-3f)
            x[i] = 0.5f;
    x[0] = 0.0f; /* the derivative at 0 is 0, as torch's */
    x[1] = -0.0f;
    x[2] = NAN;  /* propagated, not hidden as 0 */
    rt_assert_ok(sbprt_relu_forward(ctx, y, x, N));
    assert_true(y[0] == 0.0f && y[1] == 0.0f && isnan(y[2]));
    /* the backward reads the same mask from the output as from the input */
    float *dy = rt_random(&r, N, -1, 1);
    dy[3] = NAN; /* a NaN gradient where the unit is off adds nothing */
    x[3] = -1.0f;
    y[3] = 0.0f;
    float *dx_in = rt_random(&r, N, -1, 1), *dx_out = rt_copy(dx_in, N), *dx0 = rt_copy(dx_in, N);
    rt_assert_ok(sbprt_relu_backward(ctx, dx_in, dy, x, N));
    rt_assert_ok(sbprt_relu_backward(ctx, dx_out, dy, y, N));
    assert_memory_equal(dx_in, dx_out, N * sizeof(float));
    assert_true(dx_in[0] == dx0[0] && dx_in[2] == dx0[2] && dx_in[3] == dx0[3]);
    for (size_t i = 4; i < N; i++)
        assert_true(dx_in[i] == (x[i] > 0 ? dx0[i] + dy[i] : dx0[i]));
    free(x), free(y), free(dy), free(dx_in), free(dx_out), free(dx0);
    sbprt_ctx_destroy(ctx);
}

/* tanh: the backward takes the forward's output y; the reference derivative is written in x
 * (1 / cosh²), so the check covers the identity 1 - tanh² = sech² the kernel relies on. */
static void test_tanh(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {14};
    float *x = rt_random(&r, N, -5, 5), *y = RT_NEW(float, N);
    double *ref = RT_NEW(double, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = tanh(x[i]);
    rt_assert_ok(sbprt_tanh_forward(ctx, y, x, N));
    rt_assert_err(rt_rel_err(y, ref, N), RT_TOL, "tanh");
    float *inplace = rt_copy(x, N);
    rt_assert_ok(sbprt_tanh_forward(ctx, inplace, inplace, N));
    assert_memory_equal(inplace, y, N * sizeof(float));

    float *dy = rt_random(&r, N, -1, 1);
    float *dx = rt_random(&r, N, -1, 1), *dx0 = rt_copy(dx, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = dy[i] * ref_tanh_grad(x[i]);
    rt_assert_ok(sbprt_tanh_backward(ctx, dx, dy, y, N));
    rt_assert_err(rt_rel_err_delta(dx, dx0, ref, N), RT_TOL, "tanh backward");
    act_fd st = {tanh, rt_to_double(dy, N), rt_to_double(x, N), 0, N};
    rt_assert_err(rt_fd_check(act_f, act_focus, &st, st.x, N, dx, dx0, FD_POINTS), RT_TOL,
                  "tanh backward fd");
    free((void *)st.w), free(st.x);
    free(x), free(y), free(ref), free(inplace), free(dy), free(dx), free(dx0);
    sbprt_ctx_destroy(ctx);
}

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* sigmoid: the backward takes the forward's output y (dy * y (1 - y)).  Past x < -88.7,
 * 1 / (1 + e^-x) in float flushes to 0; the kernel's e^x / (1 + e^x) form must keep those
 * values, each within float rounding of the double one. */
static void test_sigmoid(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {15};
    float *x = rt_random(&r, N, -12, 12), *y = RT_NEW(float, N);
    double *ref = RT_NEW(double, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = ref_sigmoid(x[i]);
    rt_assert_ok(sbprt_sigmoid_forward(ctx, y, x, N));
    rt_assert_err(rt_rel_err(y, ref, N), RT_TOL, "sigmoid");

    /* -100 .. -89: subnormal results (the spacing there is 2^-149 = 1.4e-45); -87, -80:
     * normal ones, to float rounding */
    float tail[6] = {-100.0f, -95.0f, -89.0f, -87.0f, -80.0f, 60.0f}, ty[6];
    rt_assert_ok(sbprt_sigmoid_forward(ctx, ty, tail, 6));
    for (int i = 0; i < 6; i++) {
        double want = ref_sigmoid(tail[i]);
        assert_true(ty[i] > 0.0f);
        assert_true(fabs(ty[i] - want) <= 1e-6 * want + 1.5e-45);
    }

    float *dy = rt_random(&r, N, -1, 1);
    float *dx = rt_random(&r, N, -1, 1), *dx0 = rt_copy(dx, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = dy[i] * ref_sigmoid(x[i]) * (1.0 - ref_sigmoid(x[i]));
    rt_assert_ok(sbprt_sigmoid_backward(ctx, dx, dy, y, N));
    rt_assert_err(rt_rel_err_delta(dx, dx0, ref, N), RT_TOL, "sigmoid backward");
    act_fd st = {ref_sigmoid, rt_to_double(dy, N), rt_to_double(x, N), 0, N};
    rt_assert_err(rt_fd_check(act_f, act_focus, &st, st.x, N, dx, dx0, FD_POINTS), RT_TOL,
                  "sigmoid backward fd");
    assert_int_equal(sbprt_sigmoid_forward(ctx, NULL, x, 4), SBPRT_ERR_INVALID);
    free((void *)st.w), free(st.x);
    free(x), free(y), free(ref), free(dy), free(dx), free(dx0);
    sbprt_ctx_destroy(ctx);
}

/* f = Σ w_i silu(gate_i) up_i over [lo, hi), as act_fd. */
typedef struct {
    const double *w;
    double *gate, *up;
    size_t lo, hi;
} swiglu_fd;

static double swiglu_f(void *p)
{
    swiglu_fd *s = p;
    double f = 0;
    for (size_t i = s->lo; i < s->hi; i++)
        f += s->w[i] * ref_silu(s->gate[i]) * s->up[i];
    return f;
}

static void swiglu_focus(void *p, size_t i)
{
    swiglu_fd *s = p;
    s->lo = i, s->hi = i + 1;
}

static void test_swiglu(void **state)
{
    (void)state;
    sbprt_ctx *ctx = rt_ctx(2);
    rt_rng r = {12};
    float *gate = rt_random(&r, N, -5, 5), *up = rt_random(&r, N, -2, 2);
    float *out = RT_NEW(float, N);
    double *ref = RT_NEW(double, N);
    for (size_t i = 0; i < N; i++)
        ref[i] = ref_silu(gate[i]) * up[i];
    rt_assert_ok(sbprt_swiglu_forward(ctx, out, gate, up, N));
    rt_assert_err(rt_rel_err(out, ref, N), RT_TOL, "swiglu fwd");

    float *dout = rt_random(&r, N, -1, 1);
    float *dg = rt_random(&r, N, -1, 1), *du = rt_random(&r, N, -1, 1);
    float *dg0 = rt_copy(dg, N), *du0 = rt_copy(du, N);
    rt_assert_ok(sbprt_swiglu_backward(ctx, dg, du, dout, gate, up, N));
    for (size_t i = 0; i < N; i++)
        ref[i] = dout[i] * up[i] * ref_silu_grad(gate[i]);
    rt_assert_err(rt_rel_err_delta(dg, dg0, ref, N), RT_TOL, "swiglu dgate");
    for (size_t i = 0; i < N; i++)
        ref[i] = dout[i] * ref_silu(gate[i]);
    rt_assert_err(rt_rel_err_delta(du, du0, ref, N), RT_TOL, "swiglu dup");

    swiglu_fd st = {rt_to_double(dout, N), rt_to_double(gate, N), rt_to_double(up, N), 0, N};
    rt_assert_err(rt_fd_check(swiglu_f, swiglu_focus, &st, st.gate, N, dg, dg0, FD_POINTS),
                  RT_TOL, "swiglu dgate fd");
    rt_assert_err(rt_fd_check(swiglu_f, swiglu_focus, &st, st.up, N, du, du0, FD_POINTS), RT_TOL,
                  "swiglu dup fd");

    /* NULL gradient outputs are skipped */
    memcpy(du, du0, N * sizeof(float));
    rt_assert_ok(sbprt_swiglu_backward(ctx, NULL, du, dout, gate, up, N));
    rt_assert_err(rt_rel_err_delta(du, du0, ref, N), RT_TOL, "swiglu dup only");

    free((void *)st.w), free(st.gate), free(st.up);
    free(gate), free(up), free(out), free(ref), free(dout), free(dg), free(du), free(dg0),
        free(du0);
    sbprt_ctx_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_tanh),
        cmocka_unit_test(test_gelu_erf),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_tanh),
        cmocka_unit_test(test_sigmoid),
        cmocka_unit_test(test_swiglu),
    };
    return cmocka_run_group_tests_name("runtime_activation", tests, NULL, NULL);
}
