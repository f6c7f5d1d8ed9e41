/* io.c: whole-file reads and atomic writes (see io.h). */
#define _GNU_SOURCE
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/common.h"

int io_regular(const char* path) {
    struct stat st;
    if (stat(path, &st)) return -1;
    if (S_ISREG(st.st_mode)) return 0;
    fatal("%s: not a regular file but %s; give a file", path,
          S_ISDIR(st.st_mode)    ? "a folder"
          : S_ISFIFO(st.st_mode) ? "a FIFO (a named pipe would block the read)"
          : S_ISSOCK(st.st_mode) ? "a socket"
                                 : "a device");
    return -1;
}

FILE* fopen_regular(const char* path, const char* mode) {
    if (io_regular(path)) return NULL;
    return fopen(path, mode);
}

void fclose_checked(FILE* f, const char* path) {
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    if (fclose(f) && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        unlink(path);
        fatal("%s: write failed: %s (the file was removed)", path, e ? strerror(e) : "I/O error");
    }
}

static void check_stdout(void) {
    if (fflush(stdout) || ferror(stdout)) {
        int e = errno;
        /* fatal would call exit again from an atexit handler */
        fprintf(stderr, "focus: standard output: write failed: %s\n",
                e ? strerror(e) : "I/O error");
        _exit(1);
    }
}

void io_guard_output(void) {
    signal(SIGXFSZ, SIG_IGN);
    atexit(check_stdout);
}

char* read_file(const char* path, size_t* len) {
    if (io_regular(path)) fatal("%s: cannot open: %s", path, strerror(errno));
    FILE* fp = fopen(path, "rb");
    if (!fp) fatal("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    const char* why = NULL;
    char* s = NULL;
    if (fstat(fileno(fp), &st) || !S_ISREG(st.st_mode)) {
        why = "not a regular file (a directory or a device?)";
    } else {
        s = mallocCheck((size_t)st.st_size + 1);
        if (fread(s, 1, (size_t)st.st_size, fp) != (size_t)st.st_size) why = "read failed";
    }
    fclose(fp);
    if (why) {
        free(s);
        fatal("%s: %s", path, why);
    }
    s[st.st_size] = 0;
    *len = (size_t)st.st_size;
    return s;
}

char* read_stdin(size_t* len) {
    size_t n = 0, cap = 1 << 16;
    char* s = mallocCheck(cap + 1);
    for (;;) {
        size_t got = fread(s + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) s = reallocCheck(s, (cap *= 2) + 1);
    }
    if (ferror(stdin)) {
        free(s);
        fatal("standard input: read failed: %s", strerror(errno));
    }
    s[n] = 0;
    *len = n;
    return s;
}

char* read_file_opt(const char* path, size_t* len) {
    FILE* fp = fopen_regular(path, "rb");
    if (!fp) return NULL;
    struct stat st;
    if (fstat(fileno(fp), &st) || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return NULL;
    }
    char* s = NULL;
    long n = -1;
    if (!fseek(fp, 0, SEEK_END) && (n = ftell(fp)) >= 0 && !fseek(fp, 0, SEEK_SET)) {
        s = mallocCheck((size_t)n + 1);
        if (fread(s, 1, (size_t)n, fp) != (size_t)n) {
            free(s);
            s = NULL;
        } else {
            s[n] = 0;
            if (len) *len = (size_t)n;
        }
    }
    fclose(fp);
    return s;
}

void fsync_parent_dir(const char* path) {
    char* copy = strdup(path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

void write_file_atomic(const char* path, const void* const* parts, const size_t* sizes,
                       int nparts) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fatal("%s: cannot create: %s", tmp, strerror(errno));
    for (int i = 0; i < nparts; i++) {
        const char* p = parts[i];
        size_t left = sizes[i];
        while (left) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int e = errno;
                close(fd);
                unlink(tmp);
                fatal("%s: write failed: %s (nothing was replaced)", path,
                      w < 0 ? strerror(e) : "no space written");
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd)) {
        int e = errno;
        close(fd);
        unlink(tmp);
        fatal("%s: fsync failed: %s (nothing was replaced)", path, strerror(e));
    }
    if (close(fd)) {
        unlink(tmp);
        fatal("%s: close failed: %s", path, strerror(errno));
    }
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        fatal("%s: rename failed: %s", path, strerror(e));
    }
    fsync_parent_dir(path);
}

double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss / 1024.0;
}

static double start_rss_mib = -1;

long proc_status_kb(const char* key) {
    FILE* fp = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    const size_t n = strlen(key);
    while (fp && fgets(line, sizeof line, fp))
        if (!strncmp(line, key, n) && line[n] == ':' && sscanf(line + n + 1, "%ld", &kb) == 1)
            break;
    if (fp) fclose(fp);
    return kb;
}

double rss_mib(void) { return proc_status_kb("VmRSS") / 1024.0; }

void mark_start_rss(void) { start_rss_mib = rss_mib(); }

double peak_rss_growth_mib(void) {
    return peak_rss_mib() - (start_rss_mib > 0 ? start_rss_mib : 0);
}

int make_dirs(const char* path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char* p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

void path_join(char* out, size_t n, const char* dir, const char* name) {
    snprintf(out, n, "%s/%s", dir, name);
}
