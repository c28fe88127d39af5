/* json.c — a small, strict JSON parser (RFC 8259) for safetensors headers, plus the string
 * escaping the safetensors writer needs.
 *
 * Approach: recursive descent over the text with a depth limit; every node and decoded string
 * is allocated from one bump arena owned by the document, so a parse is freed with one call and
 * an error anywhere frees everything. Containers collect their children in a temporary growable
 * array and copy it into the arena when closed. Strings are validated as UTF-8 and decoded
 * (\uXXXX escapes, surrogate pairs); "\u0000" is refused because names are used as C strings.
 * Numbers are checked against the JSON grammar and kept as their literal text; callers convert
 * (sbpio_json_u64 for sizes and offsets).
 */
#include <stdarg.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io_internal.h"

#define JSON_MAX_DEPTH 64

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} chunk;

struct sbpio_json_doc {
    chunk *chunks;
    sbpio_json *root;
};

typedef struct {
    const unsigned char *s, *end, *start;
    sbpio_json_doc *doc;
    char *err;
    size_t errlen;
    bool failed;
} parser;

static void *doc_alloc(sbpio_json_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof(chunk) + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = d->chunks;
        d->chunks = c;
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

void sbpio_json_free(sbpio_json_doc *doc)
{
    if (!doc)
        return;
    for (chunk *c = doc->chunks, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(doc);
}

static void *fail(parser *p, const unsigned char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void *fail(parser *p, const unsigned char *at, const char *fmt, ...)
{
    if (p->failed)
        return NULL;
    p->failed = true;
    if (p->err && p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(p->err, p->errlen, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < p->errlen)
            snprintf(p->err + k, p->errlen - (size_t)k, " at byte %zu", (size_t)(at - p->start));
    }
    return NULL;
}

static void skip_ws(parser *p)
{
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

/* Length of the UTF-8 sequence at s (1..4) if valid, else 0. */
static size_t utf8_seq(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
        n = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        n = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        n = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

bool sbpio_utf8_valid(const unsigned char *s, size_t n)
{
    const unsigned char *end = s + n;
    while (s < end) {
        size_t k = utf8_seq(s, end);
        if (!k)
            return false;
        s += k;
    }
    return true;
}

static int hex4(const unsigned char *s, const unsigned char *end, uint32_t *out)
{
    if (end - s < 4)
        return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* Parses a string literal at p->s (which is '"'); returns the decoded text in the arena. The
 * decoded form is never longer than the literal, so the literal's length bounds the buffer. */
static char *parse_string(parser *p, size_t *len_out)
{
    const unsigned char *open = p->s++;
    const unsigned char *q = p->s;
    while (q < p->end && *q != '"') /* find the closing quote to size the buffer */
        q += (*q == '\\' && q + 1 < p->end) ? 2 : 1;
    if (q >= p->end)
        return fail(p, open, "unterminated string");
    char *out = doc_alloc(p->doc, (size_t)(q - p->s) + 1);
    if (!out)
        return fail(p, open, "out of memory");
    size_t n = 0;
    while (p->s < q) {
        const unsigned char *at = p->s;
        unsigned c = *p->s;
        if (c < 0x20)
            return fail(p, at, "control character 0x%02x in string", c);
        if (c != '\\') {
            size_t k = utf8_seq(p->s, q);
            if (!k)
                return fail(p, at, "invalid UTF-8 in string");
            memcpy(out + n, p->s, k);
            n += k;
            p->s += k;
            continue;
        }
        p->s++;
        c = *p->s++;
        switch (c) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!hex4(p->s, q, &cp))
                return fail(p, at, "bad \\u escape");
            p->s += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff)
                return fail(p, at, "unpaired low surrogate \\u%04x", (unsigned)cp);
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (q - p->s < 6 || p->s[0] != '\\' || p->s[1] != 'u' || !hex4(p->s + 2, q, &lo) ||
                    lo < 0xdc00 || lo > 0xdfff)
                    return fail(p, at, "unpaired high surrogate \\u%04x", (unsigned)cp);
                p->s += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            if (cp == 0)
                return fail(p, at, "\\u0000 in string");
            n += put_utf8(out + n, cp);
            break;
        }
        default: return fail(p, at, "bad escape '\\%c'", c >= 0x20 && c < 0x7f ? (char)c : '?');
        }
    }
    p->s = q + 1;
    out[n] = '\0';
    *len_out = n;
    return out;
}

static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }

static sbpio_json *parse_value(parser *p, int depth);

/* Growable temporary list of children (malloc'd, copied to the arena when the container closes). */
typedef struct {
    sbpio_json **items;
    char **keys;
    int n, cap;
} kids;

static bool kids_push(kids *k, char *key, sbpio_json *v)
{
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        sbpio_json **it = realloc(k->items, sizeof *it * (size_t)cap);
        if (!it)
            return false;
        k->items = it;
        char **ks = realloc(k->keys, sizeof *ks * (size_t)cap);
        if (!ks)
            return false;
        k->keys = ks;
        k->cap = cap;
    }
    k->items[k->n] = v;
    k->keys[k->n] = key;
    k->n++;
    return true;
}

static sbpio_json *parse_container(parser *p, int depth, bool object)
{
    const unsigned char *open = p->s++;
    sbpio_json *v = doc_alloc(p->doc, sizeof *v);
    if (!v)
        return fail(p, open, "out of memory");
    v->kind = object ? SBPIO_JSON_OBJECT : SBPIO_JSON_ARRAY;
    v->offset = (size_t)(open - p->start);
    kids k = {0};
    char close = object ? '}' : ']';
    skip_ws(p);
    if (p->s < p->end && *p->s == close) {
        p->s++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(p);
        if (object) {
            size_t klen;
            if (p->s >= p->end || *p->s != '"') {
                fail(p, p->s, "expected a string key");
                goto bad;
            }
            if (!(key = parse_string(p, &klen)))
                goto bad;
            skip_ws(p);
            if (p->s >= p->end || *p->s != ':') {
                fail(p, p->s, "expected ':' after key \"%s\"", key);
                goto bad;
            }
            p->s++;
        }
        sbpio_json *item = parse_value(p, depth + 1);
        if (!item)
            goto bad;
        if (!kids_push(&k, key, item)) {
            fail(p, p->s, "out of memory");
            goto bad;
        }
        skip_ws(p);
        if (p->s < p->end && *p->s == ',') {
            p->s++;
            continue;
        }
        if (p->s < p->end && *p->s == close) {
            p->s++;
            break;
        }
        fail(p, p->s, "expected ',' or '%c' in %s opened at byte %zu", close,
             object ? "object" : "array", v->offset);
        goto bad;
    }
    v->n = k.n;
    v->items = doc_alloc(p->doc, sizeof *v->items * (size_t)k.n);
    if (object)
        v->keys = doc_alloc(p->doc, sizeof *v->keys * (size_t)k.n);
    if (!v->items || (object && !v->keys)) {
        fail(p, open, "out of memory");
        goto bad;
    }
    memcpy(v->items, k.items, sizeof *v->items * (size_t)k.n);
    if (object)
        memcpy(v->keys, k.keys, sizeof *v->keys * (size_t)k.n);
    free(k.items);
    free(k.keys);
    return v;
bad:
    free(k.items);
    free(k.keys);
    return NULL;
}

static sbpio_json *parse_number(parser *p)
{
    const unsigned char *b = p->s, *s = p->s;
    if (s < p->end && *s == '-')
        s++;
    if (s >= p->end || !is_digit(*s))
        return fail(p, b, "bad number");
    if (*s == '0')
        s++;
    else
        while (s < p->end && is_digit(*s))
            s++;
    if (s < p->end && *s == '.') {
        s++;
        if (s >= p->end || !is_digit(*s))
            return fail(p, b, "bad number (digits must follow '.')");
        while (s < p->end && is_digit(*s))
            s++;
    }
    if (s < p->end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < p->end && (*s == '+' || *s == '-'))
            s++;
        if (s >= p->end || !is_digit(*s))
            return fail(p, b, "bad number (exponent without digits)");
        while (s < p->end && is_digit(*s))
            s++;
    }
    sbpio_json *v = doc_alloc(p->doc, sizeof *v);
    char *text = doc_alloc(p->doc, (size_t)(s - b) + 1);
    if (!v || !text)
        return fail(p, b, "out of memory");
    memcpy(text, b, (size_t)(s - b));
    v->kind = SBPIO_JSON_NUMBER;
    v->offset = (size_t)(b - p->start);
    v->str = text;
    v->len = (size_t)(s - b);
    p->s = s;
    return v;
}

static sbpio_json *parse_value(parser *p, int depth)
{
    if (depth > JSON_MAX_DEPTH)
        return fail(p, p->s, "nesting deeper than %d", JSON_MAX_DEPTH);
    skip_ws(p);
    if (p->s >= p->end)
        return fail(p, p->s, "unexpected end of text");
    unsigned c = *p->s;
    if (c == '{' || c == '[')
        return parse_container(p, depth, c == '{');
    if (c == '"') {
        const unsigned char *at = p->s;
        size_t n;
        char *s = parse_string(p, &n);
        if (!s)
            return NULL;
        sbpio_json *v = doc_alloc(p->doc, sizeof *v);
        if (!v)
            return fail(p, at, "out of memory");
        v->kind = SBPIO_JSON_STRING;
        v->offset = (size_t)(at - p->start);
        v->str = s;
        v->len = n;
        return v;
    }
    if (c == '-' || is_digit(c))
        return parse_number(p);
    static const struct {
        const char *word;
        sbpio_json_kind kind;
        bool b;
    } words[] = {{"true", SBPIO_JSON_BOOL, true},
                 {"false", SBPIO_JSON_BOOL, false},
                 {"null", SBPIO_JSON_NULL, false}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(p->end - p->s) >= n && memcmp(p->s, words[i].word, n) == 0) {
            sbpio_json *v = doc_alloc(p->doc, sizeof *v);
            if (!v)
                return fail(p, p->s, "out of memory");
            v->kind = words[i].kind;
            v->b = words[i].b;
            v->offset = (size_t)(p->s - p->start);
            p->s += n;
            return v;
        }
    }
    if (c >= 0x20 && c < 0x7f)
        return fail(p, p->s, "unexpected character '%c'", (char)c);
    return fail(p, p->s, "unexpected byte 0x%02x", c);
}

sbpio_json_doc *sbpio_json_parse(const char *text, size_t len, const sbpio_json **root, char *err,
                                 size_t errlen)
{
    *root = NULL;
    sbpio_json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) {
        sbpio_errf(err, errlen, "out of memory");
        return NULL;
    }
    parser p = {(const unsigned char *)text,
                (const unsigned char *)text + len,
                (const unsigned char *)text,
                doc,
                err,
                errlen,
                false};
    sbpio_json *v = parse_value(&p, 0);
    if (v) {
        skip_ws(&p);
        if (p.s != p.end)
            v = fail(&p, p.s, "trailing characters after the JSON value");
    }
    if (!v) {
        sbpio_json_free(doc);
        return NULL;
    }
    doc->root = v;
    *root = v;
    return doc;
}

const sbpio_json *sbpio_json_get(const sbpio_json *obj, const char *key)
{
    if (!obj || obj->kind != SBPIO_JSON_OBJECT)
        return NULL;
    for (int i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

bool sbpio_json_u64(const sbpio_json *v, uint64_t *out)
{
    if (!v || v->kind != SBPIO_JSON_NUMBER || v->len == 0)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < v->len; i++) {
        unsigned c = (unsigned char)v->str[i];
        if (!is_digit(c))
            return false;
        if (x > (UINT64_MAX - (c - '0')) / 10)
            return false;
        x = x * 10 + (c - '0');
    }
    *out = x;
    return true;
}

const char *sbpio_json_kind_name(sbpio_json_kind k)
{
    static const char *names[] = {"null",     "a boolean", "a number",
                                  "a string", "an array",  "an object"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* ---------------------------------------------------------------- writing */

void sbpio_sb_append(sbpio_strbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->cap - b->len < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n + 1) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            cap *= 2;
        }
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void sbpio_sb_printf(sbpio_strbuf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof tmp) {
        b->oom = true; /* only used for short numeric fragments */
        return;
    }
    sbpio_sb_append(b, tmp, (size_t)k);
}

bool sbpio_sb_json_string(sbpio_strbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (!sbpio_utf8_valid((const unsigned char *)s, n))
        return false;
    sbpio_sb_append(b, "\"", 1);
    size_t run = 0; /* bytes copied verbatim since the last escape */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char ubuf[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
                esc = ubuf;
            }
        }
        if (esc) {
            sbpio_sb_append(b, s + i - run, run);
            run = 0;
            sbpio_sb_append(b, esc, strlen(esc));
        } else {
            run++;
        }
    }
    sbpio_sb_append(b, s + n - run, run);
    sbpio_sb_append(b, "\"", 1);
    return !b->oom;
}

char *sbpio_json_quote(const char *s)
{
    sbpio_strbuf b = {0};
    if (!sbpio_sb_json_string(&b, s)) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

bool sbpio_json_object_u64(const char *text, size_t n, const char *key, uint64_t *out)
{
    const sbpio_json *root = NULL;
    char err[160];
    sbpio_json_doc *doc = sbpio_json_parse(text, n, &root, err, sizeof err);
    const sbpio_json *v = doc && root->kind == SBPIO_JSON_OBJECT ? sbpio_json_get(root, key) : NULL;
    bool ok = v && sbpio_json_u64(v, out);
    sbpio_json_free(doc);
    return ok;
}

bool sbpio_json_object_f64(const char *text, size_t n, const char *key, double *out)
{
    const sbpio_json *root = NULL;
    char err[160];
    sbpio_json_doc *doc = sbpio_json_parse(text, n, &root, err, sizeof err);
    const sbpio_json *v = doc && root->kind == SBPIO_JSON_OBJECT ? sbpio_json_get(root, key) : NULL;
    bool ok = false;
    if (v && v->kind == SBPIO_JSON_NUMBER) { /* the parser checked the literal's syntax */
        char *end = NULL;
        double x = strtod(v->str, &end);
        ok = end && *end == 0 && isfinite(x);
        if (ok)
            *out = x;
    }
    sbpio_json_free(doc);
    return ok;
}

int sbpio_json_object_ids(const char *text, size_t n, const char *key, uint64_t *ids, int max)
{
    const sbpio_json *root = NULL;
    char err[160];
    sbpio_json_doc *doc = sbpio_json_parse(text, n, &root, err, sizeof err);
    const sbpio_json *v = doc && root->kind == SBPIO_JSON_OBJECT ? sbpio_json_get(root, key) : NULL;
    int got = 0;
    if (v && v->kind == SBPIO_JSON_ARRAY) {
        for (int i = 0; i < v->n && got >= 0; i++)
            got = got < max && sbpio_json_u64(v->items[i], &ids[got]) ? got + 1 : -1;
    } else if (v && max > 0 && sbpio_json_u64(v, &ids[0])) {
        got = 1;
    }
    sbpio_json_free(doc);
    return got < 0 ? 0 : got;
}
