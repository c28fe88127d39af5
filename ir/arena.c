/* arena.c — bump allocation for one compilation.
 *
 * A compiler is short-lived: every IR object of a compilation is carved out of large blocks and
 * released together by ir_arena_free. Allocations are zeroed and 16-byte aligned. Requests larger
 * than a block get a block of their own, so big constant tensors do not waste block tails.
 */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

#define ARENA_BLOCK (1u << 20)

typedef struct arena_block {
    struct arena_block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} arena_block;

struct ir_arena {
    arena_block *head;  /* current block; older blocks follow */
    size_t total;       /* bytes handed out, for reports */
};

ir_arena *ir_arena_new(void) { return calloc(1, sizeof(ir_arena)); }

void ir_arena_free(ir_arena *a)
{
    if (!a)
        return;
    for (arena_block *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(a);
}

void *ir_arena_alloc(ir_arena *a, size_t n)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / 2)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    arena_block *b = a->head;
    if (!b || b->size - b->used < n) {
        size_t sz = n > ARENA_BLOCK / 4 ? n : ARENA_BLOCK;
        arena_block *nb = malloc(sizeof(arena_block) + sz);
        if (!nb)
            return NULL;
        nb->used = 0;
        nb->size = sz;
        if (b && sz != ARENA_BLOCK) {
            /* A dedicated block goes behind the current one so its tail stays usable. */
            nb->next = b->next;
            b->next = nb;
        } else {
            nb->next = b;
            a->head = nb;
        }
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

void *ir_arena_calloc(ir_arena *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return ir_arena_alloc(a, n * size);
}

char *ir_arena_strdup(ir_arena *a, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *p = ir_arena_alloc(a, n + 1);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

char *ir_arena_printf(ir_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *p = n >= 0 ? ir_arena_alloc(a, (size_t)n + 1) : NULL;
    if (p)
        vsnprintf(p, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

size_t ir_arena_bytes(const ir_arena *a) { return a->total; }
