/* npy.c — NumPy .npy arrays: reading (format versions 1.0, 2.0, 3.0), dtype conversion with range
 * checks, and writing (version 1.0).
 *
 * The format: the magic "\x93NUMPY", a major and minor version byte, the header length (uint16
 * in 1.0, uint32 in 2.0/3.0, little-endian), then the header — a Python dict literal such as
 * "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" padded with spaces and ended by
 * '\n' — then the raw data. The header is parsed by a small tokenizer that accepts exactly the
 * literal forms NumPy writes (quoted strings, True/False, tuples of integers; whitespace and a
 * trailing comma anywhere) and names the first thing it does not understand. Everything about
 * the data section (dtype, shape product, byte count, file length) is validated before the data
 * is allocated, so a hostile header cannot trigger a huge allocation.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "io_internal.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* A header larger than this is not something NumPy writes for an array of rank <= 32. */
#define NPY_MAX_HEADER (1u << 20)

/* What the header says. */
typedef struct {
    sbpio_dtype dtype;
    bool swap; /* big-endian data: byte-swap after reading */
    int rank;
    int64_t shape[SBPIO_MAX_RANK];
    int64_t numel;
    size_t nbytes;
    size_t data_offset; /* bytes before the data */
} npy_meta;

/* ---------------------------------------------------------------- header dict */

typedef struct {
    const char *s, *end, *start;
    const char *name;
    char *err;
    size_t errlen;
} hdr;

static int hdr_fail(hdr *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int hdr_fail(hdr *h, const char *fmt, ...)
{
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sbpio_errf(h->err, h->errlen, "%s: .npy header: %s (at header offset %zu)", h->name, msg,
                      (size_t)(h->s - h->start));
}

static void hdr_ws(hdr *h)
{
    while (h->s < h->end && (*h->s == ' ' || *h->s == '\t' || *h->s == '\n' || *h->s == '\r'))
        h->s++;
}

/* A Python string literal ('...' or "...") into out[outn]. */
static int hdr_string(hdr *h, char *out, size_t outn)
{
    char q = *h->s++;
    size_t n = 0;
    const char *close = h->s;
    while (close < h->end && *close != q)
        close += (*close == '\\' && close + 1 < h->end) ? 2 : 1;
    if (close >= h->end)
        return hdr_fail(h, "%s", "unterminated string literal");
    while (h->s < h->end && *h->s != q) {
        char c = *h->s++;
        if (c == '\\') {
            if (h->s >= h->end)
                break;
            c = *h->s++;
        }
        if (n + 1 >= outn)
            return hdr_fail(h, "%s", "string literal too long");
        out[n++] = c;
    }
    if (h->s >= h->end)
        return hdr_fail(h, "%s", "unterminated string literal");
    h->s++;
    out[n] = '\0';
    return SBPIO_OK;
}

/* A tuple of non-negative integers "(a, b, )". */
static int hdr_shape(hdr *h, npy_meta *m)
{
    h->s++; /* '(' */
    m->rank = 0;
    for (;;) {
        hdr_ws(h);
        if (h->s < h->end && *h->s == ')') {
            h->s++;
            return SBPIO_OK;
        }
        if (h->s >= h->end || *h->s < '0' || *h->s > '9')
            return hdr_fail(h, "%s", "shape must be a tuple of non-negative integers");
        uint64_t v = 0;
        while (h->s < h->end && *h->s >= '0' && *h->s <= '9') {
            unsigned d = (unsigned)(*h->s++ - '0');
            if (v > ((uint64_t)INT64_MAX - d) / 10)
                return hdr_fail(h, "%s", "shape dimension does not fit int64");
            v = v * 10 + d;
        }
        if (h->s < h->end && (*h->s == 'L' || *h->s == 'l')) /* Python 2 long literal */
            h->s++;
        if (m->rank == SBPIO_MAX_RANK)
            return hdr_fail(h, "%s", "rank exceeds SBPIO_MAX_RANK");
        m->shape[m->rank++] = (int64_t)v;
        hdr_ws(h);
        if (h->s < h->end && *h->s == ',') {
            h->s++;
            continue;
        }
        if (h->s < h->end && *h->s == ')') {
            h->s++;
            /* "(3)" is the integer 3 in Python, not a tuple; NumPy always writes "(3,)". */
            return SBPIO_OK;
        }
        return hdr_fail(h, "%s", "expected ',' or ')' in shape");
    }
}

/* Maps a descr such as "<f4" to a dtype. */
static int parse_descr(hdr *h, const char *d, npy_meta *m)
{
    char order = '=';
    const char *p = d;
    if (*p == '<' || *p == '>' || *p == '|' || *p == '=')
        order = *p++;
    char kind = *p ? *p++ : '\0';
    char *endp = NULL;
    errno = 0;
    long size = (*p >= '0' && *p <= '9') ? strtol(p, &endp, 10) : -1;
    bool sized = size > 0 && errno == 0 && *endp == '\0';
    const char *why = NULL;
    switch (kind) {
    case 'O': why = "object dtype"; break;
    case 'U':
    case 'S':
    case 'a': why = "string dtype"; break;
    case 'V': why = "void/structured dtype"; break;
    case 'c': why = "complex dtype"; break;
    case 'M':
    case 'm': why = "datetime dtype"; break;
    default: break;
    }
    char msg[96];
    if (why) {
        snprintf(msg, sizeof msg, "descr '%.40s': %s is not supported", d, why);
        return hdr_fail(h, "%s", msg);
    }
    sbpio_dtype t = SBPIO_DT_INVALID;
    if (sized) {
        switch (kind) {
        case 'b': t = size == 1 ? SBPIO_DT_BOOL : t; break;
        case 'i':
            t = size == 1   ? SBPIO_DT_I8
                : size == 2 ? SBPIO_DT_I16
                : size == 4 ? SBPIO_DT_I32
                : size == 8 ? SBPIO_DT_I64
                            : t;
            break;
        case 'u':
            t = size == 1   ? SBPIO_DT_U8
                : size == 2 ? SBPIO_DT_U16
                : size == 4 ? SBPIO_DT_U32
                : size == 8 ? SBPIO_DT_U64
                            : t;
            break;
        case 'f':
            t = size == 2 ? SBPIO_DT_F16 : size == 4 ? SBPIO_DT_F32 : size == 8 ? SBPIO_DT_F64 : t;
            break;
        default: break;
        }
    }
    if (t == SBPIO_DT_INVALID) {
        snprintf(msg, sizeof msg, "unsupported descr '%.40s'", d);
        return hdr_fail(h, "%s", msg);
    }
    if (order == '|' && size > 1) {
        snprintf(msg, sizeof msg, "descr '%.40s': '|' (no byte order) on a multi-byte type", d);
        return hdr_fail(h, "%s", msg);
    }
    bool big = order == '>' || (order == '=' && !sbpio_host_is_le());
    m->dtype = t;
    m->swap = size > 1 && big == sbpio_host_is_le();
    return SBPIO_OK;
}

static int parse_dict(hdr *h, npy_meta *m)
{
    bool have_descr = false, have_fortran = false, have_shape = false, fortran = false;
    hdr_ws(h);
    if (h->s >= h->end || *h->s != '{')
        return hdr_fail(h, "%s", "expected '{' (the header is a Python dict literal)");
    h->s++;
    for (;;) {
        hdr_ws(h);
        if (h->s < h->end && *h->s == '}') {
            h->s++;
            break;
        }
        if (h->s >= h->end || (*h->s != '\'' && *h->s != '"'))
            return hdr_fail(h, "%s", "expected a quoted key or '}'");
        char key[32];
        if (hdr_string(h, key, sizeof key) != SBPIO_OK)
            return SBPIO_ERR;
        hdr_ws(h);
        if (h->s >= h->end || *h->s != ':')
            return hdr_fail(h, "expected ':' after key '%s'", key);
        h->s++;
        hdr_ws(h);
        if (h->s >= h->end)
            return hdr_fail(h, "%s", "unexpected end of header");
        if (strcmp(key, "descr") == 0) {
            if (have_descr)
                return hdr_fail(h, "duplicate key '%s'", key);
            have_descr = true;
            if (*h->s == '[')
                return hdr_fail(h, "%s", "structured dtype (a list descr) is not supported");
            if (*h->s != '\'' && *h->s != '"')
                return hdr_fail(h, "%s", "'descr' must be a string");
            char d[64];
            if (hdr_string(h, d, sizeof d) != SBPIO_OK || parse_descr(h, d, m) != SBPIO_OK)
                return SBPIO_ERR;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_fortran)
                return hdr_fail(h, "duplicate key '%s'", key);
            have_fortran = true;
            if ((size_t)(h->end - h->s) >= 4 && memcmp(h->s, "True", 4) == 0)
                fortran = true, h->s += 4;
            else if ((size_t)(h->end - h->s) >= 5 && memcmp(h->s, "False", 5) == 0)
                fortran = false, h->s += 5;
            else
                return hdr_fail(h, "%s", "'fortran_order' must be True or False");
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return hdr_fail(h, "duplicate key '%s'", key);
            have_shape = true;
            if (*h->s != '(')
                return hdr_fail(h, "%s", "'shape' must be a tuple");
            if (hdr_shape(h, m) != SBPIO_OK)
                return SBPIO_ERR;
        } else {
            return hdr_fail(h, "unexpected key '%s'", key);
        }
        hdr_ws(h);
        if (h->s < h->end && *h->s == ',') {
            h->s++;
            continue;
        }
        if (h->s < h->end && *h->s == '}') {
            h->s++;
            break;
        }
        return hdr_fail(h, "%s", "expected ',' or '}'");
    }
    hdr_ws(h);
    if (h->s != h->end)
        return hdr_fail(h, "%s", "unexpected text after the dict");
    if (!have_descr || !have_fortran || !have_shape)
        return hdr_fail(h, "missing key '%s'",
                        !have_descr     ? "descr"
                        : !have_fortran ? "fortran_order"
                                        : "shape");
    if (fortran) {
        int big_dims = 0;
        for (int i = 0; i < m->rank; i++)
            big_dims += m->shape[i] > 1;
        if (big_dims > 1)
            return hdr_fail(h, "%s", "fortran_order True is not supported (save a C-order array)");
    }
    return SBPIO_OK;
}

/* Parses the prelude and the header dict from buf[0..avail) (which must hold the whole header)
 * and checks the data length against file_size. */
static int npy_parse(const unsigned char *buf, size_t avail, uint64_t file_size, const char *name,
                     npy_meta *m, char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (avail < NPY_MAGIC_LEN + 2 || memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN) != 0)
        return sbpio_errf(err, errlen, "%s: not a .npy file (%s)", name,
                          avail < NPY_MAGIC_LEN + 2 ? "shorter than the magic" : "bad magic");
    int major = buf[6], minor = buf[7];
    size_t lenbytes = major == 1 ? 2 : 4;
    if ((major != 1 && major != 2 && major != 3) || minor != 0)
        return sbpio_errf(err, errlen, "%s: unsupported .npy format version %d.%d", name, major,
                          minor);
    if (avail < 8 + lenbytes)
        return sbpio_errf(err, errlen, "%s: truncated .npy header (%zu bytes)", name, avail);
    uint64_t hlen = lenbytes == 2 ? sbpio_le16(buf + 8) : sbpio_le32(buf + 8);
    if (hlen > NPY_MAX_HEADER)
        return sbpio_errf(err, errlen, "%s: .npy header length %" PRIu64 " is implausible", name,
                          hlen);
    if (8 + lenbytes + hlen > avail)
        return sbpio_errf(err, errlen,
                          "%s: truncated .npy header (says %" PRIu64 " bytes, %zu available)", name,
                          hlen, avail - 8 - lenbytes);
    const char *text = (const char *)buf + 8 + lenbytes;
    if (major < 3) { /* latin-1: NumPy only writes ASCII there */
        for (uint64_t i = 0; i < hlen; i++)
            if ((unsigned char)text[i] >= 0x80 || text[i] == '\0')
                return sbpio_errf(err, errlen,
                                  "%s: .npy header has a non-ASCII byte at offset %" PRIu64, name,
                                  i);
    } else if (!sbpio_utf8_valid((const unsigned char *)text, (size_t)hlen)) {
        return sbpio_errf(err, errlen, "%s: .npy 3.0 header is not valid UTF-8", name);
    }
    hdr h = {text, text + hlen, text, name, err, errlen};
    if (parse_dict(&h, m) != SBPIO_OK)
        return SBPIO_ERR;
    m->data_offset = 8 + lenbytes + (size_t)hlen;
    char sh[256];
    if (!sbpio_shape_bytes(m->rank, m->shape, sbpio_dtype_size(m->dtype), &m->numel, &m->nbytes))
        return sbpio_errf(err, errlen, "%s: .npy shape %s of %s overflows", name,
                          sbpio_shape_str(m->rank, m->shape, sh, sizeof sh),
                          sbpio_dtype_name(m->dtype));
    uint64_t have = file_size - m->data_offset;
    if (have != m->nbytes)
        return sbpio_errf(
            err, errlen, "%s: .npy data is %" PRIu64 " bytes but shape %s of %s needs %zu%s", name,
            have, sbpio_shape_str(m->rank, m->shape, sh, sizeof sh), sbpio_dtype_name(m->dtype),
            m->nbytes, have < m->nbytes ? " (truncated file)" : " (trailing bytes)");
    return SBPIO_OK;
}

static int npy_finish(const npy_meta *m, void *data, sbpio_array *out)
{
    if (m->swap)
        sbpio_byteswap(data, (size_t)m->numel, sbpio_dtype_size(m->dtype));
    out->dtype = m->dtype;
    out->rank = m->rank;
    memcpy(out->shape, m->shape, sizeof m->shape);
    out->numel = m->numel;
    out->nbytes = m->nbytes;
    out->data = data;
    return SBPIO_OK;
}

int sbpio_npy_read_mem(const void *buf, size_t len, const char *name, sbpio_array *out, char *err,
                       size_t errlen)
{
    memset(out, 0, sizeof *out);
    npy_meta m;
    if (npy_parse(buf, len, len, name, &m, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    void *data = NULL;
    if (m.nbytes) {
        if (!(data = malloc(m.nbytes)))
            return sbpio_errf(err, errlen, "%s: out of memory (%zu bytes)", name, m.nbytes);
        memcpy(data, (const unsigned char *)buf + m.data_offset, m.nbytes);
    }
    return npy_finish(&m, data, out);
}

int sbpio_npy_read(const char *path, sbpio_array *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = sbp_file_fopen_input(path, NULL, err, errlen); /* never blocks on a FIFO */
    if (!f)
        return SBPIO_ERR;
    int64_t size = sbpio_file_size(f);
    if (size < 0) {
        int e = errno;
        fclose(f);
        return sbpio_errf(err, errlen, "%s: %s", path,
                          e == EINVAL ? "not a regular file" : strerror(e));
    }
    /* Read the prelude, then exactly the header it announces. */
    unsigned char pre[12];
    size_t npre = (size_t)(size < 12 ? size : 12);
    unsigned char *head = NULL;
    void *data = NULL;
    npy_meta m;
    int rc = SBPIO_ERR;
    if (!sbpio_read_exact(f, pre, npre)) {
        sbpio_errf(err, errlen, "%s: read error", path);
        goto done;
    }
    size_t want = npre;
    if (npre >= 10 && memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) == 0) {
        uint64_t hlen = pre[6] == 1 ? sbpio_le16(pre + 8) : npre >= 12 ? sbpio_le32(pre + 8) : 0;
        size_t lenbytes = pre[6] == 1 ? 2 : 4;
        if (hlen <= NPY_MAX_HEADER)
            want = 8 + lenbytes + (size_t)hlen;
        if ((uint64_t)want > (uint64_t)size)
            want = (size_t)size; /* npy_parse reports the truncation */
        if (want < npre)
            want = npre;
    }
    if (!(head = malloc(want))) {
        sbpio_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    memcpy(head, pre, npre);
    if (!sbpio_read_exact(f, head + npre, want - npre)) {
        sbpio_errf(err, errlen, "%s: read error", path);
        goto done;
    }
    if (npy_parse(head, want, (uint64_t)size, path, &m, err, errlen) != SBPIO_OK)
        goto done;
    if (m.nbytes) {
        if (!(data = malloc(m.nbytes))) {
            sbpio_errf(err, errlen, "%s: out of memory (%zu bytes)", path, m.nbytes);
            goto done;
        }
        if (fseeko(f, (off_t)m.data_offset, SEEK_SET) != 0 ||
            !sbpio_read_exact(f, data, m.nbytes)) {
            sbpio_errf(err, errlen, "%s: read error in the data section", path);
            goto done;
        }
    }
    rc = npy_finish(&m, data, out);
    data = NULL;
done:
    free(head);
    free(data);
    fclose(f);
    return rc;
}

void sbpio_array_free(sbpio_array *a)
{
    if (!a)
        return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- conversion */

/* Element i of an integer array as sign (*neg) and magnitude (*mag), so that U64 needs no
 * special case. */
static void int_elem(const sbpio_array *a, int64_t i, bool *neg, uint64_t *mag)
{
    int64_t v = 0;
    uint64_t u = 0;
    bool is_u = false;
    const void *p = (const unsigned char *)a->data + (size_t)i * sbpio_dtype_size(a->dtype);
    switch (a->dtype) {
    case SBPIO_DT_BOOL:
    case SBPIO_DT_U8: {
        uint8_t x;
        memcpy(&x, p, 1);
        u = x;
        is_u = true;
        break;
    }
    case SBPIO_DT_I8: {
        int8_t x;
        memcpy(&x, p, 1);
        v = x;
        break;
    }
    case SBPIO_DT_U16: {
        uint16_t x;
        memcpy(&x, p, 2);
        u = x;
        is_u = true;
        break;
    }
    case SBPIO_DT_I16: {
        int16_t x;
        memcpy(&x, p, 2);
        v = x;
        break;
    }
    case SBPIO_DT_U32: {
        uint32_t x;
        memcpy(&x, p, 4);
        u = x;
        is_u = true;
        break;
    }
    case SBPIO_DT_I32: {
        int32_t x;
        memcpy(&x, p, 4);
        v = x;
        break;
    }
    case SBPIO_DT_U64: {
        memcpy(&u, p, 8);
        is_u = true;
        break;
    }
    case SBPIO_DT_I64: {
        memcpy(&v, p, 8);
        break;
    }
    default: break;
    }
    if (is_u) {
        *neg = false;
        *mag = u;
    } else {
        *neg = v < 0;
        *mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    }
}

static void int_range(sbpio_dtype t, uint64_t *max_pos, uint64_t *max_neg)
{
    switch (t) {
    case SBPIO_DT_BOOL: *max_pos = 1, *max_neg = 0; break;
    case SBPIO_DT_U8: *max_pos = UINT8_MAX, *max_neg = 0; break;
    case SBPIO_DT_I8: *max_pos = INT8_MAX, *max_neg = 128; break;
    case SBPIO_DT_U16: *max_pos = UINT16_MAX, *max_neg = 0; break;
    case SBPIO_DT_I16: *max_pos = INT16_MAX, *max_neg = 32768; break;
    case SBPIO_DT_U32: *max_pos = UINT32_MAX, *max_neg = 0; break;
    case SBPIO_DT_I32: *max_pos = INT32_MAX, *max_neg = (uint64_t)INT32_MAX + 1; break;
    case SBPIO_DT_U64: *max_pos = UINT64_MAX, *max_neg = 0; break;
    default: *max_pos = INT64_MAX, *max_neg = (uint64_t)INT64_MAX + 1; break;
    }
}

static void store_int(sbpio_dtype t, void *p, bool neg, uint64_t mag)
{
    int64_t v = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* in range by construction */
    switch (t) {
    case SBPIO_DT_BOOL:
    case SBPIO_DT_U8: {
        uint8_t x = (uint8_t)mag;
        memcpy(p, &x, 1);
        break;
    }
    case SBPIO_DT_I8: {
        int8_t x = (int8_t)v;
        memcpy(p, &x, 1);
        break;
    }
    case SBPIO_DT_U16: {
        uint16_t x = (uint16_t)mag;
        memcpy(p, &x, 2);
        break;
    }
    case SBPIO_DT_I16: {
        int16_t x = (int16_t)v;
        memcpy(p, &x, 2);
        break;
    }
    case SBPIO_DT_U32: {
        uint32_t x = (uint32_t)mag;
        memcpy(p, &x, 4);
        break;
    }
    case SBPIO_DT_I32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case SBPIO_DT_U64: memcpy(p, &mag, 8); break;
    default: memcpy(p, &v, 8); break;
    }
}

static double float_elem(const sbpio_array *a, int64_t i)
{
    const unsigned char *p =
        (const unsigned char *)a->data + (size_t)i * sbpio_dtype_size(a->dtype);
    switch (a->dtype) {
    case SBPIO_DT_F16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return sbpio_f16_to_f32(h);
    }
    case SBPIO_DT_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        return sbpio_bf16_to_f32(h);
    }
    case SBPIO_DT_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    default: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    }
}

/* "[1, 7]" multi-index of flat element i. */
static char *index_str(const sbpio_array *a, int64_t i, char *buf, size_t n)
{
    int64_t idx[SBPIO_MAX_RANK];
    for (int d = a->rank - 1; d >= 0; d--) {
        idx[d] = a->shape[d] ? i % a->shape[d] : 0;
        i = a->shape[d] ? i / a->shape[d] : 0;
    }
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < a->rank && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", idx[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

int sbpio_array_convert(sbpio_array *a, sbpio_dtype to, const char *what, char *err, size_t errlen)
{
    if (!what)
        what = "array";
    if (sbpio_dtype_size(to) == 0)
        return sbpio_errf(err, errlen, "%s: invalid target dtype", what);
    if (a->dtype == to)
        return SBPIO_OK;
    bool from_int = sbpio_dtype_is_int(a->dtype), to_int = sbpio_dtype_is_int(to);
    bool to_float = to == SBPIO_DT_F32 || to == SBPIO_DT_F64;
    if (!(from_int && to_int) && !(sbpio_dtype_is_float(a->dtype) && to_float))
        return sbpio_errf(err, errlen, "%s: expected %s data, found %s", what,
                          to_int ? "integer" : "floating-point", sbpio_dtype_name(a->dtype));
    size_t osize = sbpio_dtype_size(to);
    uint64_t ob;
    if (!sbpio_mul_u64((uint64_t)a->numel, osize, &ob) || ob > SIZE_MAX)
        return sbpio_errf(err, errlen, "%s: converted size overflows", what);
    void *out = ob ? malloc((size_t)ob) : NULL;
    if (ob && !out)
        return sbpio_errf(err, errlen, "%s: out of memory (%" PRIu64 " bytes)", what, ob);
    char ib[160];
    for (int64_t i = 0; i < a->numel; i++) {
        unsigned char *op = (unsigned char *)out + (size_t)i * osize;
        if (to_int) {
            bool neg;
            uint64_t mag, max_pos, max_neg;
            int_elem(a, i, &neg, &mag);
            int_range(to, &max_pos, &max_neg);
            if (neg ? mag > max_neg : mag > max_pos) {
                free(out);
                return sbpio_errf(err, errlen, "%s: element %s = %s%" PRIu64 " does not fit %s",
                                  what, index_str(a, i, ib, sizeof ib), neg ? "-" : "", mag,
                                  sbpio_dtype_name(to));
            }
            store_int(to, op, neg, mag);
        } else {
            double d = float_elem(a, i);
            if (to == SBPIO_DT_F64) {
                memcpy(op, &d, 8);
            } else {
                float f = (float)d;
                if (isfinite(d) && !isfinite(f)) {
                    free(out);
                    return sbpio_errf(err, errlen, "%s: element %s = %g overflows float32", what,
                                      index_str(a, i, ib, sizeof ib), d);
                }
                memcpy(op, &f, 4);
            }
        }
    }
    free(a->data);
    a->data = out;
    a->dtype = to;
    a->nbytes = (size_t)ob;
    return SBPIO_OK;
}

static int read_as(const char *path, sbpio_array *out, sbpio_dtype to, char *err, size_t errlen)
{
    if (sbpio_npy_read(path, out, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    if (sbpio_array_convert(out, to, path, err, errlen) != SBPIO_OK) {
        sbpio_array_free(out);
        return SBPIO_ERR;
    }
    return SBPIO_OK;
}

int sbpio_npy_read_i32(const char *path, sbpio_array *out, char *err, size_t errlen)
{
    return read_as(path, out, SBPIO_DT_I32, err, errlen);
}

int sbpio_npy_read_f32(const char *path, sbpio_array *out, char *err, size_t errlen)
{
    return read_as(path, out, SBPIO_DT_F32, err, errlen);
}

int sbpio_npy_read_f64(const char *path, sbpio_array *out, char *err, size_t errlen)
{
    return read_as(path, out, SBPIO_DT_F64, err, errlen);
}

/* ---------------------------------------------------------------- writing */

static const char *npy_descr(sbpio_dtype t)
{
    switch (t) {
    case SBPIO_DT_BOOL: return "|b1";
    case SBPIO_DT_U8: return "|u1";
    case SBPIO_DT_I8: return "|i1";
    case SBPIO_DT_U16: return "<u2";
    case SBPIO_DT_I16: return "<i2";
    case SBPIO_DT_U32: return "<u4";
    case SBPIO_DT_I32: return "<i4";
    case SBPIO_DT_U64: return "<u8";
    case SBPIO_DT_I64: return "<i8";
    case SBPIO_DT_F16: return "<f2";
    case SBPIO_DT_F32: return "<f4";
    case SBPIO_DT_F64: return "<f8";
    default: return NULL;
    }
}

int sbpio_npy_write(const char *path, sbpio_dtype dtype, int rank, const int64_t *shape,
                    const void *data, char *err, size_t errlen)
{
    const char *descr = npy_descr(dtype);
    if (!descr)
        return sbpio_errf(err, errlen, "%s: dtype %s has no .npy descr", path,
                          sbpio_dtype_name(dtype));
    if (rank < 0 || rank > SBPIO_MAX_RANK || (rank > 0 && !shape))
        return sbpio_errf(err, errlen, "%s: bad rank %d", path, rank);
    int64_t numel;
    size_t nbytes;
    if (!sbpio_shape_bytes(rank, shape, sbpio_dtype_size(dtype), &numel, &nbytes))
        return sbpio_errf(err, errlen, "%s: shape has a negative dimension or overflows", path);
    if (nbytes && !data)
        return sbpio_errf(err, errlen, "%s: no data for %" PRId64 " elements", path, numel);

    char sh[256], head[512];
    int k = snprintf(head, sizeof head, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, sbpio_shape_str(rank, shape, sh, sizeof sh));
    /* Pad with spaces so that magic + version + length + header is a multiple of 64, '\n' last. */
    size_t total = 10 + (size_t)k + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)k + pad + 1;
    memset(head + k, ' ', pad);
    head[hlen - 1] = '\n';

    unsigned char pre[10];
    memcpy(pre, NPY_MAGIC, NPY_MAGIC_LEN);
    pre[6] = 1;
    pre[7] = 0;
    pre[8] = (unsigned char)(hlen & 0xff);
    pre[9] = (unsigned char)(hlen >> 8);

    sbpio_atomic a;
    if (sbpio_atomic_begin(&a, path, err, errlen) != SBPIO_OK)
        return SBPIO_ERR;
    if (fwrite(pre, 1, 10, a.f) != 10 || fwrite(head, 1, hlen, a.f) != hlen ||
        !sbpio_write_le(a.f, data, (size_t)numel, sbpio_dtype_size(dtype))) {
        int e = errno;
        sbpio_atomic_abort(&a);
        return sbpio_errf(err, errlen, "%s: write error: %s", path, strerror(e));
    }
    return sbpio_atomic_commit(&a, err, errlen);
}
