/* test_ckpt_state.c — cmocka tests of what sbp-train's checkpoints let in and out
 * (train/train_ckpt.c, on a one-tensor step described by hand, no step library):
 *   - a checkpoint is never written with a non-finite weight, a non-finite m, or a negative v:
 *     the write fails with one message naming the tensor, leaves no file and no temporary, and
 *     the previous checkpoint stays as it was; this holds for weights copied back from a
 *     device, and for moments that arrive piece by piece from the ranks (ZeRO's fill);
 *   - a resume refuses a checkpoint whose moments are not, in the slice this rank reads;
 *   - the shard's cursor arithmetic refuses a position or a pass count it cannot go on from.
 * sbp-train's own finite check after each update catches a host step's overflow first, so these
 * paths are driven here directly; tests/hardening/ckpt_case.sh covers them end to end.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbpio.h"
#include "train_ckpt.h"

enum { N = 16 }; /* W [4,4]: the parameter block, the gradient block and each moment */

static const sbp_step_param param_w = {
    .name = "W", .rank = 2, .dims = {4, 4}, .numel = N, .offset = 0, .trainable = 1,
    .tied_to = -1, .grad_offset = 0, .storage = SBP_STEP_PARAM_F32};
static const sbp_step_info info = {
    .abi_version = SBP_STEP_ABI_VERSION, .target = "cpu", .strategy = "store", .objective = "sft",
    .batch = 1, .seq_len = 2, .vocab = 4, .n_params = 1, .params = &param_w, .param_elems = N,
    .grad_elems = N};
static const int32_t ids[2] = {1, 2}, labels[2] = {2, 3};

/* One run's memory: what the backend holds (dev_*) and the host copy of the parameters. */
typedef struct fixture {
    char dir[256];
    train_ckpt_opts o;
    train_ckpt c;
    train_ckpt_run r;
    float host[N], dev[N], m[N], v[N];
    float fill_m[N], fill_v[N]; /* the whole moments the ranks' fill hands out */
} fixture;

static int copy_bytes(sbprt_ctx *ctx, void *dst, const void *src, size_t n, int kind)
{
    (void)ctx, (void)kind;
    memcpy(dst, src, n);
    return 0;
}

static int fill_state(void *arg, int which, size_t first, float *dst, size_t n, char *err,
                      size_t errlen)
{
    (void)err, (void)errlen;
    const fixture *f = arg;
    memcpy(dst, (which ? f->fill_v : f->fill_m) + first, n * sizeof *dst);
    return 0;
}

static void fresh_dir(char *dir, size_t n, const char *name)
{
    const char *work = getenv("WORK");
    snprintf(dir, n, "%s/ckpt_state_%s", work && *work ? work : "/tmp", name);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(mkdir(dir, 0777), 0);
}

/* A run of 10 AdamW steps with a checkpoint after every step into a fresh folder; the weights
 * and moments finite. host_visible: the backend's memory is the host's (dev unused). */
static void start_run(fixture *f, const char *name, bool host_visible, bool fill)
{
    memset(f, 0, sizeof *f);
    fresh_dir(f->dir, sizeof f->dir, name);
    for (int i = 0; i < N; i++) {
        f->host[i] = f->dev[i] = 0.01f * (float)i;
        f->m[i] = f->fill_m[i] = -0.001f * (float)i;
        f->v[i] = f->fill_v[i] = 0.0001f * (float)i;
    }
    f->o = (train_ckpt_opts){.dir = f->dir, .every = 1, .keep = 4};
    char err[1024] = "";
    if (train_ckpt_prepare(&f->c, &f->o, NULL, err, sizeof err))
        fail_msg("%s", err);
    f->r = (train_ckpt_run){
        .in = &info, .step_path = "step.so", .adamw = true, .grad_accum = 1, .total_steps = 10,
        .lr = 0.1, .ids = ids, .labels = labels, .ntok_all = 2, .pbytes = sizeof f->host,
        .gbytes = sizeof f->m, .d_params = host_visible ? f->host : f->dev, .d_m = f->m,
        .d_v = f->v, .host_params = f->host, .host_visible = host_visible, .ranks = 1,
        .copy = copy_bytes};
    if (fill) {
        f->r.state_fill = fill_state;
        f->r.state_arg = f;
        f->r.state_lo = 0;
        f->r.state_n = N;
    }
}

/* The folder's entries, sorted, with each file's bytes' checksum: "name:sum;..." */
static void snapshot(const char *dir, char *out, size_t n)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "cd '%s' && ls -A | sort | while read -r f; do "
             "printf '%%s:%%s;' \"$f\" \"$(cksum <\"$f\")\"; done", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t k = fread(out, 1, n - 1, p);
    out[k] = 0;
    assert_int_equal(pclose(p), 0);
}

/* Step 1's checkpoint written, then the state spoiled by `spoil`: step 2's write must fail
 * with a message holding `want`, and leave the folder as it was (step 1's file, nothing else). */
static void refused_write(fixture *f, const char *want)
{
    char err[1024] = "", before[2048], after[2048];
    snapshot(f->dir, before, sizeof before);
    assert_int_equal(train_ckpt_after_step(&f->c, 2, 0, err, sizeof err), -1);
    if (!strstr(err, want))
        fail_msg("message '%s' lacks '%s'", err, want);
    assert_non_null(strstr(err, "the previous one, of step 1, is intact"));
    assert_null(strchr(err, '\n'));
    snapshot(f->dir, after, sizeof after);
    assert_string_equal(before, after);
    train_ckpt_free(&f->c);
}

static void write_step1(fixture *f)
{
    char err[1024] = "";
    if (train_ckpt_start(&f->c, &f->r, err, sizeof err) ||
        train_ckpt_after_step(&f->c, 1, 0, err, sizeof err))
        fail_msg("%s", err);
    char path[300];
    snprintf(path, sizeof path, "%s/step-00000001.safetensors", f->dir);
    assert_int_equal(access(path, R_OK), 0);
}

static void test_nan_weight_not_written(void **state)
{
    (void)state;
    fixture f;
    start_run(&f, "nan_weight", true, false);
    write_step1(&f);
    f.host[3] = NAN;
    refused_write(&f, "checkpoint of step 2 not written (params: tensor 'W' holds nan at "
                      "element 3 (of 16))");
}

static void test_inf_weight_from_device_not_written(void **state)
{
    (void)state;
    fixture f;
    start_run(&f, "inf_device", false, false);
    write_step1(&f);
    f.dev[15] = -INFINITY; /* the device's copy: the host's is only refreshed by the write */
    refused_write(&f, "params: tensor 'W' holds -inf at element 15 (of 16)");
}

static void test_nan_m_not_written(void **state)
{
    (void)state;
    fixture f;
    start_run(&f, "nan_m", true, false);
    write_step1(&f);
    f.m[0] = NAN;
    refused_write(&f, "adamw.m: tensor 'W' holds nan at element 0 (of 16)");
}

static void test_negative_v_not_written(void **state)
{
    (void)state;
    fixture f;
    start_run(&f, "negative_v", false, false);
    write_step1(&f);
    f.v[9] = -1e-6f;
    refused_write(&f, "adamw.v: tensor 'W' holds -1e-06 at element 9 (of 16), and it cannot be "
                      "negative");
}

static void test_filled_moments_checked(void **state)
{
    (void)state;
    fixture f;
    start_run(&f, "fill_v", true, true);
    write_step1(&f);
    f.fill_v[11] = INFINITY; /* a rank's slice, arriving while the file is being written */
    refused_write(&f, "adamw.v: tensor 'W' holds inf at element 11 (of 16)");
    start_run(&f, "fill_m", false, true);
    write_step1(&f);
    f.fill_m[2] = NAN;
    refused_write(&f, "adamw.m: tensor 'W' holds nan at element 2 (of 16)");
}

/* Writes step 1's checkpoint with v[12] replaced by `bad` (found by its marker value in the
 * file), then resumes it as the run whose moments are the slice [lo, lo + n). */
static int resume_slice(const char *name, float bad, size_t lo, size_t n, char *err,
                        size_t errlen)
{
    fixture f;
    start_run(&f, name, true, false);
    const float marker = 12345.5f;
    f.v[12] = marker;
    write_step1(&f);
    train_ckpt_free(&f.c);
    char path[300];
    snprintf(path, sizeof path, "%s/step-00000001.safetensors", f.dir);
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    unsigned char buf[8192];
    size_t len = fread(buf, 1, sizeof buf, fp);
    long at = -1;
    for (size_t i = 0; i + 4 <= len && at < 0; i++)
        if (memcmp(buf + i, &marker, 4) == 0)
            at = (long)i;
    assert_true(at > 0);
    fseek(fp, at, SEEK_SET);
    fwrite(&bad, 4, 1, fp);
    fclose(fp);

    char dir[256];
    snprintf(dir, sizeof dir, "%s", f.dir);
    memset(&f.c, 0, sizeof f.c);
    f.o = (train_ckpt_opts){.dir = dir, .every = 1, .keep = 4, .resume = dir};
    assert_int_equal(train_ckpt_prepare(&f.c, &f.o, NULL, err, errlen), 0);
    for (int i = 0; i < N; i++) /* the model's initial weights again (its hash is checked) */
        f.host[i] = 0.01f * (float)i;
    f.r.state_fill = fill_state;
    f.r.state_arg = &f;
    f.r.state_lo = lo;
    f.r.state_n = n;
    int rc = train_ckpt_start(&f.c, &f.r, err, errlen);
    train_ckpt_free(&f.c);
    return rc;
}

static void test_resume_checks_this_ranks_slice(void **state)
{
    (void)state;
    char err[1024] = "";
    assert_int_equal(resume_slice("slice_bad", -0.5f, 8, 8, err, sizeof err), -1);
    if (!strstr(err, "step-00000001.safetensors: adamw.v: tensor 'W' holds -0.5 at element 12 "
                     "(of 16), and it cannot be negative"))
        fail_msg("%s", err);
    /* the rank holding [0, 8) never reads element 12; the rank that does refuses it */
    err[0] = 0;
    if (resume_slice("slice_other", -0.5f, 0, 8, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(resume_slice("slice_nan", NAN, 0, 16, err, sizeof err), -1);
    assert_non_null(strstr(err, "adamw.v: tensor 'W' holds nan at element 12"));
}

/* A shard of `ntok` uint16 tokens 0, 1, 2, ... (mod 4). */
static void write_shard(const char *path, int ntok)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    int32_t hdr[SBPIO_SHARD_HEADER_INTS] = {SBPIO_SHARD_MAGIC_U16, SBPIO_SHARD_VERSION_U16, ntok};
    fwrite(hdr, sizeof hdr, 1, fp); /* little-endian hosts only, as the shard tests assume */
    for (int i = 0; i < ntok; i++) {
        uint16_t t = (uint16_t)(i % 4);
        fwrite(&t, 2, 1, fp);
    }
    fclose(fp);
}

static void test_shard_cursor_bounds(void **state)
{
    (void)state;
    char dir[256], path[300], err[512];
    fresh_dir(dir, sizeof dir, "shard");
    snprintf(path, sizeof path, "%s/s.bin", dir);
    write_shard(path, 20);
    sbpio_shard s;
    assert_int_equal(sbpio_shard_open(path, &s, err, sizeof err), SBPIO_OK);
    int32_t x[8], y[8];
    /* a wrap with the pass counter at its end: refused, nothing overflows */
    s.pos = 16;
    s.epoch = INT64_MAX;
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_ERR);
    assert_non_null(strstr(err, "the pass counter is out of range"));
    s.epoch = -1;
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_ERR);
    /* one pass short of the end still counts on */
    s.epoch = INT64_MAX - 1;
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_OK);
    assert_true(s.epoch == INT64_MAX && s.pos == 8);
    /* positions outside the shard, set directly */
    s.epoch = 0;
    s.pos = -1;
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_ERR);
    assert_non_null(strstr(err, "position -1 outside the shard's 20 tokens"));
    s.pos = INT64_MAX;
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_ERR);
    s.pos = 20; /* the end: the next batch wraps */
    assert_int_equal(sbpio_shard_next_batch(&s, 2, 4, x, y, err, sizeof err), SBPIO_OK);
    assert_true(s.epoch == 1 && s.pos == 8);
    assert_int_equal(sbpio_shard_seek(&s, 20, err, sizeof err), SBPIO_ERR);
    sbpio_shard_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nan_weight_not_written),
        cmocka_unit_test(test_inf_weight_from_device_not_written),
        cmocka_unit_test(test_nan_m_not_written),
        cmocka_unit_test(test_negative_v_not_written),
        cmocka_unit_test(test_filled_moments_checked),
        cmocka_unit_test(test_resume_checks_this_ranks_slice),
        cmocka_unit_test(test_shard_cursor_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
