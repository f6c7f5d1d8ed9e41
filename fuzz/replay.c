/* replay.c: run a fuzz target (linked in) over files and folders of inputs without libFuzzer:
 * the corpus-replay test of the normal build, and a way to rerun a finding.
 *   replay_TARGET PATH...   (a folder: every file in it) */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/io.h"
#include "fuzz.h"

static int run_file(const char* path) {
    size_t n;
    char* data = read_file(path, &n);
    LLVMFuzzerTestOneInput((const uint8_t*)data, n);
    free(data);
    return 1;
}

int main(int argc, char** argv) {
    int runs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) continue; /* an absent folder: no saved inputs of that kind */
        if (!S_ISDIR(st.st_mode)) {
            runs += run_file(argv[i]);
            continue;
        }
        DIR* d = opendir(argv[i]);
        struct dirent* e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            runs += run_file(path);
        }
        if (d) closedir(d);
    }
    printf("%s: %d inputs replayed, no finding\n", argv[0], runs);
    return runs ? 0 : 1;
}
