/* evaluate.c: token loading for training and evaluation, and strided perplexity. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/io.h"
#include "../data/shard.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "cli.h"

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
        v = realloc(v, sizeof(char*) * (size_t)(n + 1));
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
                all = realloc(all, sizeof(int) * (*n + m + 1));
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
            len = text_clean(text, len); /* a folder of documents is always cleaned */
            int* ids = tokenizer_encode(t, text, len, &m);
            all = realloc(all, sizeof(int) * (*n + m + 2));
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
    if (clean) len = text_clean(text, len);
    int* ids = tokenizer_encode(t, text, len, n);
    free(text);
    tokenizer_free(t);
    return ids;
}

int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n) {
    return load_tokens(data, "val_", tok_path ? tok_path : model_path, 0, n);
}

double hard_pairs_kept(const Model* m) {
    const FocusConfig* f = &m->fc;
    const int B = m->B, T = m->T, K = f->K, w = f->w;
    uint32_t* mask = mallocCheck(sizeof(uint32_t) * (size_t)B * T);
    double kept = 0, total = 0;
    for (int l = 0; l < m->cfg.L; l++) {
        const int dense = focus_layer_dense(f, l);
        routing_topk_mask(mask, model_groups(m, l), B, T, K, f->topk, f->topp, f->sinks, 0);
        for (int b = 0; b < B; b++) {
            const uint32_t* mb = mask + (size_t)b * T;
            for (int i = 0; i < T; i++) {
                int local = i < w ? i + 1 : w + 1;
                double far = 0;
                if (dense)
                    far = i - w > 0 ? i - w : 0;
                else
                    for (int j = 0; j < i - w; j++) far += (mb[i] & mb[j]) != 0;
                kept += local + far;
                total += i + 1;
            }
        }
    }
    free(mask);
    return kept / total;
}

/* Strided perplexity: windows of ctx input tokens (predicting the ctx tokens after each),
 * advancing by stride; each window scores only the targets the previous window did not, so
 * with stride = ctx every token after the first is scored exactly once. */
PplResult eval_perplexity(Model* m, const int* ids, size_t n, int ctx, int stride, int quiet) {
    PplResult r = {0, 0, 0, 0};
    int windows = 0;
    if (n < 2) fatal("eval: need at least 2 tokens, got %zu", n);
    int* tgt = mallocCheck(sizeof(int) * ctx);
    double t0 = now_seconds();
    size_t scored_to = 0; /* targets with absolute index <= scored_to are done */
    for (size_t st = 0;; st += (size_t)stride) {
        size_t end = st + (size_t)ctx + 1 < n ? st + (size_t)ctx + 1 : n; /* targets < end */
        int T = (int)(end - st) - 1;
        if (T < 1) break;
        for (int i = 0; i < T; i++) {
            size_t j = st + 1 + (size_t)i;
            tgt[i] = j > scored_to ? ids[j] : -1;
        }
        model_forward(m, ids + st, tgt, 1, T, 0);
        if (m->fc.attn == ATTN_HARD) {
            r.kept += hard_pairs_kept(m);
            windows++;
        }
        for (int i = 0; i < T; i++) {
            if (tgt[i] >= 0) {
                r.nll += m->losses[i];
                r.count++;
            }
        }
        scored_to = end - 1;
        if (!quiet) {
            fprintf(stderr, "\r  %zu / %zu tokens, ppl so far %.3f", r.count, n - 1,
                    exp(r.nll / r.count));
            fflush(stderr);
        }
        if (end == n) break;
    }
    if (!quiet) fprintf(stderr, "\n");
    r.seconds = now_seconds() - t0;
    if (windows) r.kept /= windows;
    free(tgt);
    return r;
}
