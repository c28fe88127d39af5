/* util.c — the small things every sbpio format needs: error messages into the caller's buffer,
 * the dtype table, checked shape arithmetic, byte swapping, half-precision conversion, exact
 * reads, little-endian writes, and the atomic-file writer (ir/files.c: temporary file in the
 * target's directory, fsync, rename; removed again on any error or signal).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io_internal.h"

int sbpio_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return SBPIO_ERR;
}

/* ---------------------------------------------------------------- dtypes */

static const struct {
    const char *name; /* safetensors */
    size_t size;
} dtype_table[SBPIO_DT_COUNT] = {
    [SBPIO_DT_INVALID] = {"?", 0}, [SBPIO_DT_BOOL] = {"BOOL", 1}, [SBPIO_DT_U8] = {"U8", 1},
    [SBPIO_DT_I8] = {"I8", 1},     [SBPIO_DT_U16] = {"U16", 2},   [SBPIO_DT_I16] = {"I16", 2},
    [SBPIO_DT_U32] = {"U32", 4},   [SBPIO_DT_I32] = {"I32", 4},   [SBPIO_DT_U64] = {"U64", 8},
    [SBPIO_DT_I64] = {"I64", 8},   [SBPIO_DT_F16] = {"F16", 2},   [SBPIO_DT_BF16] = {"BF16", 2},
    [SBPIO_DT_F32] = {"F32", 4},   [SBPIO_DT_F64] = {"F64", 8},
};

size_t sbpio_dtype_size(sbpio_dtype t)
{
    return (t > SBPIO_DT_INVALID && t < SBPIO_DT_COUNT) ? dtype_table[t].size : 0;
}

const char *sbpio_dtype_name(sbpio_dtype t)
{
    return (t > SBPIO_DT_INVALID && t < SBPIO_DT_COUNT) ? dtype_table[t].name : "?";
}

sbpio_dtype sbpio_dtype_from_name(const char *name)
{
    for (int t = 1; t < SBPIO_DT_COUNT; t++)
        if (name && strcmp(name, dtype_table[t].name) == 0)
            return (sbpio_dtype)t;
    return SBPIO_DT_INVALID;
}

bool sbpio_dtype_is_float(sbpio_dtype t)
{
    return t == SBPIO_DT_F16 || t == SBPIO_DT_BF16 || t == SBPIO_DT_F32 || t == SBPIO_DT_F64;
}

bool sbpio_dtype_is_int(sbpio_dtype t) { return t >= SBPIO_DT_BOOL && t <= SBPIO_DT_I64; }

/* ---------------------------------------------------------------- shapes and bytes */

bool sbpio_shape_bytes(int rank, const int64_t *shape, size_t itemsize, int64_t *numel,
                       size_t *nbytes)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        if (!sbpio_mul_i64(n, shape[i], &n))
            return false;
    uint64_t b;
    if (!sbpio_mul_u64((uint64_t)n, itemsize, &b) || b > SIZE_MAX)
        return false;
    *numel = n;
    *nbytes = (size_t)b;
    return true;
}

char *sbpio_shape_str(int rank, const int64_t *shape, char *buf, size_t n)
{
    size_t k = 0;
    if (n == 0)
        return buf;
    buf[0] = '\0';
    k += (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, rank == 1 ? ",)" : ")");
    return buf;
}

void sbpio_byteswap(void *data, size_t n, size_t size)
{
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

float sbpio_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) { /* inf / nan */
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float sbpio_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* ---------------------------------------------------------------- file helpers */

int64_t sbpio_file_size(FILE *f)
{
    struct stat st;
    if (fstat(fileno(f), &st) != 0)
        return -1;
    if (!S_ISREG(st.st_mode)) {
        errno = EINVAL;
        return -1;
    }
    return (int64_t)st.st_size;
}

bool sbpio_read_exact(FILE *f, void *buf, size_t n) { return n == 0 || fread(buf, 1, n, f) == n; }

bool sbpio_write_le(FILE *f, const void *data, size_t n, size_t size)
{
    if (n == 0 || size == 0)
        return true;
    if (sbpio_host_is_le() || size == 1)
        return fwrite(data, size, n, f) == n;
    unsigned char tmp[4096];
    const unsigned char *p = data;
    size_t per = sizeof tmp / size;
    while (n) {
        size_t k = n < per ? n : per;
        memcpy(tmp, p, k * size);
        sbpio_byteswap(tmp, k, size);
        if (fwrite(tmp, size, k, f) != k)
            return false;
        p += k * size;
        n -= k;
    }
    return true;
}

uint64_t sbpio_fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

char *sbpio_dirname(const char *path) { return sbp_path_dir(path); }

const char *sbpio_basename(const char *path) { return sbp_path_base(path); }

/* ---------------------------------------------------------------- atomic files */

/* The writer lives in ir/files.c, shared with the compiler's outputs. */
int sbpio_atomic_begin(sbpio_atomic *a, const char *path, char *err, size_t errlen)
{
    return sbp_atomic_begin(a, path, err, errlen) == SBP_FILE_OK ? SBPIO_OK : SBPIO_ERR;
}

int sbpio_atomic_commit(sbpio_atomic *a, char *err, size_t errlen)
{
    return sbp_atomic_commit(a, err, errlen) == SBP_FILE_OK ? SBPIO_OK : SBPIO_ERR;
}

void sbpio_atomic_abort(sbpio_atomic *a) { sbp_atomic_abort(a); }
