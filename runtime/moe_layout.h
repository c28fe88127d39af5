/*
 * moe_layout.h — how both backends carve the scratch of sbprt_moe_forward / _backward
 * (runtime/cpu/moe.c, runtime/cuda/moe.cu): one definition, so the CPU and CUDA twins agree on
 * every piece's offset and on which sizes are valid.  Internal to libsbprt (not installed).
 *
 * Where each temporary lives, in floats from the scratch's start.  Per sorted pair p:
 *   xs: [nk, d]   the gathered rows; in the backward, overwritten per expert by dxs
 *   h:  [nk, 2f]  w1 products (gate | up)
 *   a:  [nk, f]   silu(gate) * up
 *   ye: [nk, d]   w2 products; in the backward overwritten by dye = wts * dy
 *   da: [nk, f], dh: [nk, 2f]   their gradients (backward only)
 *   dw: [nk]      dL/dwts, then dL/dv, indexed by pair r*k + j (backward only)
 *   order: [nk] int32   sorted position -> pair r*k + j
 *   pos:   [nk] int32   pair r*k + j -> sorted position
 *   dz:    [n, e]       dL/dp, then dL/dz, of the router (backward only; the CUDA sort
 *                       borrows it for its chunk counters before that)
 *   start: [e + 1] int32  first sorted position of each expert; start[e] = nk
 * Each piece starts at a multiple of SBPRT_MOE_PIECE_ALIGN floats.  The pieces add up to
 *   nk (d + 2f + f + d + f + 2f + 1 + 1 + 1) + n e + (e + 1) = nk (2d + 6f + 3) + n e + e + 1
 * floats, and rounding each of the 11 up to 64 adds at most 63 per piece, 11 * 63 = 693 <
 * 16 * 64: the total never exceeds sbprt_moe_scratch_floats, which sbprt_moe_layout_plan
 * re-verifies for the sizes given (with overflow checks, which the inline formula lacks).
 */
#ifndef SBPRT_MOE_LAYOUT_H
#define SBPRT_MOE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "sbprt.h"

#define SBPRT_MOE_PIECE_ALIGN 64

typedef struct sbprt_moe_layout {
    size_t nk; /* n * k pairs */
    size_t xs, h, a, ye, da, dh, dw, order, pos, dz, start;
} sbprt_moe_layout;

static inline int sbprt_moe_mul_(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static inline int sbprt_moe_add_(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return 0;
    *out = a + b;
    return 1;
}

/* Appends a piece of `count` floats at *at (a multiple of the alignment); 0 on overflow. */
static inline int sbprt_moe_piece_(size_t *at, size_t count, size_t *off)
{
    size_t rounded;
    *off = *at;
    if (!sbprt_moe_add_(count, SBPRT_MOE_PIECE_ALIGN - 1, &rounded))
        return 0;
    rounded -= rounded % SBPRT_MOE_PIECE_ALIGN;
    return sbprt_moe_add_(*at, rounded, at);
}

/* Validates the sizes (n >= 0, d, e, f > 0, 1 <= k <= e, n*k and 2f within int32, nothing
 * overflowing) and fills L; SBPRT_OK or SBPRT_ERR_INVALID. */
static inline int sbprt_moe_layout_plan(int n, int d, int e, int k, int f, sbprt_moe_layout *L)
{
    if (!(n >= 0 && d > 0 && e > 0 && k >= 1 && k <= e && f > 0 && f <= INT32_MAX / 2))
        return SBPRT_ERR_INVALID; /* 2f is a GEMM dimension */
    size_t nk, nkd, nkf, nkf2, ne, at = 0;
    if (!(sbprt_moe_mul_((size_t)n, (size_t)k, &nk) && nk <= (size_t)INT32_MAX &&
          sbprt_moe_mul_(nk, (size_t)d, &nkd) && sbprt_moe_mul_(nk, (size_t)f, &nkf) &&
          sbprt_moe_mul_(nkf, 2, &nkf2) && sbprt_moe_mul_((size_t)n, (size_t)e, &ne)))
        return SBPRT_ERR_INVALID;
    L->nk = nk;
    if (!(sbprt_moe_piece_(&at, nkd, &L->xs) && sbprt_moe_piece_(&at, nkf2, &L->h) &&
          sbprt_moe_piece_(&at, nkf, &L->a) && sbprt_moe_piece_(&at, nkd, &L->ye) &&
          sbprt_moe_piece_(&at, nkf, &L->da) && sbprt_moe_piece_(&at, nkf2, &L->dh) &&
          sbprt_moe_piece_(&at, nk, &L->dw) && sbprt_moe_piece_(&at, nk, &L->order) &&
          sbprt_moe_piece_(&at, nk, &L->pos) && sbprt_moe_piece_(&at, ne, &L->dz) &&
          sbprt_moe_piece_(&at, (size_t)e + 1, &L->start)))
        return SBPRT_ERR_INVALID;
    /* the formula of sbprt_moe_scratch_floats, overflow-checked */
    size_t per_pair = 2 * (size_t)d + 6 * (size_t)f + 3, formula;
    if (!(sbprt_moe_mul_(nk, per_pair, &formula) && sbprt_moe_add_(formula, ne, &formula) &&
          sbprt_moe_add_(formula, (size_t)e + 1 + 16 * 64, &formula)))
        return SBPRT_ERR_INVALID;
    if (!(at <= formula && formula == sbprt_moe_scratch_floats(n, d, e, k, f)))
        return SBPRT_ERR_INVALID;
    return SBPRT_OK;
}

/* The LoRA pieces of sbprt_moe_lora_forward / _backward, after the plain layout's formula
 * (sbprt_moe_scratch_floats), in floats from the scratch's start:
 *   t1, t2: [nk, r]      x A1ᵀ and a A2ᵀ per sorted pair (the adapters' inner products)
 *   g1, g2: [nk, r]      their gradients, already times scale (backward only)
 *   bg1: [e, 2f, r]  bg2: [e, d, r]    b1, b2 copied expert-major (B1_i contiguous)
 *   db1: [e, 2f, r]  db2: [e, d, r]    each expert's share of db1, db2 before the scatter
 * They start at the plain total rounded up to SBPRT_MOE_PIECE_ALIGN: that rounding and the 8
 * pieces' own, at most 63 floats each, fit the 9 * 64 of the formula. */
typedef struct sbprt_moe_lora_layout {
    size_t t1, t2, g1, g2, bg1, bg2, db1, db2;
} sbprt_moe_lora_layout;

/* Checks r (>= 1, r * e within int32) and fills LL; SBPRT_OK or SBPRT_ERR_INVALID. L is the
 * plain layout of the same sizes (sbprt_moe_layout_plan, already validated). */
static inline int sbprt_moe_lora_layout_plan(int n, int d, int e, int k, int f, int r,
                                             sbprt_moe_lora_layout *LL)
{
    if (!(r >= 1 && (int64_t)r * e <= INT32_MAX))
        return SBPRT_ERR_INVALID;
    /* the plain formula's total, rounded up so that every LoRA piece is aligned too */
    size_t at = sbprt_moe_scratch_floats(n, d, e, k, f), nkr, ef2r, edr;
    at += (SBPRT_MOE_PIECE_ALIGN - at % SBPRT_MOE_PIECE_ALIGN) % SBPRT_MOE_PIECE_ALIGN;
    size_t nk = (size_t)n * (size_t)k;
    if (!(sbprt_moe_mul_(nk, (size_t)r, &nkr) &&
          sbprt_moe_mul_((size_t)e * 2 * (size_t)f, (size_t)r, &ef2r) &&
          sbprt_moe_mul_((size_t)e * (size_t)d, (size_t)r, &edr)))
        return SBPRT_ERR_INVALID;
    if (!(sbprt_moe_piece_(&at, nkr, &LL->t1) && sbprt_moe_piece_(&at, nkr, &LL->t2) &&
          sbprt_moe_piece_(&at, nkr, &LL->g1) && sbprt_moe_piece_(&at, nkr, &LL->g2) &&
          sbprt_moe_piece_(&at, ef2r, &LL->bg1) && sbprt_moe_piece_(&at, edr, &LL->bg2) &&
          sbprt_moe_piece_(&at, ef2r, &LL->db1) && sbprt_moe_piece_(&at, edr, &LL->db2)))
        return SBPRT_ERR_INVALID;
    if (at > sbprt_moe_lora_scratch_floats(n, d, e, k, f, r))
        return SBPRT_ERR_INVALID;
    return SBPRT_OK;
}

#endif
