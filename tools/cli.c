/* cli.c — the option loop and the value checkers of sbpc and sbp-train (cli.h says what each
 * accepts).
 *
 * Approach: getopt_long does the scanning, with opterr = 0 and a leading ':' so that it never
 * prints glibc's own wording, and a leading '-' so that positional arguments come back in order
 * (the tools report "more than one model given ('a' and 'b')" in command-line order, and
 * POSIXLY_CORRECT does not change where options may stand). Every message is written here, from
 * getopt's return code and the argument it was looking at. The checkers are strict on purpose:
 * strtoll, strtoull and strtod skip leading whitespace, take signs and (strtod) hex floats,
 * 'nan' and 'inf', so each first checks the whole string's syntax itself and uses the C
 * library only for the conversion.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static bool is_alnum_val(int v)
{
    return (v >= 'a' && v <= 'z') || (v >= 'A' && v <= 'Z') || (v >= '0' && v <= '9');
}

void cli_init(cli *c, const char *prog, const struct option *opts, int argc, char **argv)
{
    memset(c, 0, sizeof *c);
    c->prog = prog;
    c->opts = opts;
    c->argc = argc;
    c->argv = argv;
    c->errf = stderr;
    /* '-': positional arguments in order (code 1); ':': a missing value is ':', not '?' */
    size_t k = 0;
    c->optstring[k++] = '-';
    c->optstring[k++] = ':';
    for (const struct option *o = opts; o->name; o++) {
        if (!is_alnum_val(o->val) || k + 4 > sizeof c->optstring)
            continue;
        c->optstring[k++] = (char)o->val;
        if (o->has_arg != no_argument)
            c->optstring[k++] = ':';
        if (o->has_arg == optional_argument)
            c->optstring[k++] = ':';
    }
    c->optstring[k] = 0;
    opterr = 0;
    optind = 0; /* 0, not 1: glibc and musl then re-initialise all their state */
}

static int cli_verror(cli *c, const char *fmt, va_list ap)
{
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    if (c->errf)
        fprintf(c->errf, "%s: error: %s\n", c->prog, c->err);
    return -1;
}

int cli_error(cli *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cli_verror(c, fmt, ap);
    va_end(ap);
    return -1;
}

int cli_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static const struct option *find_val(const cli *c, int val)
{
    for (const struct option *o = c->opts; o->name; o++)
        if (o->val == val && !o->flag)
            return o;
    return NULL;
}

/* The spelling of option val in messages: its short form when it has one, else --name. */
static const char *flag_name(cli *c, int val)
{
    const struct option *o = find_val(c, val);
    if (is_alnum_val(val))
        snprintf(c->flag_buf, sizeof c->flag_buf, "-%c", (char)val);
    else
        snprintf(c->flag_buf, sizeof c->flag_buf, "--%s", o ? o->name : "?");
    return c->flag_buf;
}

/* The long option argv element elem names ("--res" for --resume, "--log=x"), or NULL: several
 * options may share a val (the trainer's modules' TRAIN_OPT), so the name is what tells them
 * apart, not the val. */
static const struct option *named_by(const cli *c, const char *elem)
{
    if (elem[0] != '-' || elem[1] != '-')
        return NULL;
    const char *name = elem + 2, *eq = strchr(name, '=');
    size_t n = eq ? (size_t)(eq - name) : strlen(name);
    const struct option *found = NULL;
    int nmatch = 0;
    for (const struct option *o = c->opts; o->name; o++)
        if (strncmp(o->name, name, n) == 0) {
            if (strlen(o->name) == n)
                return o;
            found = o;
            nmatch++;
        }
    return nmatch == 1 ? found : NULL;
}

/* The spelling of the option getopt returned for elem (index li in the table, -1 unknown). */
static const char *flag_of(cli *c, int val, int li, const char *elem)
{
    const struct option *o = li >= 0 ? &c->opts[li] : named_by(c, elem);
    if (is_alnum_val(val) || !o)
        return flag_name(c, val);
    snprintf(c->flag_buf, sizeof c->flag_buf, "--%s", o->name);
    return c->flag_buf;
}

/* getopt returned '?' on argv[elem]: say which of unknown, ambiguous, or given a value it does
 * not take. getopt leaves optopt 0 for an unknown or ambiguous long option, the option's val for
 * one given "=value" it does not take, and the character for an unknown short option. */
static int bad_option(cli *c, const char *elem)
{
    if (elem[0] == '-' && elem[1] == '-') {
        const char *name = elem + 2, *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        const struct option *match[8];
        int nmatch = 0, exact = -1;
        for (const struct option *o = c->opts; o->name; o++)
            if (strncmp(o->name, name, n) == 0) {
                if (strlen(o->name) == n)
                    exact = nmatch;
                if (nmatch < 8)
                    match[nmatch] = o;
                nmatch++;
            }
        if (exact >= 0 || nmatch == 1) {
            const struct option *o = match[exact >= 0 ? exact : 0];
            if (eq && o->has_arg == no_argument)
                return cli_error(c, "--%s takes no value ('%s')", o->name, elem);
        } else if (nmatch > 1) {
            char names[256];
            size_t k = 0;
            names[0] = 0;
            for (int i = 0; i < nmatch && i < 8 && k < sizeof names; i++)
                k += (size_t)snprintf(names + k, sizeof names - k, "%s--%s", i ? ", " : "",
                                      match[i]->name);
            return cli_error(c, "option '%.*s' is ambiguous: %s%s (see --help)", (int)(n + 2),
                             elem, names, nmatch > 8 ? ", ..." : "");
        }
        return cli_error(c, "unknown option '%s' (see --help)", elem);
    }
    if (optopt && optopt != '?')
        return cli_error(c, "unknown option '-%c' (see --help)", (char)optopt);
    return cli_error(c, "unknown option '%s' (see --help)", elem);
}

int cli_next(cli *c)
{
    c->arg = NULL;
    c->flag = NULL;
    if (c->rest) {
        if (optind >= c->argc)
            return CLI_END;
        c->arg = c->argv[optind++];
        return CLI_POSITIONAL;
    }
    /* the element getopt is about to read (a cluster of short options stays at its element) */
    const int at = optind < 1 ? 1 : optind;
    const char *elem = at < c->argc ? c->argv[at] : "";
    int li = -1;
    int r = getopt_long(c->argc, c->argv, c->optstring, c->opts, &li);
    if (r == -1) {
        /* "--" or the end: whatever is left is positional (getopt stops at "--") */
        c->rest = true;
        return cli_next(c);
    }
    if (r == CLI_POSITIONAL) {
        c->arg = optarg;
        return CLI_POSITIONAL;
    }
    if (r == '?') {
        bad_option(c, elem);
        return CLI_ERROR;
    }
    if (r == ':') { /* the value is missing: the checker says what was wanted */
        c->flag = flag_of(c, optopt, -1, elem);
        c->arg = "";
        return optopt;
    }
    c->flag = flag_of(c, r, li, elem);
    c->arg = optarg;
    /* "-o=FILE": getopt reads "=FILE" as the value; the tools have always meant FILE */
    if (optarg && is_alnum_val(r) && elem[0] == '-' && elem[1] == r && optarg == elem + 2 &&
        optarg[0] == '=')
        c->arg = optarg + 1;
    return r;
}

/* ------------------------------------------------------------------ the value checkers */

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

int cli_count(cli *c, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s)
        return cli_error(c, "%s needs a value", flag);
    for (const char *p = s; *p; p++)
        if (!is_digit(*p))
            return cli_error(c, "%s: '%s' is not a %s integer", flag, s,
                             lo > 0 ? "positive" : "non-negative");
    errno = 0;
    long long v = strtoll(s, NULL, 10); /* digits only: no space, sign or base prefix left */
    if (errno || v < lo || v > hi)
        return cli_error(c, "%s: '%s' is out of range (%lld to %lld)", flag, s, (long long)lo,
                         (long long)hi);
    *out = v;
    return 0;
}

/* [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?, the whole string. */
static bool decimal_syntax(const char *s)
{
    const char *p = s + (*s == '+' || *s == '-');
    size_t before = 0, after = 0;
    while (is_digit(*p))
        p++, before++;
    if (*p == '.')
        for (p++; is_digit(*p); p++)
            after++;
    if (before + after == 0)
        return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        p += *p == '+' || *p == '-';
        if (!is_digit(*p))
            return false;
        while (is_digit(*p))
            p++;
    }
    return *p == 0;
}

int cli_real(cli *c, const char *flag, const char *s, double *out)
{
    if (!s || !*s)
        return cli_error(c, "%s needs a value", flag);
    char *end = NULL;
    errno = 0;
    const bool decimal = decimal_syntax(s);
    double v = strtod(s, &end);
    const bool whole = end && end != s && !*end && !(*s == ' ' || (*s >= '\t' && *s <= '\r'));
    if (!decimal && !(whole && !isfinite(v)))
        return cli_error(c, "%s: '%s' is not a number", flag, s);
    if (!isfinite(v) || errno == ERANGE) /* nan, inf; 1e400; 1e-400, which would be 0 */
        return cli_error(c, "%s: '%s' is out of range (not a finite number)", flag, s);
    if (v < 0)
        return cli_error(c, "%s: '%s' must not be negative", flag, s);
    *out = v == 0 ? 0.0 : v; /* -0 is 0 */
    return 0;
}

int cli_bytes(cli *c, const char *flag, const char *s, size_t *out)
{
    if (!s || !*s)
        return cli_error(c, "%s needs a value", flag);
    const char *p = s;
    while (is_digit(*p))
        p++;
    int shift = -1;
    if (p == s)
        shift = -1;
    else if (!*p)
        shift = 0;
    else if (!p[1] && (*p == 'K' || *p == 'k'))
        shift = 10;
    else if (!p[1] && (*p == 'M' || *p == 'm'))
        shift = 20;
    else if (!p[1] && (*p == 'G' || *p == 'g'))
        shift = 30;
    errno = 0;
    unsigned long long v = shift >= 0 ? strtoull(s, NULL, 10) : 0;
    if (shift < 0 || v == 0)
        return cli_error(c, "%s: '%s' is not a byte count (e.g. 8G, 512M, 1048576)", flag, s);
    if (errno || v > (SIZE_MAX >> shift))
        return cli_error(c, "%s: '%s' is out of range (at most %zu bytes)", flag, s, SIZE_MAX);
    *out = (size_t)v << shift;
    return 0;
}

int cli_choice(cli *c, const char *flag, const char *s, const char *const *words, int *out)
{
    if (!s || !*s)
        return cli_error(c, "%s needs a value", flag);
    int n = 0;
    for (; words[n]; n++)
        if (strcmp(s, words[n]) == 0) {
            *out = n;
            return 0;
        }
    char list[256];
    size_t k = 0;
    list[0] = 0;
    for (int i = 0; i < n && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s",
                              i == 0 ? "" : i == n - 1 ? " or " : ", ", words[i]);
    return cli_error(c, "%s: '%s' is not %s", flag, s, list);
}

int cli_path(cli *c, const char *flag, const char *s, const char **out)
{
    if (!s || !*s)
        return cli_error(c, "%s needs a file name", flag);
    *out = s;
    return 0;
}

char *cli_human_bytes(char *buf, size_t n, double bytes)
{
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024)
        snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
    else
        snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
    return buf;
}
