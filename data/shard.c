/* shard.c: token shard reading and writing (see shard.h). */
#define _GNU_SOURCE
#include "shard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/io.h"
#include "../kernels/common.h"

void shard_write(const char* path, const int* ids, size_t n, int V) {
    uint32_t width = V <= 65536 ? 2 : 4;
    uint8_t hdr[SHARD_HEADER_BYTES] = {0};
    memcpy(hdr, "FOCUSTOK", 8);
    uint32_t version = 1, vs = (uint32_t)V;
    uint64_t count = n;
    memcpy(hdr + 8, &version, 4);
    memcpy(hdr + 12, &width, 4);
    memcpy(hdr + 16, &vs, 4);
    memcpy(hdr + 24, &count, 8);
    void* body = mallocCheck(n * width + 1);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            fatal("%s: token id %d outside the vocabulary (V=%d)", path, ids[i], V);
        if (width == 2)
            ((uint16_t*)body)[i] = (uint16_t)ids[i];
        else
            ((uint32_t*)body)[i] = (uint32_t)ids[i];
    }
    const void* parts[2] = {hdr, body};
    size_t sizes[2] = {SHARD_HEADER_BYTES, n * width};
    write_file_atomic(path, parts, sizes, 2);
    free(body);
}

int shard_is_shard(const char* path) {
    FILE* fp = fopen_regular(path, "rb");
    if (!fp) return 0;
    char m[8];
    int ok = fread(m, 1, 8, fp) == 8 && !memcmp(m, "FOCUSTOK", 8);
    fclose(fp);
    return ok;
}

static void close_file(void* fp) { fclose(fp); }

int* shard_read(const char* path, size_t* n, int* V) {
    FILE* fp = fopen_regular(path, "rb");
    if (!fp) fatal("%s: cannot open shard: %s", path, strerror(errno));
    fatal_defer(close_file, fp);
    uint8_t hdr[SHARD_HEADER_BYTES];
    if (fread(hdr, 1, SHARD_HEADER_BYTES, fp) != SHARD_HEADER_BYTES)
        fatal("%s: truncated shard header", path);
    if (memcmp(hdr, "FOCUSTOK", 8)) fatal("%s: not a token shard (wrong magic)", path);
    uint32_t version, width, vs;
    uint64_t count;
    memcpy(&version, hdr + 8, 4);
    memcpy(&width, hdr + 12, 4);
    memcpy(&vs, hdr + 16, 4);
    memcpy(&count, hdr + 24, 8);
    if (version != 1) fatal("%s: shard version %u is not supported (expected 1)", path, version);
    if (width != 2 && width != 4)
        fatal("%s: shard id width %u is invalid (expected 2 or 4)", path, width);
    if (vs < 2 || vs > (1u << 24)) fatal("%s: shard vocabulary size %u is invalid", path, vs);
    struct stat st;
    fstat(fileno(fp), &st);
    if (count > ((uint64_t)st.st_size) / width ||
        (uint64_t)st.st_size != SHARD_HEADER_BYTES + count * width)
        fatal(
            "%s: shard header says %llu tokens (%llu bytes) but the file has %lld bytes; truncated "
            "or corrupt",
            path, (unsigned long long)count,
            (unsigned long long)(SHARD_HEADER_BYTES + count * width), (long long)st.st_size);
    uint8_t* raw = mallocCheck(count * width + 1);
    fatal_defer(free, raw);
    if (fread(raw, width, count, fp) != count) fatal("%s: read failed", path);
    fatal_release(fp);
    int* ids = mallocCheck(sizeof(int) * (count + 1));
    for (uint64_t i = 0; i < count; i++) {
        uint32_t v;
        if (width == 2) {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            v = h;
        } else {
            memcpy(&v, raw + 4 * i, 4);
        }
        if (v >= vs) {
            free(ids);
            fatal("%s: token %llu has id %u, outside the shard's vocabulary (%u)", path,
                  (unsigned long long)i, v, vs);
        }
        ids[i] = (int)v;
    }
    fatal_release(raw);
    *n = count;
    *V = (int)vs;
    return ids;
}

static int cmp_str(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

int shard_list(const char* dir, const char* prefix, char*** paths) {
    DIR* d = opendir(dir);
    if (!d) fatal("%s: cannot open data folder: %s", dir, strerror(errno));
    int n = 0, cap = 16;
    char** out = mallocCheck(sizeof(char*) * cap);
    struct dirent* e;
    size_t pl = strlen(prefix);
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, pl) || l < 4 || strcmp(e->d_name + l - 4, ".bin")) continue;
        if (n == cap) out = reallocCheck(out, sizeof(char*) * (cap *= 2));
        size_t need = strlen(dir) + l + 2;
        out[n] = mallocCheck(need);
        snprintf(out[n++], need, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof(char*), cmp_str);
    *paths = out;
    return n;
}
