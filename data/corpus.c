/* corpus.c: the tokens of a run or an evaluation from shards, a folder of documents or a text
 * file (corpus.h). */
#include "corpus.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/io.h"
#include "../kernels/common.h"
#include "shard.h"
#include "text.h"
#include "tokenizer.h"

/* *.txt files of a folder, sorted. */
static int list_text_files(const char* dir, char*** out) {
    DIR* d = opendir(dir);
    if (!d) fatal("%s: cannot open: folder not readable", dir);
    int n = 0;
    char** v = NULL;
    struct dirent* e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".txt")) continue;
        v = reallocCheck(v, sizeof(char*) * (size_t)(n + 1));
        size_t need = strlen(dir) + l + 2;
        v[n] = mallocCheck(need);
        snprintf(v[n++], need, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(v[i], v[j]) > 0) {
                char* t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    *out = v;
    return n;
}

int* load_tokens(const char* path, const char* prefix, const char* tok_path, int clean, size_t* n) {
    struct stat st;
    if (stat(path, &st)) fatal("%s: data not found", path);
    if (S_ISDIR(st.st_mode)) {
        char** paths;
        int k = shard_list(path, prefix, &paths);
        if (!k) {
            free(paths);
            k = shard_list(path, "", &paths);
        }
        if (k) {
            int* all = NULL;
            *n = 0;
            int V0 = -1;
            for (int i = 0; i < k; i++) {
                size_t m;
                int V;
                int* ids = shard_read(paths[i], &m, &V);
                if (V0 >= 0 && V != V0)
                    fatal("%s: vocabulary size %d differs from the other shards' %d", paths[i], V,
                          V0);
                V0 = V;
                all = reallocCheck(all, sizeof(int) * (*n + m + 1));
                memcpy(all + *n, ids, sizeof(int) * m);
                *n += m;
                free(ids);
                free(paths[i]);
            }
            free(paths);
            return all;
        }
        free(paths);
        char** files;
        int nf = list_text_files(path, &files);
        if (!nf) fatal("%s: no token shards (*.bin) or text files (*.txt) in this folder", path);
        if (!tok_path) fatal("%s: text data needs a tokenizer", path);
        Tokenizer* t = tokenizer_load(tok_path);
        int eot = tokenizer_eot(t);
        int* all = NULL;
        *n = 0;
        for (int i = 0; i < nf; i++) {
            size_t len, m;
            char* text = read_file(files[i], &len);
            text_check(files[i], text, len);
            len = text_clean(text, len); /* a folder of documents is always cleaned */
            int* ids = tokenizer_encode(t, text, len, &m);
            all = reallocCheck(all, sizeof(int) * (*n + m + 2));
            if (eot >= 0) all[(*n)++] = eot;
            memcpy(all + *n, ids, sizeof(int) * m);
            *n += m;
            free(ids);
            free(text);
            free(files[i]);
        }
        free(files);
        tokenizer_free(t);
        return all;
    }
    if (shard_is_shard(path)) {
        int V;
        return shard_read(path, n, &V);
    }
    if (!tok_path) fatal("%s: text data needs a tokenizer", path);
    Tokenizer* t = tokenizer_load(tok_path);
    size_t len;
    char* text = read_file(path, &len);
    text_check(path, text, len);
    if (clean) len = text_clean(text, len);
    int* ids = tokenizer_encode(t, text, len, n);
    free(text);
    tokenizer_free(t);
    return ids;
}

int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n) {
    return load_tokens(data, "val_", tok_path ? tok_path : model_path, 0, n);
}
