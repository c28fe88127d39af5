/* sbpio.h — the file formats the trainer (train/) and sbpc's tools (tools/) read and write:
 * NumPy .npy arrays, llm.c token shards, safetensors, and ONNX models with updated weights.
 *
 * Every function that can fail returns SBPIO_OK or SBPIO_ERR and, on error, writes one line into
 * the caller's buffer `err` (size `errlen`; either may be NULL/0 to ignore the message) naming the
 * file and the problem, e.g. "data/x.npy: header: shape (1048576, 1048576, 1048576, 1048576)
 * overflows". Nothing here prints or exits; the caller (train/, tools/) turns the message into a
 * diagnostic.
 *
 * Byte order: every format is little-endian on disk. Readers return data in host order
 * (big-endian .npy files are byte-swapped on load); writers take host-order data.
 *
 * Writers never leave a half-written file behind: they write a temporary file in the target's
 * directory ("<dir>/.<name>.tmp.<pid>.<n>", created with the process umask, or with the mode of
 * the file it replaces), flush and fsync it, and rename it over the target; on any error, and
 * on SIGINT/SIGTERM/SIGHUP, the temporary is removed and the target is untouched (ir/files.h).
 * A character device target (/dev/null) is written in place; other special files are refused.
 * Readers open their files non-blocking and refuse anything but a regular file, so a FIFO
 * never hangs them. sbpio_atomic_* exposes the writer to other tools.
 *
 * Ownership: structs filled by a reader own their memory until the matching *_free / *_close;
 * pointers handed to writers are only read during the call.
 */
#ifndef SBP_SBPIO_H
#define SBP_SBPIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "files.h"

#define SBPIO_OK 0
#define SBPIO_ERR (-1)

/* Highest rank a .npy array or safetensors tensor may have here. */
#define SBPIO_MAX_RANK 8

/* ---------------------------------------------------------------- dtypes (util.c) */

/* Element types shared by the .npy and safetensors code. */
typedef enum {
    SBPIO_DT_INVALID = 0,
    SBPIO_DT_BOOL, /* one byte, 0 or 1 */
    SBPIO_DT_U8,
    SBPIO_DT_I8,
    SBPIO_DT_U16,
    SBPIO_DT_I16,
    SBPIO_DT_U32,
    SBPIO_DT_I32,
    SBPIO_DT_U64,
    SBPIO_DT_I64,
    SBPIO_DT_F16,  /* IEEE binary16 */
    SBPIO_DT_BF16, /* bfloat16 (safetensors only; .npy has no descr for it) */
    SBPIO_DT_F32,
    SBPIO_DT_F64,
    SBPIO_DT_COUNT
} sbpio_dtype;

/* FNV-1a over n bytes, from h (SBPIO_FNV_SEED to start): the tools' identities of data and
 * weights (checkpoints, datasets, caches), not a defence against crafted collisions. */
#define SBPIO_FNV_SEED 0xcbf29ce484222325ULL
uint64_t sbpio_fnv1a(uint64_t h, const void *p, size_t n);

/* Bytes per element; 0 for SBPIO_DT_INVALID or an out-of-range value. */
size_t sbpio_dtype_size(sbpio_dtype t);
/* The safetensors name: "F32", "I64", "BOOL", ...; "?" when invalid. */
const char *sbpio_dtype_name(sbpio_dtype t);
/* Parses a safetensors dtype name; SBPIO_DT_INVALID when unknown. */
sbpio_dtype sbpio_dtype_from_name(const char *name);
bool sbpio_dtype_is_float(sbpio_dtype t); /* F16, BF16, F32, F64 */
bool sbpio_dtype_is_int(sbpio_dtype t);   /* BOOL, U8..U64, I8..I64 */

/* ---------------------------------------------------------------- arrays and .npy (npy.c) */

/* A dense row-major array in host byte order. */
typedef struct sbpio_array {
    sbpio_dtype dtype;
    int rank;                      /* 0 for a scalar */
    int64_t shape[SBPIO_MAX_RANK]; /* [rank] */
    int64_t numel;                 /* product of shape (1 for a scalar) */
    size_t nbytes;                 /* numel * sbpio_dtype_size(dtype) */
    void *data;                    /* [numel] elements, malloc'd, owned; NULL when nbytes == 0 */
} sbpio_array;

void sbpio_array_free(sbpio_array *a); /* frees data and zeroes *a; NULL-safe */

/* Converts a in place to dtype `to`:
 *   to an integer type: from any integer type (and BOOL), every element range-checked; the
 *     error names the first element that does not fit by its multi-index and value;
 *   to F32/F64: from F16, BF16, F32, F64 (a finite F64 that overflows F32 is an error).
 * Integer <-> float conversions are refused. `what` (e.g. the file name) prefixes the message. */
int sbpio_array_convert(sbpio_array *a, sbpio_dtype to, const char *what, char *err, size_t errlen);

/* Reads a .npy file (format versions 1.0, 2.0 and 3.0). Supported descrs: b1, u1, i1, u2, i2, u4,
 * i4, u8, i8, f2, f4, f8 with '<', '>' (byte-swapped), '=' or '|' (one-byte types) byte order.
 * Refused, with a message saying which: object/string/structured dtypes, Fortran order (except
 * where it equals C order: at most one dim > 1), rank > SBPIO_MAX_RANK, shapes whose byte size
 * overflows, and a data section whose length is not exactly numel * itemsize (checked before
 * anything is allocated). On error *out is left zeroed. */
int sbpio_npy_read(const char *path, sbpio_array *out, char *err, size_t errlen);
/* The same from memory; `name` stands for the file in messages. */
int sbpio_npy_read_mem(const void *buf, size_t len, const char *name, sbpio_array *out, char *err,
                       size_t errlen);
/* sbpio_npy_read + sbpio_array_convert: integer arrays (token ids, labels) to int32, float arrays
 * to float or double. */
int sbpio_npy_read_i32(const char *path, sbpio_array *out, char *err, size_t errlen);
int sbpio_npy_read_f32(const char *path, sbpio_array *out, char *err, size_t errlen);
int sbpio_npy_read_f64(const char *path, sbpio_array *out, char *err, size_t errlen);

/* Writes a version 1.0 .npy file (C order, little-endian descr) atomically. shape may be NULL
 * when rank == 0; data holds numel elements of dtype in host order (NULL allowed when numel is
 * 0). BF16 has no .npy descr and is refused. */
int sbpio_npy_write(const char *path, sbpio_dtype dtype, int rank, const int64_t *shape,
                    const void *data, char *err, size_t errlen);
static inline int sbpio_npy_write_array(const char *path, const sbpio_array *a, char *err,
                                        size_t errlen)
{
    return sbpio_npy_write(path, a->dtype, a->rank, a->shape, a->data, err, errlen);
}

/* ---------------------------------------------------------------- llm.c token shards (shard.c) */

/* llm.c's .bin token shard: a header of 256 little-endian int32 (header[0] magic, header[1]
 * version, header[2] token count) followed by the tokens:
 *   magic 20240520, version 1: uint16 tokens (GPT-2 vocabulary);
 *   magic 20240801, version 7: uint32 tokens (large vocabularies, e.g. Llama 3).
 * Batches follow llm.c's DataLoader: a batch takes B*T+1 consecutive tokens starting at `pos`;
 * row b's input_ids are tokens [pos+b*T, pos+b*T+T) and its labels the next tokens
 * [pos+b*T+1, pos+b*T+T+1); pos then advances by B*T. When fewer than B*T+1 tokens remain, the
 * shard wraps: pos returns to 0 and `epoch` counts up (no window ever straddles the end). */
#define SBPIO_SHARD_HEADER_INTS 256
#define SBPIO_SHARD_MAGIC_U16 20240520
#define SBPIO_SHARD_VERSION_U16 1
#define SBPIO_SHARD_MAGIC_U32 20240801
#define SBPIO_SHARD_VERSION_U32 7

typedef struct sbpio_shard {
    char *path;         /* strdup'd, for messages */
    int version;        /* 1 (uint16 tokens) or 7 (uint32 tokens) */
    size_t token_size;  /* 2 or 4 */
    int64_t ntok;       /* number of tokens (header[2]) */
    unsigned char *raw; /* [ntok * token_size] little-endian tokens, malloc'd */
    int64_t pos;        /* first token of the next batch */
    int64_t epoch;      /* how many times the batches wrapped to the start */
} sbpio_shard;

/* Opens and fully reads a shard; validates magic, version and file size == 1024 + ntok * size.
 * On error *s is left zeroed. */
int sbpio_shard_open(const char *path, sbpio_shard *s, char *err, size_t errlen);
void sbpio_shard_close(sbpio_shard *s); /* NULL-safe; zeroes *s */
/* Token i (0 <= i < ntok). */
uint32_t sbpio_shard_token(const sbpio_shard *s, int64_t i);
/* Checks every token < vocab; the error names the first offending position and value. */
int sbpio_shard_check_vocab(const sbpio_shard *s, int64_t vocab, char *err, size_t errlen);
/* Fills input_ids [B,T] and labels [B,T] (row-major int32) with the next batch and advances.
 * Errors: B or T < 1, B*T+1 > ntok (the shard is too short for one batch), a token > INT32_MAX,
 * pos outside [0, ntok], a wrap when epoch is negative or INT64_MAX (it would overflow). */
int sbpio_shard_next_batch(sbpio_shard *s, int B, int T, int32_t *input_ids, int32_t *labels,
                           char *err, size_t errlen);
/* Sets the position of the next batch (0 <= pos < ntok). */
int sbpio_shard_seek(sbpio_shard *s, int64_t pos, char *err, size_t errlen);

/* ---------------------------------------------------------------- safetensors (safetensors.c) */

/* One tensor to write. data: numel * dtype_size bytes in host order (may be NULL if numel 0).
 * Or, with data NULL, fill: called in order for consecutive pieces of the tensor's bytes
 * [offset, offset + bytes) (whole elements, at most 4 MiB), which it writes to buf in host
 * order; a nonzero return fails the write (the file is not created), with its message in err. */
typedef struct sbpio_st_tensor {
    const char *name; /* any UTF-8 string except "__metadata__"; JSON-escaped on output */
    sbpio_dtype dtype;
    int rank;             /* 0..SBPIO_MAX_RANK */
    const int64_t *shape; /* [rank] */
    const void *data;
    int (*fill)(void *arg, size_t offset, void *buf, size_t bytes, char *err, size_t errlen);
    void *fill_arg;
} sbpio_st_tensor;

typedef struct sbpio_kv {
    const char *key;
    const char *value;
} sbpio_kv;

/* Writes a safetensors file atomically: 8-byte little-endian header size, the JSON header
 * ({"__metadata__":{...}} first when nmeta > 0, then one entry per tensor with dtype, shape and
 * data_offsets), padded with spaces to a multiple of 8, then the tensor data back to back in
 * header order. With `sorted` the tensors are ordered by name (byte-wise, as Python's sorted());
 * otherwise in the given order. Duplicate names are an error. */
int sbpio_st_write(const char *path, int n, const sbpio_st_tensor *tensors, int nmeta,
                   const sbpio_kv *meta, bool sorted, char *err, size_t errlen);

/* A tensor of an opened file. data points into the file's buffer (valid until close); it is
 * aligned for the dtype whenever the tensor's begin offset is a multiple of its element size
 * (true of files written by sbpio, the safetensors library and PyTorch). */
typedef struct sbpio_st_info {
    const char *name;
    sbpio_dtype dtype;
    int rank;
    int64_t shape[SBPIO_MAX_RANK]; /* [rank] */
    int64_t numel;
    size_t nbytes;
    uint64_t begin, end; /* data_offsets, relative to the data section */
    const void *data;    /* [nbytes], little-endian as stored */
} sbpio_st_info;

typedef struct sbpio_st_file sbpio_st_file; /* opaque */

/* Reads a safetensors file into memory and validates it: header size within the file (and at
 * most 100 MB), the header a JSON object; each tensor entry with a known dtype, a shape of
 * non-negative integers, data_offsets [begin, end] with begin <= end <= data size and
 * end - begin == numel * dtype size; no two tensors' byte ranges overlap; "__metadata__", when
 * present, maps strings to strings. On error *out is NULL. */
int sbpio_st_open(const char *path, sbpio_st_file **out, char *err, size_t errlen);
/* Like sbpio_st_open, with the same checks (the offsets against the file's size), but reads only
 * the header and keeps the file open: the tensors' `data` are NULL, and sbpio_st_copy_* read the
 * elements asked for from the file. For files larger than what a caller wants in memory at once
 * (sbp-train's checkpoints: under ZeRO each rank reads its own slice of the moments). */
int sbpio_st_open_header(const char *path, sbpio_st_file **out, char *err, size_t errlen);
void sbpio_st_close(sbpio_st_file *f); /* NULL-safe */
const char *sbpio_st_path(const sbpio_st_file *f);
int sbpio_st_count(const sbpio_st_file *f);
/* Tensor i in header order (0 <= i < count); NULL when out of range. */
const sbpio_st_info *sbpio_st_at(const sbpio_st_file *f, int i);
/* NULL when there is no tensor of that name. */
const sbpio_st_info *sbpio_st_find(const sbpio_st_file *f, const char *name);
/* Like sbpio_st_find, but a missing tensor is an error naming file and tensor. */
int sbpio_st_get(const sbpio_st_file *f, const char *name, const sbpio_st_info **out, char *err,
                 size_t errlen);
/* Copies the named tensor into dst ([n] elements, n must equal its numel) converting F16, BF16,
 * F32 or F64 to double / float. */
int sbpio_st_copy_f64(const sbpio_st_file *f, const char *name, double *dst, int64_t n, char *err,
                      size_t errlen);
int sbpio_st_copy_f32(const sbpio_st_file *f, const char *name, float *dst, int64_t n, char *err,
                      size_t errlen);
/* Elements [first, first + n) of the named tensor, which must hold `total` elements. */
int sbpio_st_copy_f32_range(const sbpio_st_file *f, const char *name, float *dst, int64_t total,
                            int64_t first, int64_t n, char *err, size_t errlen);
/* Elements [first, first + n) of tensor t of f, as stored (little-endian bytes, any dtype),
 * into dst (n * dtype size bytes); from memory or, for a header-only open, from the file. */
int sbpio_st_read_range(const sbpio_st_file *f, const sbpio_st_info *t, int64_t first, int64_t n,
                        void *dst, char *err, size_t errlen);
/* Metadata: value of key, or NULL when absent; and the entries in header order. */
const char *sbpio_st_meta(const sbpio_st_file *f, const char *key);
int sbpio_st_meta_count(const sbpio_st_file *f);
const sbpio_kv *sbpio_st_meta_at(const sbpio_st_file *f, int i);
/* Parses a safetensors image held in memory (the whole file); `name` stands for the file in
 * messages. The buffer is copied. */
int sbpio_st_open_mem(const void *buf, size_t len, const char *name, sbpio_st_file **out, char *err,
                      size_t errlen);

/* ---------------------------------------------------------------- ONNX metadata (onnx_meta.c) */

/* JSON for the tools' own small files, through json.c's parser and escaper (one of each):
 * s as a JSON string literal (quotes included), malloc'd, or NULL when s is not valid UTF-8 (or
 * out of memory); and the member `key` of a JSON object given as text (a JSONL line) as a
 * non-negative integer: true and *out, false when the text is not an object or the member is
 * missing or no such integer. */
char *sbpio_json_quote(const char *s);
bool sbpio_json_object_u64(const char *text, size_t n, const char *key, uint64_t *out);
/* The member `key` of a JSON object given as text as a finite number (any JSON number): true
 * and *out, false when missing or not a number. */
bool sbpio_json_object_f64(const char *text, size_t n, const char *key, double *out);
/* The member `key` of a JSON object as token ids: a non-negative integer, or an array of them
 * (transformers' eos_token_id is either). Returns how many were stored into ids[0..max), 0
 * when the text is not an object, the member is missing, or it is neither (or holds more than
 * max). */
int sbpio_json_object_ids(const char *text, size_t n, const char *key, uint64_t *ids, int max);

/* The model's metadata_props (ModelProto field 14, e.g. sbp-export's "sbp.config.json"), read
 * without unpacking the graph: *out gets *n entries (keys and values malloc'd; free with
 * sbpio_onnx_meta_free). */
int sbpio_onnx_meta_read(const char *path, sbpio_kv **out, int *n, char *err, size_t errlen);
void sbpio_onnx_meta_free(sbpio_kv *kv, int n);
/* The value of key among kv[0..n), or NULL. */
const char *sbpio_onnx_meta_get(const sbpio_kv *kv, int n, const char *key);

/* ---------------------------------------------------------------- datasets (dataset.c) */

/* A tokenised dataset as sbp-prepare writes it (docs/dataset-format.md): one safetensors file
 * with input_ids and labels (int32, every example back to back, labels already shifted: the
 * target of each position, -100 where not scored), offsets (int64 [n_ex + 1]) and, for grpo,
 * advantages (float32 [n_ex]). The open reads the header, the offsets and the per-example
 * fields, and checks every token and label in pieces (memory stays flat: a dataset is not
 * held in memory); examples are then read on demand. */
typedef struct sbpio_dataset {
    sbpio_st_file *f;     /* opened header only */
    const sbpio_st_info *ids, *labels; /* the two token tensors of f */
    char task[8];         /* "sft" | "dpo" | "grpo" */
    int64_t n_ex;         /* examples */
    int64_t n_tok;        /* tokens of all examples */
    int64_t scored;       /* labels that are not -100 */
    int64_t max_len;      /* the longest example allowed (metadata max_len) */
    int64_t longest;      /* the longest example there is */
    int64_t vocab;        /* metadata vocab_size: every id is below it */
    int64_t eos_id, pad_id;
    int64_t *offsets;     /* [n_ex + 1] */
    float *advantages;    /* [n_ex], grpo; else NULL */
    uint64_t hash;        /* FNV-1a over ids, labels, offsets (and advantages): the data's identity */
} sbpio_dataset;

/* Opens and validates path: the format and version, the tensors' dtypes and shapes, the
 * offsets (from 0, strictly increasing, ending at n_tok, no example longer than max_len),
 * every id in [0, vocab), every label -100 or the next token of its example (the last
 * position's -100), a scored label in every example, the metadata's counts against the data,
 * dpo's even count, grpo's finite
 * advantages. vocab > 0: the step's vocabulary, which the dataset's must not exceed. */
int sbpio_dataset_open(const char *path, int64_t vocab, sbpio_dataset *d, char *err,
                       size_t errlen);
void sbpio_dataset_close(sbpio_dataset *d); /* NULL-safe; zeroes *d */
/* Example i's length, and its ids and labels into ids / labels [length]. */
int64_t sbpio_dataset_len(const sbpio_dataset *d, int64_t i);
int sbpio_dataset_example(const sbpio_dataset *d, int64_t i, int32_t *ids, int32_t *labels,
                          char *err, size_t errlen);

/* ---------------------------------------------------------------- ONNX (onnx_save.c) */

/* Rewrites the ONNX model in_model with new data for n FLOAT initializers of its main graph:
 * names[i] gets data[i], which must hold exactly the initializer's numel floats. The data is
 * stored as raw_data (float_data cleared). Every initializer the input kept in external data
 * (and every replaced one) is inlined, as long as the whole model stays under the protobuf
 * limit (1.5 GB here); otherwise large tensors (>= 1 KiB) are written to "<out_model>.data" next
 * to the output and referenced by a relative location. External data of the input is read
 * relative to in_model's directory and must stay inside it. The output is written atomically
 * (temporary file + rename); in_model and out_model may be the same file.
 * Errors: unreadable or unparsable model, a name not found, found twice in `names`, or not a
 * FLOAT initializer, dims that are negative or overflow, external data out of range. */
int sbpio_onnx_save_with_weights(const char *in_model, const char *out_model, int n,
                                 const char *const *names, const float *const *data, char *err,
                                 size_t errlen);

typedef struct sbpio_onnx_save_opts {
    /* When the packed model would exceed this many bytes, tensors go to "<out>.data".
     * 0 means the default, 1.5e9; set it small (e.g. 1) to force external data. */
    uint64_t inline_limit;
    /* Tensors smaller than this stay inline even in external mode; 0 means 1024. */
    uint64_t external_min_bytes;
} sbpio_onnx_save_opts;

/* sbpio_onnx_save_with_weights with two additions: numel (may be NULL) gives the number of
 * floats data[i] holds, which must equal the initializer's element count (a guard against
 * writing into a model whose shapes differ from the ones the caller's buffers were made for);
 * opts may be NULL for the defaults. */
int sbpio_onnx_save_ex(const char *in_model, const char *out_model, int n, const char *const *names,
                       const float *const *data, const int64_t *numel,
                       const sbpio_onnx_save_opts *opts, char *err, size_t errlen);

/* ---------------------------------------------------------------- atomic files (util.c) */

/* The atomic writer of ir/files.h (sbp_atomic): f to write, path (the target), tmp (the
 * temporary, NULL when the target is a character device written in place). */
typedef sbp_atomic sbpio_atomic;

/* Creates the temporary file next to path (with the permissions of the file it replaces) and
 * opens it for writing; a character device (/dev/null) is opened in place; any other existing
 * non-regular file is refused. */
int sbpio_atomic_begin(sbpio_atomic *a, const char *path, char *err, size_t errlen);
/* Flushes, fsyncs, closes and renames the temporary over the target; on any failure the
 * temporary is removed. *a is released either way. */
int sbpio_atomic_commit(sbpio_atomic *a, char *err, size_t errlen);
/* Closes and removes the temporary; NULL-safe and safe after commit. */
void sbpio_atomic_abort(sbpio_atomic *a);

#endif /* SBP_SBPIO_H */
