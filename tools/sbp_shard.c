/* sbp_shard.c — turns any file into an llm.c token shard of byte tokens (vocabulary 256).
 *
 *   sbp-shard INPUT [-o OUT.bin]        (default OUT: INPUT.bin in the current directory)
 *
 * The shard is llm.c's format version 1: a 256×int32 header (magic 20240520, version 1, token
 * count) followed by uint16 tokens — here each byte of the input as one token. It exists so that
 * a model with V=256 can be trained on text every machine has (/usr/share/common-licenses/GPL-3)
 * with `sbp-train --data`, and so the shard reader is exercised on real files.
 *
 * The input is opened without blocking and must be a regular file (a FIFO is refused, not
 * waited on); the output must not be the input (same inode: `sbp-shard x -o x` would replace
 * the text with its shard) nor a special file other than a character device, and is written
 * atomically (ir/files.h).
 */
#include "sbpio.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(const char *msg, const char *detail)
{
    fprintf(stderr, "sbp-shard: error: %s%s%s\n", msg, detail ? ": " : "", detail ? detail : "");
    return 1;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: sbp-shard INPUT [-o OUT.bin]\n"
                   "Writes INPUT's bytes as an llm.c token shard (version 1, uint16 tokens, "
                   "vocabulary 256).\n");
            return 0;
        } else if (strcmp(argv[i], "-o") == 0) {
            if (i + 1 >= argc)
                return fail("-o needs a file name", NULL);
            out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return fail("unknown option", argv[i]);
        } else if (in) {
            return fail("more than one input given", argv[i]);
        } else {
            in = argv[i];
        }
    }
    if (!in)
        return fail("no input given (see --help)", NULL);
    char err[512];
    struct stat st;
    FILE *f = sbp_file_fopen_input(in, &st, err, sizeof err);
    if (!f)
        return fail(err, NULL);
    char dflt[4096];
    if (!out) {
        const char *base = strrchr(in, '/');
        snprintf(dflt, sizeof dflt, "%s.bin", base ? base + 1 : in);
        out = dflt;
    }
    /* Before anything is read: the output must not replace the input or a special file. */
    sbp_file_set inputs = {0};
    int bad = sbp_file_set_add(&inputs, in, "the input", &st) != SBP_FILE_OK ||
              sbp_file_check_output(out, "-o", &inputs, NULL, err, sizeof err) != SBP_FILE_OK;
    sbp_file_set_free(&inputs);
    if (bad) {
        fclose(f);
        return fail(err, NULL);
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *bytes = malloc(cap);
    for (size_t got; bytes && (got = fread(bytes + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            unsigned char *nb = cap > (SIZE_MAX >> 2) ? NULL : realloc(bytes, cap * 2);
            if (!nb) {
                free(bytes);
                bytes = NULL;
                break;
            }
            bytes = nb;
            cap *= 2;
        }
    }
    int rerr = ferror(f);
    fclose(f);
    if (!bytes || rerr)
        return fail(in, bytes ? "read error" : "out of memory");
    if (n < 2 || n > INT32_MAX) {
        free(bytes);
        return fail(in, n < 2 ? "needs at least 2 bytes" : "larger than a shard can hold");
    }
    int32_t header[256] = {20240520, 1, (int32_t)n};
    sbpio_atomic a;
    if (sbpio_atomic_begin(&a, out, err, sizeof err) != SBPIO_OK) {
        free(bytes);
        return fail(err, NULL);
    }
    int ok = fwrite(header, sizeof header, 1, a.f) == 1;
    for (size_t i = 0; ok && i < n; i++) {
        uint16_t t = bytes[i]; /* little-endian on every machine we build for */
        ok = fwrite(&t, 2, 1, a.f) == 1;
    }
    free(bytes);
    if (!ok) {
        sbpio_atomic_abort(&a);
        return fail(out, "write error");
    }
    if (sbpio_atomic_commit(&a, err, sizeof err) != SBPIO_OK)
        return fail(err, NULL);
    printf("sbp-shard: %s: %zu byte tokens -> %s\n", in, n, out);
    return 0;
}
