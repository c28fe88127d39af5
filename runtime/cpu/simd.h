/*
 * simd.h — the AVX2/FMA pieces shared by the CPU kernels that have a vector path (attention,
 * the softmax cross-entropy): the run-time CPU check, a vectorised exp and tanh.
 *
 * The library is built for baseline x86-64; functions marked CPU_AVX2 are compiled for
 * AVX2+FMA and called only after cpu_have_avx2() said yes, so the same binary runs on older
 * CPUs through the scalar paths. On other architectures CPU_SIMD is not defined and only the
 * scalar paths exist.
 */
#ifndef SBPRT_CPU_SIMD_H
#define SBPRT_CPU_SIMD_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define CPU_SIMD 1
#define CPU_AVX2 __attribute__((target("avx2,fma")))

/* Whether this CPU has AVX2 and FMA (checked once). */
static inline int cpu_have_avx2(void)
{
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return have;
}

/* exp(x) for x <= 0 (Cephes expf polynomial, about 1 ulp); exactly 0 below -87, so
 * exp(-inf) = 0; NaN propagates. */
CPU_AVX2 static inline __m256 cpu_exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, p);
}

/* tanh(x) (a few ulp; the attention's logit soft-capping).  Below |x| = 0.625 an odd
 * polynomial x + x^3 P(x^2) (Cephes tanhf's coefficients), where the exp form would lose
 * the small result to cancellation; above it (1 - e) / (1 + e) with e = exp(-2|x|) <= 0.29,
 * which cpu_exp8 covers (its argument is <= 0) and which goes to exactly 1 for large |x|.
 * The sign is put back at the end, so tanh is odd bit for bit. */
CPU_AVX2 static inline __m256 cpu_tanh8(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 a = _mm256_andnot_ps(sign, x);
    const __m256 z = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-5.70498872745E-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954E-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531E-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036E-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422E-1f));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), a, a);
    const __m256 e = cpu_exp8(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 large = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    const __m256 r = _mm256_blendv_ps(large, small,
                                      _mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(sign, x));
}
#endif

#endif /* SBPRT_CPU_SIMD_H */
