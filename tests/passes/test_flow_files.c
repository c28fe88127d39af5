/* test_flow_files.c — every stage of the compile flow (sbp_flow_stages, passes/pipeline.c) is
 * implemented by the file named after it: the stage name with '-' made '_', plus ".c", in
 * passes/graph/ or passes/train/ ("bind-dims" -> graph/bind_dims.c, "plan" -> train/plan.c).
 * So `sbpc --dump-ir=NAME` names the file to read, and a stage added or renamed without its file
 * fails here. The one stage outside passes/ is "import", the ONNX importer of ir/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "flow.h"

/* Stages implemented outside passes/: the stage, and its file relative to the source tree. */
static const struct {
    const char *stage, *file;
} outside[] = {
    {"import", "ir/onnx_import.c"}, /* not a pass: the graph as read from the file */
};

static bool exists(const char *path) { return access(path, R_OK) == 0; }

static void test_stage_files(void **state)
{
    (void)state;
    assert_true(sbp_n_flow_stages > 0);
    for (int i = 0; i < sbp_n_flow_stages; i++) {
        const char *name = sbp_flow_stages[i].name;
        char file[256], path[1024];
        assert_true(strlen(name) + 3 < sizeof file);
        snprintf(file, sizeof file, "%s.c", name);
        for (char *c = file; *c; c++)
            if (*c == '-')
                *c = '_';
        bool found = false;
        for (size_t k = 0; k < sizeof outside / sizeof outside[0]; k++)
            if (strcmp(outside[k].stage, name) == 0) {
                snprintf(path, sizeof path, "%s/%s", SBP_SOURCE_DIR, outside[k].file);
                found = exists(path);
            }
        static const char *const folders[] = {"passes/graph", "passes/train"};
        for (int k = 0; k < 2 && !found; k++) {
            snprintf(path, sizeof path, "%s/%s/%s", SBP_SOURCE_DIR, folders[k], file);
            found = exists(path);
        }
        if (!found)
            print_message("flow stage '%s': no passes/graph/%s or passes/train/%s\n", name,
                          file, file);
        assert_true(found);
    }
}

/* The check itself: a stage name without a file is not found. */
static void test_missing_file_is_found(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/passes/graph/no_such_stage.c", SBP_SOURCE_DIR);
    assert_false(exists(path));
    snprintf(path, sizeof path, "%s/passes/graph/fold.c", SBP_SOURCE_DIR);
    assert_true(exists(path));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_files),
        cmocka_unit_test(test_missing_file_is_found),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
