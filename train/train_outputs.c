/* train_outputs.c — the output registry of train_outputs.h: identity checks through
 * ir/files.c, then a probe that creates and removes one file where the writer will create its
 * temporary. The probe is a temporary of the signal registry (sbp_tmp_register), so a run
 * killed between its creation and removal leaves nothing either. */
#include "train_outputs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

void train_outputs_init(train_outputs *o, const sbp_file_set *inputs)
{
    memset(o, 0, sizeof *o);
    o->inputs = inputs;
}

void train_outputs_free(train_outputs *o)
{
    if (!o)
        return;
    sbp_file_set_free(&o->files);
    free(o->ckpt_dir);
    free(o->ckpt_role);
    for (int i = 0; i < o->n_dirs; i++)
        free(o->dirs[i].dir);
    memset(o, 0, sizeof *o);
}

/* Creates and removes a temporary for target (a file in an existing directory). */
static int probe(const char *target, const char *role, const char *dir, char *err,
                 size_t errlen)
{
    char *tmp = sbp_tmp_name(target);
    if (!tmp)
        return cli_errf(err, errlen, "out of memory");
    int slot = sbp_tmp_register(tmp, false);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int e = errno;
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    sbp_tmp_unregister(slot);
    free(tmp);
    if (fd < 0)
        return cli_errf(err, errlen, "%s: cannot write into %s (for %s): %s", role, dir, target,
                        strerror(e));
    return 0;
}

/* The directory that will hold target must exist, be a directory, and take a new file. */
static int probe_file(const char *target, const char *role, char *err, size_t errlen)
{
    struct stat st;
    if (stat(target, &st) == 0 && S_ISCHR(st.st_mode))
        return 0; /* a sink, written in place */
    char *dir = sbp_path_dir(target);
    if (!dir)
        return cli_errf(err, errlen, "out of memory");
    int rc = 0;
    if (stat(dir, &st) != 0)
        rc = cli_errf(err, errlen, "%s: cannot write %s: the directory %s %s", role, target, dir,
                      errno == ENOENT ? "does not exist" : strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rc = cli_errf(err, errlen, "%s: cannot write %s: %s is %s, not a directory", role,
                      target, dir, sbp_file_kind(st.st_mode));
    else
        rc = probe(target, role, dir, err, errlen);
    free(dir);
    return rc;
}

/* "step-*.safetensors": what the checkpoint folder's pruning may delete (its own parser is
 * stricter; anything this loose rule matches is kept out of the way). */
static bool ckpt_like(const char *name)
{
    size_t n = strlen(name), s = sizeof ".safetensors" - 1;
    return strncmp(name, "step-", 5) == 0 && n > 5 + s && strcmp(name + n - s, ".safetensors") == 0;
}

/* Is path a checkpoint-named entry of the folder known by ds? */
static bool in_ckpt_dir(const char *path, const struct stat *ds)
{
    if (!ckpt_like(sbp_path_base(path)))
        return false;
    char *dir = sbp_path_dir(path);
    struct stat st;
    bool same = dir && stat(dir, &st) == 0 && st.st_dev == ds->st_dev && st.st_ino == ds->st_ino;
    free(dir);
    return same;
}

/* Every input and output against the checkpoint folder: none may be one of its checkpoint
 * files, by name (a file pruning would delete) or by identity (a link to one). */
static int check_ckpt_dir(const train_outputs *o, char *err, size_t errlen)
{
    struct stat ds;
    if (!o->ckpt_dir || stat(o->ckpt_dir, &ds) != 0)
        return 0; /* train_ckpt_prepare makes it, and reports what stops that */
    const sbp_file_set *sets[2] = {o->inputs, &o->files};
    for (int k = 0; k < 2; k++)
        for (int i = 0; sets[k] && i < sets[k]->n; i++)
            if (in_ckpt_dir(sets[k]->v[i].path, &ds))
                return cli_errf(err, errlen, "%s: %s (%s) is named like a checkpoint of %s, "
                                "which the run writes and prunes there: move it or use another "
                                "folder", o->ckpt_role, sets[k]->v[i].path, sets[k]->v[i].role,
                                o->ckpt_dir);
    DIR *d = opendir(o->ckpt_dir);
    if (!d)
        return 0;
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        if (!ckpt_like(e->d_name))
            continue;
        size_t len = strlen(o->ckpt_dir) + strlen(e->d_name) + 2;
        char *p = malloc(len);
        struct stat st;
        if (p) {
            snprintf(p, len, "%s/%s", o->ckpt_dir, e->d_name);
            for (int k = 0; k < 2 && !rc && stat(p, &st) == 0; k++)
                for (int i = 0; sets[k] && i < sets[k]->n && !rc; i++)
                    if (!sets[k]->v[i].name && sets[k]->v[i].dev == st.st_dev &&
                        sets[k]->v[i].ino == st.st_ino)
                        rc = cli_errf(err, errlen, "%s: %s (%s) is the checkpoint %s, which "
                                      "the run may prune: use a copy", o->ckpt_role,
                                      sets[k]->v[i].path, sets[k]->v[i].role, p);
        }
        free(p);
    }
    closedir(d);
    return rc;
}

int train_outputs_file(train_outputs *o, const char *path, const char *role, char *err,
                       size_t errlen)
{
    if (sbp_file_check_output(path, role, o->inputs, &o->files, err, errlen) != SBP_FILE_OK ||
        probe_file(path, role, err, errlen))
        return -1;
    return check_ckpt_dir(o, err, errlen);
}

/* Whether the paths a and b name one entry: by identity when both exist, else by their
 * parent folders' identity and their last components (a folder not made yet). */
static bool same_entry(const char *a, const char *b)
{
    struct stat sa, sb;
    const bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea || eb)
        return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *pa = sbp_path_dir(a), *pb = sbp_path_dir(b);
    bool same = pa && pb && stat(pa, &sa) == 0 && stat(pb, &sb) == 0 &&
                sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino &&
                strcmp(sbp_path_base(a), sbp_path_base(b)) == 0;
    free(pa);
    free(pb);
    return same;
}

/* The folder's first entry that is not one of names[0..n) (nor a temporary of a writer,
 * ".NAME.tmp.PID.K", which the writers clean), copied into out; false when there is none. */
static bool foreign_entry(const char *dir, const char *const *names, int n, char *out,
                          size_t outlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return false; /* the probe reports an unreadable folder */
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        const char *nm = e->d_name;
        bool ours = strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0 ||
                    (nm[0] == '.' && strstr(nm, ".tmp."));
        for (int i = 0; i < n && !ours; i++)
            ours = strcmp(nm, names[i]) == 0;
        if (!ours) {
            snprintf(out, outlen, "%s", nm);
            found = true;
        }
    }
    closedir(d);
    return found;
}

int train_outputs_dir(train_outputs *o, const char *dir_given, const char *role,
                      const char *const *names, int n, char *err, size_t errlen)
{
    char dir[4096]; /* "D/" is "D": the probe of a folder not made yet looks in its parent */
    if (snprintf(dir, sizeof dir, "%s", dir_given) >= (int)sizeof dir)
        return cli_errf(err, errlen, "%s: the path is too long", role);
    for (size_t k; (k = strlen(dir)) > 1 && dir[k - 1] == '/';)
        dir[k - 1] = 0;
    for (int i = 0; i < o->n_dirs; i++)
        if (same_entry(dir, o->dirs[i].dir))
            return cli_errf(err, errlen, "%s: %s is also the folder of %s: a loader reads a "
                            "folder whole and would apply both; give each its own folder", role,
                            dir, o->dirs[i].role);
    if (o->n_dirs < (int)(sizeof o->dirs / sizeof o->dirs[0])) {
        if (!(o->dirs[o->n_dirs].dir = strdup(dir)))
            return cli_errf(err, errlen, "out of memory");
        o->dirs[o->n_dirs++].role = role;
    }
    struct stat st;
    char other[256];
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return cli_errf(err, errlen, "%s: %s is %s, not a directory", role, dir,
                            sbp_file_kind(st.st_mode));
        if (foreign_entry(dir, names, n, other, sizeof other))
            return cli_errf(err, errlen, "%s: %s holds %s, which this run does not write: a "
                            "loader would read it with the new files, and a file the run did "
                            "not make is never replaced or removed: give an empty or new folder",
                            role, dir, other);
    } else if (errno != ENOENT) {
        return cli_errf(err, errlen, "%s: %s: %s", role, dir, strerror(errno));
    } else {
        /* made by the writer, one level: its parent must exist and take a new entry */
        return probe_file(dir, role, err, errlen);
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *p = malloc(len);
        if (!p)
            return cli_errf(err, errlen, "out of memory");
        snprintf(p, len, "%s/%s", dir, names[i]);
        int rc = train_outputs_file(o, p, role, err, errlen);
        free(p);
        if (rc)
            return -1;
    }
    return 0;
}

int train_outputs_ckpt_dir(train_outputs *o, const char *dir, const char *role, char *err,
                           size_t errlen)
{
    free(o->ckpt_dir);
    free(o->ckpt_role);
    o->ckpt_dir = strdup(dir);
    o->ckpt_role = strdup(role);
    if (!o->ckpt_dir || !o->ckpt_role)
        return cli_errf(err, errlen, "out of memory");
    return check_ckpt_dir(o, err, errlen);
}
