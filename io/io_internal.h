/* io_internal.h — helpers shared by the sbpio sources; not part of the public interface.
 *
 * util.c: error messages, the dtype table, little-endian loads/stores, checked arithmetic,
 * half-precision conversions, whole-file reads and little-endian writes.
 * json.c: a small JSON parser (RFC 8259) used for safetensors headers.
 */
#ifndef SBP_IO_INTERNAL_H
#define SBP_IO_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "sbpio.h"

/* ---------------------------------------------------------------- util.c */

/* Formats into err (if err && errlen) and returns SBPIO_ERR. */
int sbpio_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline bool sbpio_host_is_le(void)
{
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
    return __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    const uint16_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
#endif
}

static inline uint16_t sbpio_le16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t sbpio_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t sbpio_le64(const unsigned char *p)
{
    return (uint64_t)sbpio_le32(p) | ((uint64_t)sbpio_le32(p + 4) << 32);
}
static inline void sbpio_put_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16),
    p[3] = (unsigned char)(v >> 24);
}
static inline void sbpio_put_le64(unsigned char *p, uint64_t v)
{
    sbpio_put_le32(p, (uint32_t)v);
    sbpio_put_le32(p + 4, (uint32_t)(v >> 32));
}

/* *r = a * b; false on overflow (of uint64 / of int64 with a, b >= 0). */
static inline bool sbpio_mul_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *r = a * b;
    return true;
}
static inline bool sbpio_mul_i64(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || (a != 0 && b > INT64_MAX / a))
        return false;
    *r = a * b;
    return true;
}

/* Product of shape[0..rank) with each dim >= 0, and that times itemsize as a size_t; false on a
 * negative dim or any overflow. */
bool sbpio_shape_bytes(int rank, const int64_t *shape, size_t itemsize, int64_t *numel,
                       size_t *nbytes);
/* "(2, 3)" style rendering of a shape into buf; returns buf. */
char *sbpio_shape_str(int rank, const int64_t *shape, char *buf, size_t n);

/* Reverses the bytes of each of n elements of `size` bytes (2, 4 or 8). */
void sbpio_byteswap(void *data, size_t n, size_t size);

float sbpio_f16_to_f32(uint16_t h);
float sbpio_bf16_to_f32(uint16_t h);

/* Size of an open file; -1 on error (errno set). */
int64_t sbpio_file_size(FILE *f);
/* Reads exactly n bytes; false on short read. */
bool sbpio_read_exact(FILE *f, void *buf, size_t n);
/* Writes n elements of `size` bytes from host-order data as little-endian; false on error. */
bool sbpio_write_le(FILE *f, const void *data, size_t n, size_t size);

/* The directory part of path ("." when none) and the last component, both malloc'd. */
char *sbpio_dirname(const char *path);
const char *sbpio_basename(const char *path);

/* ---------------------------------------------------------------- json.c */

typedef enum {
    SBPIO_JSON_NULL,
    SBPIO_JSON_BOOL,
    SBPIO_JSON_NUMBER,
    SBPIO_JSON_STRING,
    SBPIO_JSON_ARRAY,
    SBPIO_JSON_OBJECT,
} sbpio_json_kind;

typedef struct sbpio_json sbpio_json;
struct sbpio_json {
    sbpio_json_kind kind;
    size_t offset;      /* byte offset of the value in the text, for messages */
    bool b;             /* BOOL */
    char *str;          /* STRING: decoded UTF-8 (no NUL inside); NUMBER: the literal text */
    size_t len;         /* strlen(str) */
    int n;              /* ARRAY / OBJECT: number of elements / members */
    sbpio_json **items; /* [n] elements or member values */
    char **keys;        /* [n] member names (OBJECT), decoded */
};

typedef struct sbpio_json_doc sbpio_json_doc; /* owns every node and string */

/* Parses text[0..len) as one JSON value followed only by whitespace. Depth is limited to 64.
 * Strings must be valid UTF-8; "\u0000" and unpaired surrogates are refused. Duplicate object
 * keys are not checked here. On error returns NULL and writes "MSG at byte N" into err. */
sbpio_json_doc *sbpio_json_parse(const char *text, size_t len, const sbpio_json **root, char *err,
                                 size_t errlen);
void sbpio_json_free(sbpio_json_doc *doc);
/* Member of an object by key (first match), or NULL. */
const sbpio_json *sbpio_json_get(const sbpio_json *obj, const char *key);
/* A NUMBER that is a plain non-negative integer literal (no sign, fraction or exponent) fitting
 * uint64 -> *out, true. */
bool sbpio_json_u64(const sbpio_json *v, uint64_t *out);
/* "an array", "a string", "null", ... for messages. */
const char *sbpio_json_kind_name(sbpio_json_kind k);

/* Appends s as a JSON string literal (quotes included) to a growable buffer. false on invalid
 * UTF-8 in s or out of memory. */
typedef struct sbpio_strbuf {
    char *s;
    size_t len, cap;
    bool oom;
} sbpio_strbuf;
void sbpio_sb_append(sbpio_strbuf *b, const char *s, size_t n);
void sbpio_sb_printf(sbpio_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool sbpio_sb_json_string(sbpio_strbuf *b, const char *s);
/* Checks that s[0..n) is valid UTF-8 (no overlongs, surrogates or code points > U+10FFFF). */
bool sbpio_utf8_valid(const unsigned char *s, size_t n);

#endif /* SBP_IO_INTERNAL_H */
