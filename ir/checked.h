/* checked.h — checked arithmetic for every size, count, offset and stride sbpc computes.
 *
 * A model is untrusted input: one Expand to [3, (2^64+2)/3] makes a plain product of its dims
 * wrap to 2, and everything sized from that product (the plan, the emitted C, the step's
 * buffers) is then silently wrong. So sizes are never multiplied or added with bare `*` / `+`
 * where an operand comes from the model or the command line: these helpers say whether the
 * result fits, and the caller turns "no" into a diagnostic naming the node and the dims (ir/
 * ir.c: ir_check_shape_size does that for a value's shape).
 *
 * The helpers are the compiler builtins (__builtin_mul_overflow / __builtin_add_overflow, GCC
 * and Clang), which compute the exact result and report whether it fits the destination type:
 * no division-based pre-checks to get wrong, no undefined signed overflow on the way.
 *
 * Limits. Besides "fits 64 bits", a tensor must fit what a target can address:
 *   IR_MAX_TENSOR_BYTES  2^47 bytes (128 TiB), the user address space of x86-64 and AArch64
 *                        with 48-bit virtual addresses, and of CUDA's unified address space;
 *                        a value larger than that cannot exist on any target sbpc emits for.
 *   IR_MAX_KERNEL_INT    INT32_MAX: the runtime's kernels take every dimension (rows, columns,
 *                        heads, a permutation's extents, ...) as C `int` (runtime/sbprt.h),
 *                        so a dimension argument above it is refused for both targets.
 */
#ifndef SBP_CHECKED_H
#define SBP_CHECKED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IR_MAX_TENSOR_BYTES ((int64_t)1 << 47)
#define IR_MAX_KERNEL_INT ((int64_t)INT32_MAX)

/* *r = a * b; false (and *r unspecified) when the product does not fit. */
static inline bool ck_mul_i64(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool ck_add_i64(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}
static inline bool ck_mul_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}
static inline bool ck_add_size(size_t a, size_t b, size_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* The product of dims[0..n), each >= 0; false when a dim is negative or the product does not
 * fit int64. A zero dim does not hide an overflow of the others: every prefix product must fit,
 * because code that walks a shape (strides, outer/inner splits) multiplies prefixes. */
static inline bool ck_numel(const int64_t *dims, int n, int64_t *out)
{
    int64_t p = 1, q = 1; /* p: the product; q: the product with zeros read as 1 */
    for (int i = 0; i < n; i++) {
        if (dims[i] < 0)
            return false;
        if (!ck_mul_i64(q, dims[i] ? dims[i] : 1, &q))
            return false;
        p = dims[i] ? p * dims[i] : 0; /* |p| <= q: cannot overflow */
    }
    *out = p;
    return true;
}

/* a * b saturated at INT64_MAX (a, b >= 0): for caps and bounds where "huge" is the answer. */
static inline int64_t ck_mul_sat_i64(int64_t a, int64_t b)
{
    int64_t r;
    return ck_mul_i64(a, b, &r) ? r : INT64_MAX;
}
static inline int64_t ck_add_sat_i64(int64_t a, int64_t b)
{
    int64_t r;
    return ck_add_i64(a, b, &r) ? r : INT64_MAX;
}

#endif
