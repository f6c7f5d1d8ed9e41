#define _GNU_SOURCE /* mkdtemp, nftw */
#include "testutil.h"

#include <ftw.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int tu_passed = 0, tu_failed = 0;

int tu_finish(const char* name) {
    printf("%s: %d passed, %d failed\n", name, tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

void tu_randn(real* x, size_t n, double scale, Rng* rng) {
    for (size_t i = 0; i < n; i++) x[i] = (real)(rng_normal(rng) * scale);
}

double tu_max_abs_diff(const real* a, const real* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}

#include <sys/stat.h>

static int exists(const char* p) {
    struct stat st;
    return stat(p, &st) == 0;
}

const char* tu_data_dir(void) {
    static char buf[4096];
    const char* env = getenv("FOCUS_DATA");
    if (env && exists(env)) return env;
    snprintf(buf, sizeof buf, "%s/../shared/data", FOCUS_SOURCE_DIR);
    return exists(buf) ? buf : NULL;
}

const char* tu_smollm2(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", FOCUS_SOURCE_DIR);
    return exists(buf) ? buf : NULL;
}

const char* tu_gemma3(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/cache/models/gemma-3-270m-q4_k_m.gguf", FOCUS_SOURCE_DIR);
    return exists(buf) ? buf : NULL;
}

static char tmpdir[4096];
static pid_t tmpdir_owner;

static int remove_entry(const char* p, const struct stat* st, int flag, struct FTW* f) {
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void remove_tmpdir(void) {
    if (tmpdir[0] && getpid() == tmpdir_owner) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char* tu_tmpdir(void) {
    if (!tmpdir[0]) {
        const char* base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/focus-test-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmpdir)) fatal("%s: cannot create a temporary folder", tmpdir);
        tmpdir_owner = getpid();
        atexit(remove_tmpdir);
    }
    return tmpdir;
}

const char* tu_path(const char* name) {
    static char bufs[8][4096 + 256];
    static int next;
    char* b = bufs[next++ % 8];
    if (strlen(name) > 255) fatal("tu_path: name too long: %s", name);
    snprintf(b, sizeof bufs[0], "%s/%s", tu_tmpdir(), name);
    return b;
}

int tu_fails_with(void (*fn)(const void*), const void* arg, const char* want, char* msg, size_t n) {
    int fd[2];
    if (pipe(fd)) return snprintf(msg, n, "pipe failed"), 0;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        fn(arg);
        exit(0);
    }
    close(fd[1]);
    char buf[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fd[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)r;
    close(fd[0]);
    buf[len] = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    /* count the lines, leaving out what a sanitizer adds at exit ("==PID==...") */
    int lines = 0;
    char kept[4096];
    size_t k = 0;
    for (char* line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "==", 2)) continue;
        lines++;
        k += (size_t)snprintf(kept + k, sizeof kept - k, "%s%s", k ? " | " : "", line);
        if (k >= sizeof kept) k = sizeof kept - 1;
    }
    kept[k] = 0;
    memcpy(buf, kept, k + 1);
    snprintf(msg, n, "%s%s", WIFEXITED(status) ? "" : "[killed by a signal] ", buf);
    return WIFEXITED(status) && WEXITSTATUS(status) != 0 && lines == 1 && strstr(buf, want);
}
