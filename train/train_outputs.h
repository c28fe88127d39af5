/* train_outputs.h — every file a training run will write, known and proved writable before
 * step 1.
 *
 * A run that trains for hours and then finds it cannot write its result, or that writes its
 * result over the data it trained on, has lost the hours or the data. So sbp-train lists every
 * output before it trains: plain files (--save, --save-safetensors, --dump-grads, --log), the
 * files inside output folders (--save-adapter DIR writes DIR/adapter_model.safetensors and
 * DIR/adapter_config.json; a future folder output lists its own files the same way), and the
 * checkpoint folder, whose step-*.safetensors files are written and pruned. Each one is
 *   - checked against every input and every other output (ir/files.h, sbp_file_check_output:
 *     by file identity, so links and other spellings of a path are caught);
 *   - probed: its directory exists and a file can be created in it (the writers replace files
 *     by renaming a temporary made next to them, so that is what writing needs); an output
 *     folder that does not exist yet needs a parent in which it can be made; a character
 *     device (/dev/null) is a sink and needs only to be there.
 * The checkpoint folder is checked the other way round as well: no input and no other output
 * may be one of its checkpoint files, which pruning would delete.
 *
 * An output folder that exists must hold only the files the run writes there (and temporaries
 * of earlier writers): a loader reads a folder whole, so a file left from another run
 * (adapter_config.json beside a new model, a chat_template.jinja the new tokenizer does not
 * have) would be applied to the new files. Such a folder is refused, naming the file; nothing
 * is removed. Two output folders may not be one.
 *
 * Errors are one line in err naming the option and the path; nothing here prints or exits,
 * and nothing is left on disk (a probe file is removed at once, a folder is not created).
 */
#ifndef SBP_TRAIN_OUTPUTS_H
#define SBP_TRAIN_OUTPUTS_H

#include <stdbool.h>
#include <stddef.h>

#include "files.h"

typedef struct train_outputs {
    const sbp_file_set *inputs; /* what the run reads (not owned) */
    sbp_file_set files;         /* every output file registered so far */
    char *ckpt_dir;             /* the checkpoint folder (malloc'd), or NULL */
    char *ckpt_role;            /* its option, for messages (malloc'd) */
    struct {
        char *dir;              /* an output folder registered (malloc'd) */
        const char *role;       /* its option */
    } dirs[4];
    int n_dirs;
} train_outputs;

/* Starts a registry against the run's inputs (kept by pointer: they must outlive it). */
void train_outputs_init(train_outputs *o, const sbp_file_set *inputs);
void train_outputs_free(train_outputs *o); /* NULL-safe */

/* An output file, written by `role` (the option): checked and probed as above. */
int train_outputs_file(train_outputs *o, const char *path, const char *role, char *err,
                       size_t errlen);

/* An output folder that the writer creates (one level) when missing, and the n files it will
 * write there (names relative to dir). The folder must be a directory holding none but those
 * files, or not exist yet; nor may it be an output folder registered before. */
int train_outputs_dir(train_outputs *o, const char *dir, const char *role,
                      const char *const *names, int n, char *err, size_t errlen);

/* The checkpoint folder (it is made and probed by train_ckpt_prepare): every input and output
 * registered before or after must not be one of its step-*.safetensors files. */
int train_outputs_ckpt_dir(train_outputs *o, const char *dir, const char *role, char *err,
                           size_t errlen);

#endif
