/* methods.c: the attention methods as data (model.h, AttnMethod): one row per AttnMode. */
#include <stdio.h>
#include <string.h>

#include "model.h"

#define ROW(mode, name, serve, needs, budget, arg, sparse, blocks, score, cache, cuda, setting) \
    [mode] = {mode, name, serve, needs, budget, arg, sparse, blocks, score, cache, cuda, setting}
const AttnMethod attn_methods[ATTN_LOCAL + 1] = {
    /* mode, name, serve's name, needs, budget setting and its spelling, sparse, block pattern,
     * block score, the KV cache's keys, CUDA, a setting value */
    ROW(ATTN_DENSE, "dense", "dense", NEEDS_NOTHING, NULL, NULL, 0, 0, BLOCKS_QUEST, CACHE_ALL,
        1, 1),
    ROW(ATTN_SOFT, "soft", "soft", NEEDS_ROUTER, NULL, NULL, 0, 0, BLOCKS_QUEST, CACHE_ALL, 1, 1),
    ROW(ATTN_HARD, "hard", "router", NEEDS_ROUTER, "topk", "k", 1, 0, BLOCKS_QUEST, CACHE_GROUPS,
        1, 1),
    ROW(ATTN_WINDOW, "window", "window", NEEDS_NOTHING, "w", "W", 1, 0, BLOCKS_QUEST,
        CACHE_WINDOW, 0, 1),
    ROW(ATTN_RANDOM, "random", "random", NEEDS_NOTHING, "topk", "k", 1, 0, BLOCKS_QUEST,
        CACHE_GROUPS, 0, 1),
    ROW(ATTN_BLOCKS, "blocks", "blocks", NEEDS_NOTHING, "blocks", "N", 1, 1, BLOCKS_QUEST,
        CACHE_BLOCKS, 0, 1),
    ROW(ATTN_BLOCKS_MEAN, "blocks_mean", "blocks_mean", NEEDS_NOTHING, "blocks", "N", 1, 1,
        BLOCKS_MEAN, CACHE_BLOCKS, 0, 1),
    ROW(ATTN_ORACLE, "oracle", "oracle", NEEDS_NOTHING, "blocks", "N", 1, 1, BLOCKS_ORACLE,
        CACHE_BLOCKS, 0, 1),
    ROW(ATTN_BLOCKS_LEARNED, "blocks_learned", "blocks_learned", NEEDS_SELECTOR, "blocks", "N", 1,
        1, BLOCKS_LEARNED, CACHE_BLOCKS, 0, 1),
    ROW(ATTN_LOCAL, "local", "local", NEEDS_NOTHING, NULL, NULL, 1, 0, BLOCKS_QUEST, CACHE_WINDOW,
        0, 0),
};

const AttnMethod* attn_method_named(const char* name, size_t n) {
    for (int a = 0; a <= ATTN_LOCAL; a++)
        if (attn_methods[a].setting && strlen(attn_methods[a].name) == n &&
            !strncmp(attn_methods[a].name, name, n))
            return &attn_methods[a];
    return NULL;
}

const char* attn_method_list(char* buf, size_t n, const char* sep) {
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a <= ATTN_LOCAL && at < n; a++)
        if (attn_methods[a].setting)
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? sep : "", attn_methods[a].name);
    return buf;
}
