/* fuzz_common.c: the fatal hook and the scratch folder of the fuzz targets (fuzz.h). */
#define _GNU_SOURCE /* mkdtemp */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

jmp_buf fuzz_jump;

void fuzz_on_fatal(const char* message) {
    (void)message;
    longjmp(fuzz_jump, 1);
}

static char dir[256];

static void remove_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "fuzz: could not remove %s\n", dir);
}

const char* fuzz_path(const char* name) {
    static char path[512];
    if (!dir[0]) {
        const char* t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/focus-fuzz-XXXXXX", t ? t : "/tmp");
        if (!mkdtemp(dir)) abort();
        atexit(remove_dir);
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

const char* fuzz_write(const char* name, const uint8_t* data, size_t size) {
    const char* path = fuzz_path(name);
    FILE* fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, size, fp) != size || fclose(fp)) abort();
    return path;
}
