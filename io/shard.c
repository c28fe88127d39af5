/* shard.c — llm.c token shards (.bin): validation, vocabulary check, and batches of consecutive
 * token windows for next-token training.
 *
 * A shard is 256 little-endian int32 (magic, version, token count, then unused) followed by the
 * tokens: uint16 for magic 20240520 / version 1, uint32 for magic 20240801 / version 7. The
 * file size must be exactly 1024 + count * token size; every mismatch is reported with the
 * numbers involved. The shard is read into memory whole (a 100M-token uint16 shard is 200 MB) and
 * tokens are decoded little-endian on access, so the code does not depend on the host's byte
 * order. Batching follows llm.c's DataLoader (see sbpio.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io_internal.h"

int sbpio_shard_open(const char *path, sbpio_shard *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    FILE *f = sbp_file_fopen_input(path, NULL, err, errlen); /* never blocks on a FIFO */
    if (!f)
        return SBPIO_ERR;
    int rc = SBPIO_ERR;
    unsigned char *raw = NULL;
    unsigned char hdr[SBPIO_SHARD_HEADER_INTS * 4];
    int64_t size = sbpio_file_size(f);
    if (size < 0) {
        sbpio_errf(err, errlen, "%s: %s", path,
                   errno == EINVAL ? "not a regular file" : strerror(errno));
        goto done;
    }
    if (size < (int64_t)sizeof hdr) {
        sbpio_errf(err, errlen,
                   "%s: file is %" PRId64 " bytes, shorter than the %zu-byte llm.c shard header",
                   path, size, sizeof hdr);
        goto done;
    }
    if (!sbpio_read_exact(f, hdr, sizeof hdr)) {
        sbpio_errf(err, errlen, "%s: read error in the header", path);
        goto done;
    }
    int32_t magic = (int32_t)sbpio_le32(hdr), version = (int32_t)sbpio_le32(hdr + 4);
    uint32_t ntok = sbpio_le32(hdr + 8);
    size_t tsize;
    if (magic == SBPIO_SHARD_MAGIC_U16) {
        if (version != SBPIO_SHARD_VERSION_U16) {
            sbpio_errf(err, errlen,
                       "%s: unsupported version %" PRId32
                       " for magic %d (uint16 tokens need version %d)",
                       path, version, SBPIO_SHARD_MAGIC_U16, SBPIO_SHARD_VERSION_U16);
            goto done;
        }
        tsize = 2;
    } else if (magic == SBPIO_SHARD_MAGIC_U32) {
        if (version != SBPIO_SHARD_VERSION_U32) {
            sbpio_errf(err, errlen,
                       "%s: unsupported version %" PRId32
                       " for magic %d (uint32 tokens need version %d)",
                       path, version, SBPIO_SHARD_MAGIC_U32, SBPIO_SHARD_VERSION_U32);
            goto done;
        }
        tsize = 4;
    } else {
        sbpio_errf(err, errlen,
                   "%s: bad magic %" PRId32 " (an llm.c token shard starts with %d or %d)", path,
                   magic, SBPIO_SHARD_MAGIC_U16, SBPIO_SHARD_MAGIC_U32);
        goto done;
    }
    uint64_t want = (uint64_t)sizeof hdr + (uint64_t)ntok * tsize; /* no overflow: ntok < 2^32 */
    if ((uint64_t)size != want) {
        sbpio_errf(err, errlen,
                   "%s: file is %" PRId64 " bytes but the header's %" PRIu32
                   " tokens of %zu bytes need %" PRIu64 " (1024-byte header + data)%s",
                   path, size, ntok, tsize, want,
                   (uint64_t)size < want ? ": truncated" : ": trailing bytes");
        goto done;
    }
    if (want - sizeof hdr > SIZE_MAX) {
        sbpio_errf(err, errlen, "%s: too large for this platform", path);
        goto done;
    }
    size_t nbytes = (size_t)(want - sizeof hdr);
    if (nbytes && !(raw = malloc(nbytes))) {
        sbpio_errf(err, errlen, "%s: out of memory (%zu bytes)", path, nbytes);
        goto done;
    }
    if (!sbpio_read_exact(f, raw, nbytes)) {
        sbpio_errf(err, errlen, "%s: read error in the token data", path);
        goto done;
    }
    if (!(s->path = strdup(path))) {
        sbpio_errf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    s->version = version;
    s->token_size = tsize;
    s->ntok = ntok;
    s->raw = raw;
    raw = NULL;
    rc = SBPIO_OK;
done:
    free(raw);
    fclose(f);
    return rc;
}

void sbpio_shard_close(sbpio_shard *s)
{
    if (!s)
        return;
    free(s->path);
    free(s->raw);
    memset(s, 0, sizeof *s);
}

uint32_t sbpio_shard_token(const sbpio_shard *s, int64_t i)
{
    const unsigned char *p = s->raw + (size_t)i * s->token_size;
    return s->token_size == 2 ? sbpio_le16(p) : sbpio_le32(p);
}

int sbpio_shard_check_vocab(const sbpio_shard *s, int64_t vocab, char *err, size_t errlen)
{
    if (vocab <= 0)
        return sbpio_errf(err, errlen, "%s: vocabulary size %" PRId64 " must be positive", s->path,
                          vocab);
    for (int64_t i = 0; i < s->ntok; i++) {
        uint32_t t = sbpio_shard_token(s, i);
        if ((int64_t)t >= vocab)
            return sbpio_errf(err, errlen,
                              "%s: token %" PRIu32 " at position %" PRId64
                              " is outside the vocabulary (size %" PRId64 ")",
                              s->path, t, i, vocab);
    }
    return SBPIO_OK;
}

int sbpio_shard_seek(sbpio_shard *s, int64_t pos, char *err, size_t errlen)
{
    if (pos < 0 || pos >= s->ntok)
        return sbpio_errf(err, errlen,
                          "%s: position %" PRId64 " outside the shard's %" PRId64 " tokens",
                          s->path, pos, s->ntok);
    s->pos = pos;
    return SBPIO_OK;
}

int sbpio_shard_next_batch(sbpio_shard *s, int B, int T, int32_t *input_ids, int32_t *labels,
                           char *err, size_t errlen)
{
    if (B < 1 || T < 1)
        return sbpio_errf(err, errlen, "%s: batch shape B=%d T=%d must be positive", s->path, B, T);
    int64_t bt = (int64_t)B * T, need = bt + 1;
    if (need > s->ntok)
        return sbpio_errf(err, errlen,
                          "%s: shard has %" PRId64 " tokens, fewer than the %" PRId64
                          " one batch of B=%d T=%d needs (B*T+1)",
                          s->path, s->ntok, need, B, T);
    /* pos and epoch may come from a checkpoint (sbpio_shard_seek checks pos; the caller sets
     * epoch): checked here too, so that no value makes the arithmetic below overflow */
    if (s->pos < 0 || s->pos > s->ntok)
        return sbpio_errf(err, errlen, "%s: position %" PRId64 " outside the shard's %" PRId64
                          " tokens", s->path, s->pos, s->ntok);
    if (s->pos > s->ntok - need) { /* wrap: start the next pass over the shard */
        if (s->epoch < 0 || s->epoch == INT64_MAX)
            return sbpio_errf(err, errlen, "%s: pass %" PRId64 " over the shard cannot be "
                              "counted (the pass counter is out of range)", s->path, s->epoch);
        s->pos = 0;
        s->epoch++;
    }
    for (int64_t i = 0; i < bt; i++) {
        uint32_t x = sbpio_shard_token(s, s->pos + i), y = sbpio_shard_token(s, s->pos + i + 1);
        if (x > INT32_MAX || y > INT32_MAX) {
            int64_t at = x > INT32_MAX ? s->pos + i : s->pos + i + 1;
            return sbpio_errf(err, errlen,
                              "%s: token %" PRIu32 " at position %" PRId64 " does not fit int32",
                              s->path, x > INT32_MAX ? x : y, at);
        }
        input_ids[i] = (int32_t)x;
        labels[i] = (int32_t)y;
    }
    s->pos += bt;
    return SBPIO_OK;
}
