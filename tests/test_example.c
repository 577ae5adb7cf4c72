/* The README's embedding example runs: a prefix cached in one life restores from disk in the next.
 */
#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_quickstart_restores_from_disk(void **state)
{
    (void)state;
    char *dir = scratch_dir("quickstart");
    assert_non_null(dir);
    char *cmd = strf("%s/examples/quickstart '%s/cache' 2>&1", KVT_BUILD_DIR, dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[256] = "";
    char *got = fgets(line, sizeof(line), p);
    int status = pclose(p);
    assert_non_null(got);
    assert_string_equal(line, "restored 1000 of 1010 prompt tokens from disk\n");
    assert_int_equal(status, 0);

    /* a second run finds its own earlier entries too and still restores the prefix */
    p = popen(cmd, "r");
    got = fgets(line, sizeof(line), p);
    assert_int_equal(pclose(p), 0);
    assert_non_null(got);
    assert_string_equal(line, "restored 1000 of 1010 prompt tokens from disk\n");
    free(cmd);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quickstart_restores_from_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
