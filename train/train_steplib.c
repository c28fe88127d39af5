/* train_steplib.c — the step library (train_steplib.h): checked as a file, dlopen'd, its ABI
 * version and self-description checked, and the runtime functions picked from the step or from
 * the runtime linked into the trainer.
 */
#include "train_steplib.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"

/* Fills rt: from the step library where it can (see above), else from the linked runtime.
 * `target` is the step's; a step for another backend than the linked one must export all. */
/* The arena's and the host workspace's allocators, each alloc and free one copy's pair: the
 * step's when runtime_load took arena_alloc from it, else ours. */
static void pick_memory(train_rt *rt, void *lib)
{
    void *afree = rt->arena_ctx == &rt->step_ctx ? dlsym(lib, "sbprt_arena_free") : NULL;
    if (afree) {
        *(void **)(&rt->arena_free) = afree;
    } else {
        rt->arena_alloc = sbprt_arena_alloc;
        rt->arena_free = sbprt_arena_free;
        rt->arena_ctx = &rt->own_ctx;
    }
    void *halloc = rt->arena_ctx == &rt->step_ctx ? dlsym(lib, "sbprt_host_alloc") : NULL;
    void *hfree = rt->arena_ctx == &rt->step_ctx ? dlsym(lib, "sbprt_host_free") : NULL;
    if (halloc && hfree) {
        *(void **)(&rt->host_alloc) = halloc;
        *(void **)(&rt->host_free) = hfree;
    } else if (rt->arena_ctx == &rt->own_ctx) {
        rt->host_alloc = sbprt_host_alloc;
        rt->host_free = sbprt_host_free;
    }
}

/* The multi-tensor forms and the launch counter, each from the copy its per-tensor function
 * came from (a step without them gets NULL: the trainer then loops per tensor). */
static void pick_multi(train_rt *rt, void *lib)
{
#define RT_PICK_MULTI(field, fn, ctxf)                                                            \
    do {                                                                                          \
        if (rt->ctxf == &rt->own_ctx)                                                             \
            rt->field = fn;                                                                       \
        else                                                                                      \
            *(void **)(&rt->field) = dlsym(lib, #fn);                                             \
    } while (0)
    RT_PICK_MULTI(sgd_update_multi, sbprt_sgd_update_multi, sgd_ctx);
    RT_PICK_MULTI(adamw_update_multi, sbprt_adamw_update_multi, adamw_ctx);
    RT_PICK_MULTI(grad_sq_norm_multi, sbprt_grad_sq_norm_multi, norm_ctx);
    RT_PICK_MULTI(scale_multi, sbprt_scale_multi, scale_ctx);
#undef RT_PICK_MULTI
    if (rt->ctx_from_step)
        *(void **)(&rt->ctx_launches) = dlsym(lib, "sbprt_ctx_launches");
    else
        rt->ctx_launches = sbprt_ctx_launches;
}

static int runtime_load(train_rt *rt, void *lib, const char *step_path, const char *target,
                        const train_sink *s)
{
    memset(rt, 0, sizeof *rt);
    void *create = dlsym(lib, "sbprt_ctx_create"), *destroy = dlsym(lib, "sbprt_ctx_destroy");
    rt->ctx_from_step = create && destroy;
    if (rt->ctx_from_step) {
        *(void **)(&rt->ctx_create) = create;
        *(void **)(&rt->ctx_destroy) = destroy;
    } else {
        rt->ctx_create = sbprt_ctx_create;
        rt->ctx_destroy = sbprt_ctx_destroy;
    }
    /* A function from the step when the step made the context and exports it; else ours. */
#define RT_PICK(field, fn, ctxf)                                                                  \
    do {                                                                                          \
        void *p_ = rt->ctx_from_step ? dlsym(lib, #fn) : NULL;                                    \
        if (p_) {                                                                                 \
            *(void **)(&rt->field) = p_;                                                          \
            rt->ctxf = &rt->step_ctx;                                                             \
        } else {                                                                                  \
            rt->field = fn;                                                                       \
            rt->ctxf = &rt->own_ctx;                                                              \
            if (!rt->own_missing)                                                                 \
                rt->own_missing = #fn;                                                            \
        }                                                                                         \
    } while (0)
    RT_PICK(sync, sbprt_sync, sync_ctx);
    RT_PICK(copy, sbprt_memcpy, copy_ctx);
    RT_PICK(sgd_update, sbprt_sgd_update, sgd_ctx);
    RT_PICK(adamw_update, sbprt_adamw_update, adamw_ctx);
    RT_PICK(grad_sq_norm, sbprt_grad_sq_norm, norm_ctx);
    RT_PICK(scale, sbprt_scale, scale_ctx);
    RT_PICK(arena_alloc, sbprt_arena_alloc, arena_ctx);
#undef RT_PICK
    pick_multi(rt, lib);
    pick_memory(rt, lib);
    void *last = rt->ctx_from_step ? dlsym(lib, "sbprt_ctx_last_error") : NULL;
    void *mem = rt->ctx_from_step ? dlsym(lib, "sbprt_device_memory") : NULL;
    if (last)
        *(void **)(&rt->last_error) = last;
    else
        rt->last_error = sbprt_ctx_last_error;
    void *nth = rt->ctx_from_step ? dlsym(lib, "sbprt_ctx_nthreads") : NULL;
    if (nth)
        *(void **)(&rt->ctx_nthreads) = nth;
    else if (!rt->ctx_from_step)
        rt->ctx_nthreads = sbprt_ctx_nthreads;
    if (mem)
        *(void **)(&rt->device_memory) = mem;
    else if (!rt->ctx_from_step)
        rt->device_memory = sbprt_device_memory;
    *(void **)(&rt->step_init) = dlsym(lib, "sbp_step_init");
    *(void **)(&rt->step_release) = dlsym(lib, "sbp_step_release");
    void *name = rt->ctx_from_step ? dlsym(lib, "sbprt_backend_name") : NULL;
    void *status = dlsym(lib, "sbprt_status_string");
    if (name)
        *(void **)(&rt->backend_name) = name;
    else
        rt->backend_name = sbprt_backend_name;
    if (status)
        *(void **)(&rt->status_string) = status;
    else
        rt->status_string = sbprt_status_string;

    bool foreign = target && strcmp(target, sbprt_backend_name()) != 0;
    if (foreign && (!rt->ctx_from_step || rt->own_missing || rt->arena_ctx == &rt->own_ctx))
        return train_err(s, "%s was compiled for the '%s' backend but does not export %s, and this "
                     "sbp-train's own runtime is '%s'", step_path, target,
                     !rt->ctx_from_step ? "sbprt_ctx_create"
                     : rt->own_missing  ? rt->own_missing
                                        : "sbprt_arena_free",
                     sbprt_backend_name());
    return 0;
}

/* Creates the contexts: the step's, and ours where some function comes from our runtime. */
int train_steplib_start(train_steplib *L, int nthreads, const train_sink *s)
{
    train_rt *rt = &L->rt;
    int st = rt->ctx_create(&rt->step_ctx, nthreads);
    if (st) {
        const char *why = rt->last_error(NULL);
        return train_err(s, "cannot create a %s runtime context: %s%s%s", rt->backend_name(),
                     rt->status_string(st), why && *why ? ": " : "", why ? why : "");
    }
    if (!rt->ctx_from_step) {
        rt->own_ctx = rt->step_ctx; /* one copy, one context */
        return 0;
    }
    bool need_own = rt->sync_ctx == &rt->own_ctx || rt->copy_ctx == &rt->own_ctx ||
                    rt->sgd_ctx == &rt->own_ctx || rt->adamw_ctx == &rt->own_ctx ||
                    rt->arena_ctx == &rt->own_ctx || rt->norm_ctx == &rt->own_ctx ||
                    rt->scale_ctx == &rt->own_ctx;
    if (need_own && (st = sbprt_ctx_create(&rt->own_ctx, nthreads)))
        return train_err(s, "cannot create a runtime context: %s", sbprt_status_string(st));
    return 0;
}

/* The CPU threads a cpu step's reductions are split over (what makes its results bit for bit
 * reproducible only at the same count), or 0 for another target or when the step does not say. */
int train_steplib_threads(const train_steplib *L, int64_t asked)
{
    const sbp_step_info *in = L->in;
    const train_rt *rt = &L->rt;
    if (!in->target || strcmp(in->target, "cpu") != 0)
        return 0;
    int n = rt->ctx_nthreads ? rt->ctx_nthreads(rt->step_ctx) : 0;
    return n > 0 ? n : (int)asked;
}

/* "; <the runtime's diagnostic>" for a failure on ctx, or "" when it recorded none. */
const char *train_steplib_why(const train_steplib *L, sbprt_ctx *ctx, char *buf, size_t n)
{
    const train_rt *rt = &L->rt;
    const char *why = rt->last_error ? rt->last_error(ctx) : NULL;
    if (!why || !*why)
        return "";
    snprintf(buf, n, " (%s)", why);
    return buf;
}

/* The step library stays loaded until the process ends: a cuda step's libraries (the CUDA
 * runtime, cuBLAS, libstdc++) keep global state that dlclose would leave unreachable, which
 * LeakSanitizer then reports as leaks. */
void train_steplib_stop(train_steplib *L)
{
    train_rt *rt = &L->rt;
    if (rt->step_ctx && rt->step_release)
        rt->step_release(rt->step_ctx); /* the step's device copies of its constants */
    if (rt->own_ctx && rt->own_ctx != rt->step_ctx)
        sbprt_ctx_destroy(rt->own_ctx);
    if (rt->step_ctx)
        rt->ctx_destroy(rt->step_ctx);
    free(L->host_params_tab);
    L->host_params_tab = NULL;
    rt->own_ctx = rt->step_ctx = NULL;
}

/* Checks that the step's self-description is usable: positive dims whose products fit the
 * runtime's int sizes, and a parameter table whose shapes, offsets and ties are consistent. */
static int validate_info(const sbp_step_info *in, const char *step_path, const train_sink *s)
{
    const char *bad = "the step's self-description is inconsistent";
    if (in->batch < 1 || in->seq_len < 1 || in->vocab < 1 || in->batch > INT32_MAX ||
        in->seq_len > INT32_MAX || in->vocab > INT32_MAX ||
        in->batch * in->seq_len > INT32_MAX)
        return train_err(s, "%s: %s: batch %lld, sequence length %lld, vocabulary %lld", step_path, bad,
                     (long long)in->batch, (long long)in->seq_len, (long long)in->vocab);
    if (in->n_params < 0 || (in->n_params > 0 && !in->params))
        return train_err(s, "%s: %s: %d parameters but no table", step_path, bad, in->n_params);
    if (in->param_elems > SIZE_MAX / 16 || in->workspace_bytes > SIZE_MAX / 4 ||
        in->grad_elems > SIZE_MAX / 16) /* (bf16 weights take half the room of their grads) */
        return train_err(s, "%s: %s: absurd block sizes", step_path, bad);
    for (int i = 0; i < in->n_params; i++) {
        const sbp_step_param *p = &in->params[i];
        if (!p->name || !p->name[0])
            return train_err(s, "%s: %s: parameter %d has no name", step_path, bad, i);
        if (p->rank < 0 || p->rank > SBP_STEP_MAX_RANK)
            return train_err(s, "%s: %s: parameter '%s' has rank %d", step_path, bad, p->name, p->rank);
        size_t numel = 1;
        for (int d = 0; d < p->rank; d++) {
            if (p->dims[d] < 0 || (p->dims[d] > 0 && numel > SIZE_MAX / 16 / (size_t)p->dims[d]))
                return train_err(s, "%s: %s: parameter '%s' has a bad dimension %lld", step_path, bad,
                             p->name, (long long)p->dims[d]);
            numel *= (size_t)p->dims[d];
        }
        if (numel != p->numel)
            return train_err(s, "%s: %s: parameter '%s' has numel %zu, but its shape holds %zu",
                         step_path, bad, p->name, p->numel, numel);
        for (int j = 0; j < i; j++)
            if (strcmp(in->params[j].name, p->name) == 0)
                return train_err(s, "%s: %s: parameter '%s' is listed twice", step_path, bad, p->name);
        if (p->tied_to >= 0) {
            const sbp_step_param *o = p->tied_to < in->n_params ? &in->params[p->tied_to] : NULL;
            if (!o || p->tied_to == i || o->tied_to >= 0 || o->rank != 2 || p->rank != 2 ||
                o->dims[0] != p->dims[1] || o->dims[1] != p->dims[0])
                return train_err(s, "%s: %s: parameter '%s' is tied to %d, which is not a parameter "
                             "whose transpose has its shape", step_path, bad, p->name,
                             p->tied_to);
        } else if (p->tied_to != -1 || p->offset > in->param_elems ||
                   sbp_step_param_room(p) > in->param_elems - p->offset) {
            return train_err(s, "%s: %s: parameter '%s' (offset %zu, %zu elements) lies outside the "
                         "parameter block of %zu elements", step_path, bad, p->name, p->offset,
                         p->numel, in->param_elems);
        }
        /* a weight kept as bf16 has storage, and is frozen (--base-precision bf16) or its
         * master is the caller's (--offload optimizer) */
        const bool masters_ours = in->offload && strstr(in->offload, "optimizer");
        if (p->storage != SBP_STEP_PARAM_F32 &&
            (p->storage != SBP_STEP_PARAM_BF16 || (p->trainable && !masters_ours) ||
             p->tied_to >= 0))
            return train_err(s, "%s: %s: parameter '%s' has storage %d (0: fp32, 1: bf16 for a frozen "
                         "weight with storage of its own)", step_path, bad, p->name, p->storage);
        /* the gradient block: a trained parameter's slice inside it, none for a frozen one (a
         * tied copy shares its owner's) */
        const sbp_step_param *own = p->tied_to >= 0 ? &in->params[p->tied_to] : p;
        if (own->trainable != p->trainable || p->grad_offset != own->grad_offset ||
            (p->trainable ? p->grad_offset > in->grad_elems ||
                                own->numel > in->grad_elems - p->grad_offset
                          : p->grad_offset != SIZE_MAX))
            return train_err(s, "%s: %s: parameter '%s' (%s, gradient offset %zu) does not fit the "
                         "gradient block of %zu elements", step_path, bad, p->name,
                         p->trainable ? "trained" : "frozen", p->grad_offset, in->grad_elems);
    }
    return 0;
}

/* A shared object whose program headers or segments reach past its end (a truncated copy, a
 * build that was interrupted) makes dlopen map pages beyond the file, and the loader's first
 * touch of them is SIGBUS. So before dlopen: a regular file (opened without blocking), an ELF64
 * header of this machine's byte order, and the program header table, the section header table
 * and every PT_LOAD segment's file bytes inside the file. */
static int check_step_file(const char *path, const train_sink *s)
{
    char why[600];
    struct stat st;
    int fd = sbp_file_open_input(path, &st, why, sizeof why);
    if (fd < 0)
        return train_err(s, "cannot load the step library %s", why);
    const uint64_t size = (uint64_t)st.st_size;
    Elf64_Ehdr eh;
    Elf64_Phdr *ph = NULL;
    const char *bad = NULL;
    char detail[200] = "";
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh) {
        bad = "shorter than an ELF header";
    } else if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
        bad = "not an ELF file";
    } else if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] !=
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
                                                        ELFDATA2LSB
#else
                                                        ELFDATA2MSB
#endif
    ) {
        bad = "not a 64-bit ELF file of this machine's byte order";
    } else if (eh.e_phnum == 0 || eh.e_phentsize != sizeof(Elf64_Phdr)) {
        bad = "it has no program headers";
    } else if (eh.e_phoff > size || (uint64_t)eh.e_phnum * eh.e_phentsize > size - eh.e_phoff) {
        bad = "truncated: the program header table";
        snprintf(detail, sizeof detail, " (bytes %llu + %u x %u)", (unsigned long long)eh.e_phoff,
                 eh.e_phnum, eh.e_phentsize);
    } else if (eh.e_shoff != 0 && (eh.e_shoff > size || (uint64_t)eh.e_shnum * eh.e_shentsize >
                                                            size - eh.e_shoff)) {
        bad = "truncated: the section header table";
        snprintf(detail, sizeof detail, " (bytes %llu + %u x %u)", (unsigned long long)eh.e_shoff,
                 eh.e_shnum, eh.e_shentsize);
    } else if (!(ph = malloc((size_t)eh.e_phnum * sizeof *ph))) {
        bad = "out of memory";
    } else if (pread(fd, ph, (size_t)eh.e_phnum * sizeof *ph, (off_t)eh.e_phoff) !=
               (ssize_t)((size_t)eh.e_phnum * sizeof *ph)) {
        bad = "its program headers cannot be read";
    } else {
        for (int i = 0; i < eh.e_phnum && !bad; i++)
            if (ph[i].p_type == PT_LOAD &&
                (ph[i].p_filesz > size || ph[i].p_offset > size - ph[i].p_filesz)) {
                bad = "truncated: a loadable segment";
                snprintf(detail, sizeof detail, " (segment %d: bytes %llu + %llu)", i,
                         (unsigned long long)ph[i].p_offset, (unsigned long long)ph[i].p_filesz);
            }
    }
    free(ph);
    close(fd);
    if (bad && strncmp(bad, "truncated", 9) == 0)
        return train_err(s, "cannot load the step library %s: %s%s reaches past the end of the "
                     "%llu-byte file", path, bad, detail, (unsigned long long)size);
    if (bad)
        return train_err(s, "cannot load the step library %s: %s", path, bad);
    return 0;
}


typedef const sbp_step_info *(*step_info_fn)(void);

/* sbpc --offload optimizer: the trainer's parameters are an fp32 master block in host memory,
 * every parameter with storage at its own offset in table order (a tied one at its owner's);
 * the optimizer, the gradient norm and clipping run there with this trainer's own runtime. */
static int host_state_view(train_steplib *L, const train_sink *s)
{
    const sbp_step_info *dev = L->in;
    L->host_state = dev->offload && strstr(dev->offload, "optimizer");
    if (!L->host_state)
        return 0;
    if (L->host_visible)
        return train_err(s, "%s: a cpu step with its optimizer offloaded is not a thing sbpc "
                         "makes", L->path);
    sbp_step_param *tab = L->host_params_tab = malloc(((size_t)dev->n_params + 1) * sizeof *tab);
    if (!tab)
        return train_err(s, "out of memory");
    size_t off = 0;
    for (int i = 0; i < dev->n_params; i++) {
        tab[i] = dev->params[i];
        tab[i].storage = SBP_STEP_PARAM_F32;
        if (tab[i].tied_to < 0) {
            tab[i].offset = off;
            off += tab[i].numel;
        }
    }
    for (int i = 0; i < dev->n_params; i++)
        if (tab[i].tied_to >= 0)
            tab[i].offset = tab[tab[i].tied_to].offset;
    L->host_info = *dev;
    L->host_info.params = tab;
    L->host_info.param_elems = off;
    L->in = &L->host_info;
    train_rt *rt = &L->rt;
    rt->adamw_update = sbprt_adamw_update;
    rt->sgd_update = sbprt_sgd_update;
    rt->grad_sq_norm = sbprt_grad_sq_norm;
    rt->scale = sbprt_scale;
    rt->adamw_update_multi = sbprt_adamw_update_multi;
    rt->sgd_update_multi = sbprt_sgd_update_multi;
    rt->grad_sq_norm_multi = sbprt_grad_sq_norm_multi;
    rt->scale_multi = sbprt_scale_multi;
    rt->adamw_ctx = rt->sgd_ctx = rt->norm_ctx = rt->scale_ctx = &rt->own_ctx;
    return 0;
}

/* A sequence-parallel step: the trainer's view of it reads whole rows (see sp_info). */
static int seq_view(train_steplib *L, const train_sink *s)
{
    const sbp_step_info *in = L->in;
    L->sp = in->seq_parallel >= 1 ? in->seq_parallel : 1;
    L->sp_tl = in->seq_len;
    if (in->seq_parallel < 1)
        return 0;
    if (L->host_state)
        return train_err(s, "%s: a sequence-parallel step with its optimizer offloaded is not a "
                         "thing sbpc makes", L->path);
    /* sbpc refuses them too; a step from another compiler would train on a wrong loss */
    if (in->objective && (!strcmp(in->objective, "dpo") || !strcmp(in->objective, "grpo")))
        return train_err(s, "%s: a sequence-parallel %s step does not train yet (a row's "
                         "log-probability would be summed over its ranks first)", L->path,
                         in->objective);
    *(void **)(&L->set_comm) = dlsym(L->lib, "sbprt_ctx_set_comm");
    if (!L->set_comm)
        return train_err(s, "%s is compiled for --seq-parallel %d but does not export "
                         "sbprt_ctx_set_comm: recompile it with the matching sbpc", L->path,
                         L->sp);
    if (in->seq_len > INT32_MAX / L->sp || in->batch * in->seq_len * L->sp > INT32_MAX)
        return train_err(s, "%s: its whole rows (%d x %lld tokens) are too long", L->path, L->sp,
                         (long long)in->seq_len);
    L->sp_info = *in;
    L->sp_info.seq_len = in->seq_len * L->sp;
    L->in = &L->sp_info;
    return 0;
}

int train_steplib_open(train_steplib *L, const char *path, const train_sink *s)
{
    memset(L, 0, sizeof *L);
    L->path = path;
    char *so_path = NULL;
    if (!strchr(path, '/')) { /* dlopen would search the library path instead */
        so_path = malloc(strlen(path) + 3);
        if (so_path)
            sprintf(so_path, "./%s", path);
    }
    if (check_step_file(so_path ? so_path : path, s)) {
        free(so_path);
        return -1;
    }
    L->lib = dlopen(so_path ? so_path : path, RTLD_NOW | RTLD_LOCAL);
    free(so_path);
    if (!L->lib) {
        const char *why = dlerror();
        return train_err(s, "cannot load the step library %s: %s", path,
                         why ? why : "dlopen failed");
    }
    step_info_fn get_info;
    *(void **)(&get_info) = dlsym(L->lib, "sbp_step_get_info");
    *(void **)(&L->run) = dlsym(L->lib, "sbp_step_run");
    if (!get_info || !L->run)
        return train_err(s, "%s is not a compiled training step: it does not export %s", path,
                         !get_info ? "sbp_step_get_info" : "sbp_step_run");
    const sbp_step_info *in = L->in = get_info();
    if (!in)
        return train_err(s, "%s: sbp_step_get_info() returned NULL", path);
    if (in->abi_version != SBP_STEP_ABI_VERSION)
        return train_err(s, "%s was built for step ABI version %d, but this sbp-train reads "
                         "version %d: recompile it with the matching sbpc", path,
                         in->abi_version, SBP_STEP_ABI_VERSION);
    if (validate_info(in, path, s) || runtime_load(&L->rt, L->lib, path, in->target, s))
        return -1;
    L->host_visible = strcmp(L->rt.backend_name(), "cpu") == 0;
    L->step_in = in;
    if (host_state_view(L, s))
        return -1;
    return seq_view(L, s);
}

int train_steplib_want_eval(train_steplib *L, const char *flag, const train_sink *s)
{
    const sbp_step_info *in = L->in;
    *(void **)(&L->eval) = dlsym(L->lib, "sbp_step_eval");
    if (!L->eval || in->eval_workspace_bytes == 0)
        return train_err(s, "%s: %s has no evaluation entry point (sbp_step_eval): a %s step "
                         "has none%s", flag, L->path, in->objective ? in->objective : "?",
                         in->objective && (strcmp(in->objective, "sft") == 0 ||
                                           strcmp(in->objective, "graph-loss") == 0)
                             ? " when compiled with sbpc --no-eval; recompile it without"
                             : " (evaluation is the language-modelling loss of sft and "
                               "graph-loss steps)");
    return 0;
}

int train_steplib_want_logps(train_steplib *L, const train_sink *s)
{
    const sbp_step_info *in = L->in;
    *(void **)(&L->logps) = dlsym(L->lib, "sbp_step_logps");
    if (!L->logps || in->logp_workspace_bytes == 0)
        return train_err(s, "--dataset: %s has no log-probability entry point (sbp_step_logps), "
                         "which computes the reference log-probs: recompile it without "
                         "--no-eval", L->path);
    if (in->logp_workspace_bytes > in->workspace_bytes)
        return train_err(s, "%s: its log-probability workspace (%zu bytes) exceeds the training "
                         "workspace (%zu bytes) it is to share", L->path,
                         in->logp_workspace_bytes, in->workspace_bytes);
    return 0;
}

int train_steplib_copy(const train_steplib *L, void *dst, const void *src, size_t n, int dir,
                       const train_sink *s)
{
    const train_rt *rt = &L->rt;
    int st = TRAIN_RT(*rt, copy, copy_ctx, dst, src, n, dir);
    if (!st)
        return 0;
    char why[400];
    return train_err(s, "copying between host and %s memory failed: %s%s", rt->backend_name(),
                     rt->status_string(st), train_steplib_why(L, *rt->copy_ctx, why, sizeof why));
}
