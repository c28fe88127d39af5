/* train_ckpt.c — checkpoints and resume for sbp-train (the format and the rules are in
 * train_ckpt.h).
 *
 * Approach: the whole state a step depends on is the parameter block, AdamW's two moment blocks,
 * the step number and where the data stream stands; everything else (B, T, the parameter table,
 * the model, the data) is an identity to compare, kept as metadata strings. A checkpoint is
 * written and read by sbpio's safetensors code, so its atomicity (temporary, fsync, rename, the
 * signal registry) is the one every other output of the project already has; this file adds the
 * directory fsync, the pruning, the newest-complete search and the graceful-stop signal.
 */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "train_ckpt.h"
#include "train_finite.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_FORMAT "sbp-train-checkpoint"
#define CKPT_VERSION "2"        /* "packing" joined the identity */
#define CKPT_VERSION_OLDEST "1" /* still read: written before packing, so an unpacked run's */

/* ------------------------------------------------------------------ options */

const struct option train_ckpt_options[] = {
    {"checkpoint-dir", required_argument, NULL, TRAIN_OPT},
    {"checkpoint-every", required_argument, NULL, TRAIN_OPT},
    {"keep-checkpoints", required_argument, NULL, TRAIN_OPT},
    {"resume", required_argument, NULL, TRAIN_OPT},
    {0},
};

int train_ckpt_parse(train_ckpt_opts *o, cli *c, const char *v)
{
    const char *f = c->flag;
    if (!strcmp(f, "--checkpoint-dir"))
        return cli_path(c, f, v, &o->dir);
    if (!strcmp(f, "--checkpoint-every"))
        return cli_count(c, f, v, 1, (int64_t)1 << 30, &o->every);
    if (!strcmp(f, "--keep-checkpoints"))
        return cli_count(c, f, v, 1, 1 << 20, &o->keep);
    if (!strcmp(f, "--resume"))
        return cli_path(c, f, v, &o->resume);
    return TRAIN_OPT_NOT_MINE;
}

const char *train_ckpt_usage(void)
{
    return "checkpoints:\n"
           "  --checkpoint-dir DIR    write checkpoints (weights, AdamW state, step, data\n"
           "                          position) into DIR as step-NNNNNNNN.safetensors, each\n"
           "                          written beside the previous and renamed when complete;\n"
           "                          also at the last step, and on SIGINT/SIGTERM (the run\n"
           "                          then stops after the current step and exits 0)\n"
           "  --checkpoint-every N    a checkpoint every N steps (default: only the above)\n"
           "  --keep-checkpoints K    keep the newest K (default 2)\n"
           "  --resume DIR            continue from DIR's newest complete checkpoint (and keep\n"
           "                          writing there unless --checkpoint-dir says otherwise);\n"
           "                          --steps stays the run's total\n";
}

/* ------------------------------------------------------------------ signals */

static volatile sig_atomic_t stop_signal; /* the first SIGINT / SIGTERM, 0 if none */
static const int stop_signals[] = {SIGINT, SIGTERM};
static struct sigaction prev_action[2]; /* files.c's handler (or SIG_DFL), for a second signal */

static void on_stop_signal(int sig)
{
    if (!stop_signal) {
        stop_signal = sig;
        return;
    }
    /* A second signal: the user means it. Hand it to the handler that was there before (files.c
     * removes the temporaries, then dies of the signal); pending until this handler returns. */
    for (int k = 0; k < 2; k++)
        if (stop_signals[k] == sig)
            sigaction(sig, &prev_action[k], NULL);
    if (!sbp_signal_to_main_thread(sig)) /* files.c's cleanup must run on the main thread */
        raise(sig);
}

static void install_stop_handlers(void)
{
    /* files.c installs its cleanup handlers on the first registration: make it happen now, so
     * that they are the ones a second signal falls back to. */
    sbp_tmp_unregister(sbp_tmp_register("", false));
    for (int k = 0; k < 2; k++) {
        struct sigaction old;
        if (sigaction(stop_signals[k], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
            continue; /* nohup's or a background job's ignored SIGINT stays ignored */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(stop_signals[k], &sa, &prev_action[k]);
    }
}

/* ------------------------------------------------------------------ the directory */


/* "step-NNNNNNNN.safetensors" -> N; -1 for anything else (temporaries start with a dot). The
 * name must be exactly what ckpt_path writes for N ("%08": 8 digits, zero-padded; past 99999999
 * as many as N has, none of them a leading zero), so every file that counts as a checkpoint is
 * the one ckpt_path opens and prunes: "step-5.safetensors" or "step-+3.safetensors" is someone
 * else's file, never read, never removed. */
static int64_t ckpt_step_of(const char *name)
{
    if (strncmp(name, "step-", 5) != 0)
        return -1;
    const char *d = name + 5;
    const size_t nd = strspn(d, "0123456789");
    if (nd < 8 || nd > 18 || (nd > 8 && d[0] == '0') || strcmp(d + nd, ".safetensors") != 0)
        return -1; /* 18 digits: no overflow below */
    int64_t n = 0;
    for (size_t i = 0; i < nd; i++)
        n = n * 10 + (d[i] - '0');
    return n;
}

static char *ckpt_path(const char *dir, int64_t step)
{
    size_t n = strlen(dir) + 48;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/step-%08" PRId64 ".safetensors", dir, step);
    return p;
}

/* The steps of DIR's checkpoint files, newest first (malloc'd; *n of them). */
static int64_t *ckpt_list(const char *dir, int *n)
{
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    int cap = 16;
    int64_t *v = malloc((size_t)cap * sizeof *v);
    for (struct dirent *e; v && (e = readdir(d));) {
        int64_t s = ckpt_step_of(e->d_name);
        if (s < 0)
            continue;
        if (*n == cap) {
            int64_t *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!w) {
                free(v);
                v = NULL;
                break;
            }
            v = w;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; v && i < *n; i++) /* insertion sort, descending: a handful of files */
        for (int j = i; j > 0 && v[j] > v[j - 1]; j--) {
            int64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v;
}

/* Removes the temporaries of killed writers: ".step-N.safetensors.tmp.PID.K" whose PID is gone
 * (files.c's rule, so a live run writing into the same directory keeps its temporary). */
static void clean_dead_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char target[4096];
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (e->d_name[0] != '.' || !t)
            continue;
        size_t len = (size_t)(t - e->d_name - 1);
        char name[256];
        if (len == 0 || len >= sizeof name)
            continue;
        memcpy(name, e->d_name + 1, len);
        name[len] = 0;
        if (ckpt_step_of(name) < 0)
            continue;
        snprintf(target, sizeof target, "%s/%s", dir, name);
        sbp_tmp_clean_stale(target);
    }
    closedir(d);
}

/* The rename of a checkpoint is only durable once the directory entry is on disk. */
static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd) != 0 && errno != EINVAL && errno != EROFS ? -1 : 0;
    close(fd);
    return rc;
}

/* Creates dir (one level) and proves that a file can be created in it, so a run that could not
 * save its checkpoints is refused before step 1 rather than after hours. */
static int probe_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, 0777) != 0)
            return cli_errf(err, errlen, "--checkpoint-dir: cannot create %s: %s", dir,
                            strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
        return cli_errf(err, errlen, "--checkpoint-dir: %s is %s, not a directory", dir,
                        sbp_file_kind(st.st_mode));
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.sbp-train-probe.%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return cli_errf(err, errlen, "--checkpoint-dir: cannot write into %s: %s", dir,
                        strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

/* ------------------------------------------------------------------ identity */

/* The parameter table as one string: "name[d0,d1]@offset" with "=tied" or "-frozen" marks. */
static char *param_table(const sbp_step_info *in)
{
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    for (int i = 0; s && i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        char dims[200] = "";
        size_t k = 0;
        for (int d = 0; d < p->rank && k < sizeof dims; d++)
            k += (size_t)snprintf(dims + k, sizeof dims - k, "%s%" PRId64, d ? "," : "",
                                  p->dims[d]);
        size_t need = strlen(p->name) + strlen(dims) + 64;
        if (len + need >= cap) {
            char *t = realloc(s, cap = 2 * (len + need));
            if (!t) {
                free(s);
                return NULL;
            }
            s = t;
        }
        if (p->tied_to >= 0)
            len += (size_t)snprintf(s + len, cap - len, "%s%s[%s]=tied:%d", i ? ";" : "",
                                    p->name, dims, p->tied_to);
        else
            len += (size_t)snprintf(s + len, cap - len, "%s%s[%s]@%zu%s", i ? ";" : "", p->name,
                                    dims, p->offset, p->trainable ? "" : "-frozen");
    }
    if (s && in->n_params == 0)
        s[0] = 0;
    return s;
}

/* The first len bytes of a checkpoint's string for a message, as much as fits buf[n] (then
 * "..."), each unprintable byte as \xNN: a damaged value neither floods the line nor breaks it
 * in two. Returns buf. */
static const char *shown_n(const char *v, size_t len, char *buf, size_t n)
{
    size_t k = 0, i = 0;
    for (; i < len && v[i] && k + 8 < n; i++) {
        const unsigned char ch = (unsigned char)v[i];
        k += (size_t)snprintf(buf + k, n - k, ch >= 0x20 && ch < 0x7f ? "%c" : "\\x%02x", ch);
    }
    if (i < len && v[i])
        k += (size_t)snprintf(buf + k, n - k, "...");
    buf[k] = 0;
    return buf;
}

static const char *shown(const char *v, char *buf, size_t n)
{
    return shown_n(v, SIZE_MAX, buf, n);
}

/* The first ';'-separated entries where a and b differ, for the message. */
static void first_difference(const char *a, const char *b, char *out, size_t n)
{
    int i = 0;
    for (;;) {
        size_t la = strcspn(a, ";"), lb = strcspn(b, ";");
        if (la != lb || memcmp(a, b, la) != 0) {
            char sa[160], sb[160];
            snprintf(out, n, "parameter %d is '%s' in the checkpoint but '%s' in the step", i,
                     la ? shown_n(a, la, sa, sizeof sa) : "(none)",
                     lb ? shown_n(b, lb, sb, sizeof sb) : "(none)");
            return;
        }
        if (!a[la] || !b[lb])
            break;
        a += la + 1;
        b += lb + 1;
        i++;
    }
    snprintf(out, n, "the parameter tables differ");
}

enum { META_MAX = 40 };

/* The metadata of a checkpoint at step s (values live in `buf`). */
typedef struct ckpt_meta {
    sbpio_kv kv[META_MAX];
    int n;
    char buf[META_MAX][96];
    char *table; /* malloc'd: the parameter table */
} ckpt_meta;

static void meta_add(ckpt_meta *m, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void meta_add(ckpt_meta *m, const char *key, const char *fmt, ...)
{
    if (m->n >= META_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->buf[m->n], sizeof m->buf[m->n], fmt, ap);
    va_end(ap);
    m->kv[m->n] = (sbpio_kv){key, m->buf[m->n]};
    m->n++;
}

static const char *sched_name(const train_sched_opts *t)
{
    if (!t)
        return "constant";
    return t->kind == TRAIN_SCHED_LINEAR ? "linear"
           : t->kind == TRAIN_SCHED_COSINE ? "cosine" : "constant";
}

/* The identity keys (compared on resume) come first; the state and the schedule after them. */
static const char *const identity_keys[] = {"ranks" /* first, as another number of ranks
                                                     * needs another batch too */,
                                            "seq_parallel" /* the same ranks and step shape
                                                            * with another N are another
                                                            * global batch */,
                                            "batch", "seq_len", "vocab", "objective",
                                            "optimizer", "grad_accum", "param_elems",
                                            "model_hash", "data", "data_hash",
                                            "packing"};
enum { N_IDENTITY = sizeof identity_keys / sizeof identity_keys[0] };

static int build_meta(const train_ckpt *c, int64_t s, ckpt_meta *m)
{
    const train_ckpt_run *r = &c->r;
    const sbp_step_info *in = r->in;
    memset(m, 0, sizeof *m);
    meta_add(m, "format", CKPT_FORMAT);
    meta_add(m, "version", CKPT_VERSION);
    meta_add(m, "batch", "%" PRId64, in->batch);
    meta_add(m, "seq_len", "%" PRId64, in->seq_len);
    meta_add(m, "vocab", "%" PRId64, in->vocab);
    meta_add(m, "objective", "%s", in->objective ? in->objective : "sft");
    meta_add(m, "optimizer", "%s", r->adamw ? "adamw" : "sgd");
    meta_add(m, "grad_accum", "%" PRId64, r->grad_accum);
    meta_add(m, "param_elems", "%zu", in->param_elems);
    meta_add(m, "model_hash", "%016" PRIx64, c->model_hash);
    meta_add(m, "data", "%s", r->shard ? "shard" : r->dataset ? "dataset" : "arrays");
    meta_add(m, "data_hash", "%016" PRIx64, c->data_hash);
    meta_add(m, "packing", "%s", c->packing[0] ? c->packing : "none");
    meta_add(m, "ranks", "%d", r->ranks > 1 ? r->ranks : 1);
    meta_add(m, "seq_parallel", "%d", r->seq_parallel > 1 ? r->seq_parallel : 1);
    if (r->threads > 0)
        meta_add(m, "threads", "%d", r->threads);
    /* the state */
    meta_add(m, "step", "%" PRId64, s);
    meta_add(m, "adamw_step", "%" PRId64, r->adamw ? s : 0);
    meta_add(m, "data_pos", "%" PRId64,
             r->shard ? r->shard->pos : r->dataset ? r->dataset->pos : s);
    meta_add(m, "data_epoch", "%" PRId64,
             r->shard ? r->shard->epoch : r->dataset ? r->dataset->epoch : 0);
    /* the schedule (recorded; a resumed run may change it, with a note) */
    meta_add(m, "total_steps", "%" PRId64, r->total_steps);
    meta_add(m, "lr", "%.17g", r->lr);
    meta_add(m, "weight_decay", "%.17g", r->weight_decay);
    meta_add(m, "lr_schedule", "%s", sched_name(r->sched));
    meta_add(m, "warmup_steps", "%" PRId64, r->sched ? r->sched->warmup : 0);
    meta_add(m, "min_lr", "%.17g", r->sched ? r->sched->min_lr : 0.0);
    meta_add(m, "clip_grad_norm", "%.17g", r->sched ? r->sched->clip : 0.0);
    meta_add(m, "producer", "sbp-train %s", SBP_VERSION);
    if (!(m->table = param_table(in)))
        return -1;
    m->kv[m->n++] = (sbpio_kv){"param_table", m->table};
    return 0;
}

/* ------------------------------------------------------------------ reading the metadata */

/* Parses v as build_meta writes an integer: decimal digits, the whole string, no sign, space or
 * leading zero, so a value that reads back is one that could have been written; in [lo, hi]. */
static bool parse_count(const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!v || !*v || (v[0] == '0' && v[1]))
        return false;
    int64_t n = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || n > (INT64_MAX - (*p - '0')) / 10)
            return false;
        n = n * 10 + (*p - '0');
    }
    if (n < lo || n > hi)
        return false;
    *out = n;
    return true;
}

/* The metadata integer `key` of checkpoint f (at path), in [lo, hi]; an absent key reads as
 * `absent`, or is an error when absent < 0 (a key every version writes). why: what the range
 * is, for the message (may be ""). */
static int meta_count(sbpio_st_file *f, const char *path, const char *key, int64_t lo,
                      int64_t hi, int64_t absent, const char *why, int64_t *out, char *err,
                      size_t errlen)
{
    const char *v = sbpio_st_meta(f, key);
    if (!v && absent >= 0) {
        *out = absent;
        return 0;
    }
    if (!v)
        return cli_errf(err, errlen, "--resume: %s has no \"%s\" in its metadata: a damaged "
                        "checkpoint", path, key);
    if (parse_count(v, lo, hi, out))
        return 0;
    char b[80];
    if (lo == hi)
        return cli_errf(err, errlen, "--resume: %s: metadata \"%s\" is '%s', not %" PRId64 "%s",
                        path, key, shown(v, b, sizeof b), lo, why);
    return cli_errf(err, errlen, "--resume: %s: metadata \"%s\" is '%s', not an integer from %"
                    PRId64 " to %" PRId64 "%s", path, key, shown(v, b, sizeof b), lo, hi, why);
}

/* A metadata number of the schedule (recorded for the notes only, but a value no run could
 * have had marks a damaged file): absent, or a finite decimal >= 0, the whole string. */
static int meta_real(sbpio_st_file *f, const char *path, const char *key, char *err,
                     size_t errlen)
{
    const char *v = sbpio_st_meta(f, key);
    if (!v)
        return 0;
    /* the characters of "%.17g" only: no space, sign first, hex float, "nan" or "inf" */
    char *end;
    errno = 0;
    double x = v[0] >= '0' && v[0] <= '9' && !v[strspn(v, "0123456789.e+-")] ? strtod(v, &end)
                                                                             : -1;
    if (x >= 0 && !errno && !*end && isfinite(x))
        return 0;
    char b[80];
    return cli_errf(err, errlen, "--resume: %s: metadata \"%s\" is '%s', not a finite number "
                    ">= 0", path, key, shown(v, b, sizeof b));
}

/* The state a resume takes from the metadata, each value checked against what this run can
 * continue from. */
typedef struct ckpt_state {
    int64_t data_pos, data_epoch; /* the shard's cursor (--data) */
    int64_t threads;              /* the writer's CPU threads, 0 if not recorded */
} ckpt_state;

/* Passes a data_epoch can still add during this run stay far from overflowing its int64 (the
 * shard's and the packer's pass counters count on from it). */
#define CKPT_EPOCH_MAX (INT64_MAX / 2)

static int read_state(const train_ckpt *c, ckpt_state *st, char *err, size_t errlen)
{
    sbpio_st_file *f = c->from;
    const char *p = c->from_path;
    const train_ckpt_run *r = &c->r;
    int64_t step, adamw_step, unused;
    if (meta_count(f, p, "step", c->start, c->start, -1, " (the step in its name)", &step, err,
                   errlen) ||
        meta_count(f, p, "adamw_step", r->adamw ? step : 0, r->adamw ? step : 0, -1,
                   r->adamw ? " (AdamW's bias correction counts the steps)"
                            : " (an sgd run has no AdamW steps)",
                   &adamw_step, err, errlen))
        return -1;
    if (r->shard) {
        char why[64];
        snprintf(why, sizeof why, " (a position in --data's %" PRId64 " tokens)", r->shard->ntok);
        if (meta_count(f, p, "data_pos", 0, r->shard->ntok - 1, -1, why, &st->data_pos, err,
                       errlen) ||
            meta_count(f, p, "data_epoch", 0, CKPT_EPOCH_MAX, -1, "", &st->data_epoch, err,
                       errlen))
            return -1;
    } else if (r->dataset) {
        char why[64];
        snprintf(why, sizeof why, " (an example of --dataset's %" PRId64 ")", r->dataset->d.n_ex);
        if (meta_count(f, p, "data_pos", 0, r->dataset->d.n_ex - 1, -1, why, &st->data_pos, err,
                       errlen) ||
            meta_count(f, p, "data_epoch", 0, CKPT_EPOCH_MAX, -1, "", &st->data_epoch, err,
                       errlen))
            return -1;
    } else if (meta_count(f, p, "data_pos", step, step, -1, " (without --data the step is the "
                          "cursor)", &st->data_pos, err, errlen) ||
               meta_count(f, p, "data_epoch", 0, 0, -1, " (without --data there are no "
                          "passes)", &st->data_epoch, err, errlen)) {
        return -1;
    }
    /* recorded for the notes; checked all the same: a value no run writes is a damaged file */
    static const char *const reals[] = {"lr", "weight_decay", "min_lr", "clip_grad_norm"};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        if (meta_real(f, p, reals[i], err, errlen))
            return -1;
    return meta_count(f, p, "threads", 1, INT32_MAX, 0, " (CPU threads)", &st->threads, err,
                      errlen) ||
                   meta_count(f, p, "total_steps", 1, (int64_t)1 << 30, 0, " (--steps)",
                              &unused, err, errlen) ||
                   meta_count(f, p, "warmup_steps", 0, (int64_t)1 << 30, 0, " (--warmup-steps)",
                              &unused, err, errlen)
               ? -1
               : 0;
}

/* ------------------------------------------------------------------ prepare, start */

/* Whether a and b are one directory (two spellings of it, or a link). */
static bool same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* A run that does not continue the checkpoints of its --checkpoint-dir must find none there:
 * it would replace those of the same step numbers and leave the later ones, which a --resume
 * would then take for its own. 0, or -1 with the message. */
static int check_fresh_dir(const train_ckpt_opts *o, char *err, size_t errlen)
{
    if (!o->dir || (o->resume && same_dir(o->resume, o->dir)))
        return 0;
    int n = 0;
    int64_t *steps = ckpt_list(o->dir, &n);
    int rc = 0;
    if (n > 0)
        rc = cli_errf(err, errlen, "--checkpoint-dir: %s holds the checkpoints of another run "
                      "(the newest: step-%08" PRId64 ".safetensors, %d in all), which this one "
                      "would replace in part: continue that run with --resume %s, or give an "
                      "empty or new folder", o->dir, steps[0], n, o->dir);
    free(steps);
    return rc;
}

int train_ckpt_prepare(train_ckpt *c, const train_ckpt_opts *o, const train_sink *note, char *err,
                       size_t errlen)
{
    memset(c, 0, sizeof *c);
    c->o = o;
    c->dir = o->dir ? o->dir : o->resume;
    if (!c->dir) {
        if (o->every)
            return cli_errf(err, errlen, "--checkpoint-every needs --checkpoint-dir DIR");
        return 0;
    }
    if (o->resume) {
        struct stat st;
        if (stat(o->resume, &st) != 0)
            return cli_errf(err, errlen, "--resume: %s: %s", o->resume, strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return cli_errf(err, errlen, "--resume: %s is %s, not a directory", o->resume,
                            sbp_file_kind(st.st_mode));
    }
    if (check_fresh_dir(o, err, errlen) || probe_dir(c->dir, err, errlen))
        return -1;
    clean_dead_temps(c->dir);
    if (o->resume && strcmp(o->resume, c->dir) != 0)
        clean_dead_temps(o->resume);
    install_stop_handlers();
    if (!o->resume)
        return 0;

    int n = 0;
    int64_t *steps = ckpt_list(o->resume, &n);
    char why[512] = "";
    int skipped = 0;
    for (int i = 0; i < n && !c->from; i++) {
        char *path = ckpt_path(o->resume, steps[i]);
        sbpio_st_file *f = NULL;
        if (!path)
            break;
        if (sbpio_st_open_header(path, &f, why, sizeof why) == SBPIO_OK) {
            const char *fmt = sbpio_st_meta(f, "format"), *ver = sbpio_st_meta(f, "version");
            const char *st = sbpio_st_meta(f, "step");
            int64_t step = -1;
            if (st && !parse_count(st, 0, INT64_MAX, &step)) {
                /* not a torn write (those never reach the name): a value no run writes, so
                 * the run stops here rather than quietly resume from an older step */
                char b[80];
                cli_errf(err, errlen, "--resume: %s: metadata \"step\" is '%s', not an integer "
                         "from 0 to %" PRId64, path, shown(st, b, sizeof b), INT64_MAX);
                sbpio_st_close(f);
                free(path);
                free(steps);
                return -1;
            }
            if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || !ver ||
                (strcmp(ver, CKPT_VERSION) != 0 && strcmp(ver, CKPT_VERSION_OLDEST) != 0) ||
                step != steps[i] || !sbpio_st_find(f, "params")) {
                snprintf(why, sizeof why, "%s: not an sbp-train checkpoint (version %s or %s) "
                         "of step %" PRId64, path, CKPT_VERSION_OLDEST, CKPT_VERSION, steps[i]);
                sbpio_st_close(f);
                f = NULL;
            }
        }
        if (f) {
            c->from = f;
            c->from_path = path;
            c->start = steps[i];
        } else {
            free(path);
            skipped++;
            /* a note, not an error: the previous checkpoint is what atomic writes keep for this */
            train_say(note, "note", "skipping a damaged checkpoint: %s", why);
        }
    }
    free(steps);
    if (!c->from)
        return cli_errf(err, errlen, "--resume: %s holds no complete checkpoint "
                        "(step-NNNNNNNN.safetensors)%s", o->resume,
                        skipped ? "; the ones there are damaged (see the notes)" : "");
    return 0;
}

int64_t train_ckpt_first_step(const train_ckpt *c) { return c->start + 1; }

/* One identity key of the checkpoint against this run's value. */
static int compare_key(const train_ckpt *c, const ckpt_meta *now, const char *key, char *err,
                       size_t errlen)
{
    const char *mine = NULL;
    for (int i = 0; i < now->n; i++)
        if (strcmp(now->kv[i].key, key) == 0)
            mine = now->kv[i].value;
    const char *theirs = sbpio_st_meta(c->from, key);
    if (!theirs && strcmp(key, "packing") == 0) /* a version-1 checkpoint, unpacked */
        theirs = "none";
    if (!theirs && strcmp(key, "ranks") == 0) /* written before mpirun: one process */
        theirs = "1";
    if (!theirs && strcmp(key, "seq_parallel") == 0) /* before sequence parallelism: whole rows */
        theirs = "1";
    if (mine && theirs && strcmp(mine, theirs) == 0)
        return 0;
    const char *what = strcmp(key, "model_hash") == 0 ? "another model's initial weights (--model)"
                       : strcmp(key, "data_hash") == 0 || strcmp(key, "data") == 0
                           ? "other training data"
                       : strcmp(key, "optimizer") == 0 ? "another optimizer"
                       : strcmp(key, "objective") == 0 ? "another objective"
                       : strcmp(key, "grad_accum") == 0 ? "another --grad-accum"
                       : strcmp(key, "packing") == 0
                           ? "another packing of the data (--pack, --eos, --doc-ids)"
                       : strcmp(key, "ranks") == 0
                           ? "another number of ranks (mpirun -np; resume with the same N)"
                       : strcmp(key, "seq_parallel") == 0
                           ? "another number of ranks per row (sbpc --seq-parallel; resume "
                             "with a step of the same N)"
                                                        : "a step of another shape";
    char b[80];
    return cli_errf(err, errlen, "--resume: %s was written for %s: %s is %s there but %s here "
                    "(%s); resume with the run's own model, step, data and options",
                    c->from_path, what, key, theirs ? shown(theirs, b, sizeof b) : "(missing)",
                    mine ? mine : "?", c->r.step_path);
}

/* Copies elements [first, first + n) of checkpoint tensor `name`, which holds `total` in the
 * layout of `block`, into backend memory dst through the host buffer tmp; every value must be
 * finite (and >= 0 when nonneg: AdamW's v) before it goes to the device. */
static int load_block(train_ckpt *c, const char *name, train_block block, bool nonneg,
                      float *dst, float *tmp, size_t total, size_t first, size_t n, char *err,
                      size_t errlen)
{
    const train_ckpt_run *r = &c->r;
    char what[4200];
    if (sbpio_st_copy_f32_range(c->from, name, tmp, (int64_t)total, (int64_t)first, (int64_t)n,
                                what, sizeof what) != SBPIO_OK)
        return cli_errf(err, errlen, "--resume: %s", what); /* sbpio's message names the file */
    snprintf(what, sizeof what, "--resume: %s: %s", c->from_path, name);
    if (train_finite_check(r->in, block, tmp, first, n, nonneg, what, err, errlen))
        return -1;
    const size_t bytes = n * sizeof(float);
    if (tmp != dst) {
        int st = r->copy(r->copy_ctx, dst, tmp, bytes, SBPRT_COPY_HOST_TO_DEVICE);
        if (st)
            return cli_errf(err, errlen, "--resume: copying '%s' to the device failed: %s", name,
                            sbprt_status_string(st));
    }
    return 0;
}

/* The moments' elements this process holds: a ZeRO slice, or all of them. */
static size_t ckpt_state_elems(const train_ckpt_run *r)
{
    return r->state_fill ? r->state_n : r->gbytes / sizeof(float);
}

/* The run's identity hashes: the model's initial weights and the training data (the file's
 * contents, and for a dataset the order and rows made of them). */
static void identity_hashes(train_ckpt *c, const train_ckpt_run *r)
{
    c->model_hash = sbpio_fnv1a(SBPIO_FNV_SEED, r->host_params, r->pbytes);
    if (r->shard) {
        c->data_hash = sbpio_fnv1a(SBPIO_FNV_SEED, r->shard->raw,
                                   (size_t)r->shard->ntok * r->shard->token_size);
    } else if (r->dataset) {
        const uint64_t how[3] = {r->dataset->shuffle, r->dataset->shuffle ? r->dataset->seed : 0,
                                 r->dataset->packed};
        c->data_hash = sbpio_fnv1a(r->dataset->d.hash, how, sizeof how);
    } else {
        c->data_hash = sbpio_fnv1a(sbpio_fnv1a(SBPIO_FNV_SEED, r->ids,
                                               r->ntok_all * sizeof *r->ids),
                                   r->labels, r->ntok_all * sizeof *r->labels);
    }
}

/* A changed schedule or learning rate is allowed (runs are tuned), but said; so is another CPU
 * thread count (reductions are split over the threads: it changes the last bits). */
static void note_changes(const train_ckpt *c, const train_ckpt_run *r, const ckpt_meta *now,
                         const ckpt_state *state)
{
    static const char *const sched_keys[] = {"lr", "weight_decay", "lr_schedule", "warmup_steps",
                                             "min_lr", "clip_grad_norm", "total_steps"};
    for (size_t i = 0; i < sizeof sched_keys / sizeof sched_keys[0]; i++) {
        const char *theirs = sbpio_st_meta(c->from, sched_keys[i]);
        for (int k = 0; k < now->n; k++)
            if (strcmp(now->kv[k].key, sched_keys[i]) == 0 && theirs &&
                strcmp(theirs, now->kv[k].value) != 0 && r->note &&
                /* --steps only shapes a decaying schedule; raising it is how a run goes on */
                (strcmp(sched_keys[i], "total_steps") != 0 ||
                 strcmp(sched_name(r->sched), "constant") != 0)) {
                char msg[300], b[80];
                snprintf(msg, sizeof msg, "the checkpoint's run had %s %s, this one has %s: the "
                         "steps from here on follow this run's value", sched_keys[i],
                         shown(theirs, b, sizeof b), now->kv[k].value);
                train_note(r->note, msg);
            }
    }
    if (state->threads > 0 && r->threads > 0 && r->note && state->threads != r->threads) {
        char msg[300];
        snprintf(msg, sizeof msg, "the checkpoint's run used %" PRId64 " CPU threads, this one "
                 "%d: the steps from here on are exact, but not bit for bit the uninterrupted "
                 "run's (resume with --threads %" PRId64 " for that)", state->threads, r->threads,
                 state->threads);
        train_note(r->note, msg);
    }
}

/* The checkpoint's identity against this run's, field by field, and its state's metadata. */
static int check_identity(train_ckpt *c, const train_ckpt_run *r, ckpt_state *state, char *err,
                          size_t errlen)
{
    ckpt_meta now;
    if (build_meta(c, c->start, &now))
        return cli_errf(err, errlen, "out of memory");
    int rc = 0;
    const char *table = sbpio_st_meta(c->from, "param_table");
    if (!table || strcmp(table, now.table) != 0) {
        char diff[400];
        first_difference(table ? table : "", now.table, diff, sizeof diff);
        rc = cli_errf(err, errlen, "--resume: %s was written for another model or step: %s (%s)",
                      c->from_path, diff, r->step_path);
    }
    for (int i = 0; i < N_IDENTITY && !rc; i++)
        rc = compare_key(c, &now, identity_keys[i], err, errlen);
    if (!rc)
        rc = read_state(c, state, err, errlen);
    if (!rc && c->start >= r->total_steps)
        rc = cli_errf(err, errlen, "--resume: %s is at step %" PRId64 " and --steps is %" PRId64
                      ": nothing left to run (--steps is the run's total: give a larger one)",
                      c->from_path, c->start, r->total_steps);
    if (!rc && r->dump_grads)
        rc = cli_errf(err, errlen, "--dump-grads writes step 1's gradients, but this run resumes "
                      "after step %" PRId64, c->start);
    if (!rc)
        note_changes(c, r, &now, state);
    free(now.table);
    return rc ? -1 : 0;
}

/* The state: parameters, moments (under ZeRO this rank's slice of the whole ones), the data
 * cursor (read_state checked it against the shard or dataset). */
static int restore_state(train_ckpt *c, const train_ckpt_run *r, const ckpt_state *state,
                         char *err, size_t errlen)
{
    float *tmp = r->host_params;
    const size_t np = r->pbytes / sizeof(float), ng = r->gbytes / sizeof(float);
    if (load_block(c, "params", TRAIN_BLOCK_PARAMS, false, r->d_params, tmp, np, 0, np, err,
                   errlen))
        return -1;
    const size_t lo = r->state_fill ? r->state_lo : 0, n = ckpt_state_elems(r);
    if (r->adamw &&
        (load_block(c, "adamw.m", TRAIN_BLOCK_MOMENTS, false, r->d_m,
                    r->host_visible ? r->d_m : c->host_m, ng, lo, n, err, errlen) ||
         load_block(c, "adamw.v", TRAIN_BLOCK_MOMENTS, true, r->d_v,
                    r->host_visible ? r->d_v : c->host_v, ng, lo, n, err, errlen)))
        return -1;
    if (r->shard) {
        if (sbpio_shard_seek(r->shard, state->data_pos, err, errlen) != SBPIO_OK)
            return -1;
        r->shard->epoch = state->data_epoch;
    }
    if (r->dataset && train_dataset_seek(r->dataset, state->data_epoch, state->data_pos, err,
                                         errlen))
        return -1;
    return 0;
}

int train_ckpt_start(train_ckpt *c, const train_ckpt_run *r, char *err, size_t errlen)
{
    if (!c->dir)
        return 0;
    c->r = *r;
    snprintf(c->packing, sizeof c->packing, "%s", r->packing ? r->packing : "none"); /* 13 */
    identity_hashes(c, r);
    if (!r->host_visible && r->adamw) { /* a ZeRO slice's worth */
        c->host_m = malloc(ckpt_state_elems(r) * sizeof(float) + 1);
        c->host_v = malloc(ckpt_state_elems(r) * sizeof(float) + 1);
        if (!c->host_m || !c->host_v)
            return cli_errf(err, errlen, "out of memory");
    }
    if (!c->from)
        return 0;
    ckpt_state state = {0};
    if (check_identity(c, r, &state, err, errlen) || restore_state(c, r, &state, err, errlen))
        return -1;
    if (r->note) {
        char msg[4200];
        snprintf(msg, sizeof msg, "resuming from %s (step %" PRId64 ")", c->from_path, c->start);
        train_note(r->note, msg);
    }
    sbpio_st_close(c->from);
    c->from = NULL;
    c->last_written = c->start;
    return 0;
}

/* ------------------------------------------------------------------ writing */

/* Removes all but the newest `keep` checkpoints at or before step s (newer ones, left by a run
 * that went further, are replaced when this run reaches them). */
static void prune(const train_ckpt *c, int64_t s)
{
    int n = 0, kept = 0;
    int64_t *steps = ckpt_list(c->dir, &n);
    for (int i = 0; steps && i < n; i++) {
        /* the default K = 2: one to resume from, one more in case it is damaged */
        if (steps[i] > s || kept++ < (c->o->keep ? c->o->keep : 2))
            continue;
        char *path = ckpt_path(c->dir, steps[i]);
        if (path)
            unlink(path);
        free(path);
    }
    free(steps);
}

/* sbpio's fill for a moment tensor (bytes) on the run's state_fill (elements) */
typedef struct ckpt_fill {
    const train_ckpt_run *r;
    int which; /* 0: m, 1: v */
} ckpt_fill;

/* Each piece is checked as it arrives: a bad one fails the write, and sbpio then removes the
 * temporary, so the file never exists. */
static int fill_moment(void *arg, size_t offset, void *buf, size_t bytes, char *err,
                       size_t errlen)
{
    const ckpt_fill *f = arg;
    const size_t first = offset / sizeof(float), n = bytes / sizeof(float);
    if (f->r->state_fill(f->r->state_arg, f->which, first, buf, n, err, errlen))
        return -1;
    return train_finite_check(f->r->in, TRAIN_BLOCK_MOMENTS, buf, first, n, f->which == 1,
                              f->which ? "adamw.v" : "adamw.m", err, errlen);
}

/* The message of a checkpoint that was not written, and why. */
static int not_written(const train_ckpt *c, int64_t s, const char *why, char *err, size_t errlen)
{
    if (c->last_written > 0)
        return cli_errf(err, errlen, "checkpoint of step %" PRId64 " not written (%s); the "
                        "previous one, of step %" PRId64 ", is intact", s, why, c->last_written);
    return cli_errf(err, errlen, "checkpoint of step %" PRId64 " not written (%s)", s, why);
}

static int write_ckpt(train_ckpt *c, int64_t s, char *err, size_t errlen)
{
    const train_ckpt_run *r = &c->r;
    const float *params = r->host_params, *m = r->d_m, *v = r->d_v;
    int st = 0;
    if (!r->host_visible) {
        st = r->copy(r->copy_ctx, r->host_params, r->d_params, r->pbytes,
                     SBPRT_COPY_DEVICE_TO_HOST);
        const bool copy_mv = r->adamw && !r->state_fill; /* else filled */
        if (!st && copy_mv)
            st = r->copy(r->copy_ctx, c->host_m, r->d_m, r->gbytes, SBPRT_COPY_DEVICE_TO_HOST);
        if (!st && copy_mv)
            st = r->copy(r->copy_ctx, c->host_v, r->d_v, r->gbytes, SBPRT_COPY_DEVICE_TO_HOST);
        if (st)
            return cli_errf(err, errlen, "checkpoint: copying from the device failed: %s",
                            sbprt_status_string(st));
        if (copy_mv) {
            m = c->host_m;
            v = c->host_v;
        }
    }
    /* nothing non-finite is written (a filled moment is checked piece by piece, fill_moment) */
    char why[600];
    const size_t np = r->pbytes / sizeof(float), ng = r->gbytes / sizeof(float);
    if (train_finite_check(r->in, TRAIN_BLOCK_PARAMS, params, 0, np, false, "params", why,
                           sizeof why) ||
        (r->adamw && !r->state_fill &&
         (train_finite_check(r->in, TRAIN_BLOCK_MOMENTS, m, 0, ng, false, "adamw.m", why,
                             sizeof why) ||
          train_finite_check(r->in, TRAIN_BLOCK_MOMENTS, v, 0, ng, true, "adamw.v", why,
                             sizeof why))))
        return not_written(c, s, why, err, errlen);
    ckpt_meta meta;
    if (build_meta(c, s, &meta))
        return cli_errf(err, errlen, "out of memory");
    int64_t shape[1] = {(int64_t)(r->pbytes / sizeof(float))};
    int64_t gshape[1] = {(int64_t)(r->gbytes / sizeof(float))}; /* the trained parameters' */
    ckpt_fill fills[2] = {{r, 0}, {r, 1}}; /* ZeRO: the ranks' slices, in order */
    sbpio_st_tensor ts[3] = {
        {.name = "params", .dtype = SBPIO_DT_F32, .rank = 1, .shape = shape, .data = params},
        {.name = "adamw.m", .dtype = SBPIO_DT_F32, .rank = 1, .shape = gshape,
         .data = r->state_fill ? NULL : m, .fill = r->state_fill ? fill_moment : NULL,
         .fill_arg = &fills[0]},
        {.name = "adamw.v", .dtype = SBPIO_DT_F32, .rank = 1, .shape = gshape,
         .data = r->state_fill ? NULL : v, .fill = r->state_fill ? fill_moment : NULL,
         .fill_arg = &fills[1]},
    };
    char *path = ckpt_path(c->dir, s);
    int rc = 0;
    if (!path)
        rc = cli_errf(err, errlen, "out of memory");
    else if (sbpio_st_write(path, r->adamw ? 3 : 1, ts, meta.n, meta.kv, false, why,
                            sizeof why) != SBPIO_OK) {
        rc = not_written(c, s, why, err, errlen);
    } else if (fsync_dir(c->dir) != 0) {
        rc = cli_errf(err, errlen, "checkpoint %s: fsync of the directory: %s", path,
                      strerror(errno));
    }
    free(meta.table);
    free(path);
    if (rc)
        return -1;
    c->last_written = s;
    prune(c, s);
    return 0;
}

bool train_ckpt_due(const train_ckpt_opts *o, int64_t s, int64_t total, int sig)
{
    if (!o || (!o->dir && !o->resume))
        return false;
    return (o->every > 0 && s % o->every == 0) || s == total || sig;
}

int train_ckpt_after_step(train_ckpt *c, int64_t s, int sig, char *err, size_t errlen)
{
    if (!c->dir || !train_ckpt_due(c->o, s, c->r.total_steps, sig))
        return 0;
    if (write_ckpt(c, s, err, errlen))
        return -1;
    if (sig && s < c->r.total_steps) {
        c->stopped = true;
        if (c->r.note) {
            char msg[4300];
            snprintf(msg, sizeof msg, "stopped by %s after step %" PRId64 "; checkpoint in %s: "
                     "continue with --resume %s", sig == SIGINT ? "SIGINT" : "SIGTERM", s, c->dir,
                     c->dir);
            train_note(c->r.note, msg);
        }
    }
    return 0;
}

/* Data parallel (train_dist.h, "Signals"): the ranks pass their signals to rank 0 */
int train_ckpt_stop_signal(void) { return stop_signal; }

void train_ckpt_request_stop(int sig)
{
    if (sig && !stop_signal)
        stop_signal = sig;
}

void train_ckpt_free(train_ckpt *c)
{
    sbpio_st_close(c->from);
    free(c->from_path);
    free(c->host_m);
    free(c->host_v);
    memset(c, 0, sizeof *c);
}
