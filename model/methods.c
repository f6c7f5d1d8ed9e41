/* methods.c: the attention methods as data (model.h, AttnMethod): the table of their rows, one
 * per AttnMode, each defined in its own file (model/methods/NAME.c), and what reads the table
 * as a whole (names, lists, help). */
#include <stdio.h>
#include <string.h>

#include "model.h"
#include "methods/methods.h"

/* each row in its own file, model/methods/NAME.c */
extern const AttnMethod attn_method_dense, attn_method_soft, attn_method_hard, attn_method_window,
    attn_method_random, attn_method_blocks, attn_method_blocks_mean, attn_method_oracle,
    attn_method_blocks_learned, attn_method_strided, attn_method_local;

const AttnMethod* const attn_methods[NUM_ATTN_METHODS] = {
    [ATTN_DENSE] = &attn_method_dense,
    [ATTN_SOFT] = &attn_method_soft,
    [ATTN_HARD] = &attn_method_hard,
    [ATTN_WINDOW] = &attn_method_window,
    [ATTN_RANDOM] = &attn_method_random,
    [ATTN_BLOCKS] = &attn_method_blocks,
    [ATTN_BLOCKS_MEAN] = &attn_method_blocks_mean,
    [ATTN_ORACLE] = &attn_method_oracle,
    [ATTN_BLOCKS_LEARNED] = &attn_method_blocks_learned,
    [ATTN_STRIDED] = &attn_method_strided,
    [ATTN_LOCAL] = &attn_method_local,
};

const AttnMethod* attn_method_named(const char* name, size_t n) {
    for (int a = 0; a < NUM_ATTN_METHODS; a++)
        if (attn_methods[a]->setting && strlen(attn_methods[a]->name) == n &&
            !strncmp(attn_methods[a]->name, name, n))
            return attn_methods[a];
    return NULL;
}

const char* attn_method_list(char* buf, size_t n, const char* sep) {
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < NUM_ATTN_METHODS && at < n; a++)
        if (attn_methods[a]->setting)
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? sep : "", attn_methods[a]->name);
    return buf;
}

static const char* needs_text[] = {"", "a token router (--router ROUTER.h5)",
                                   "a block selector (--router SELECTOR.h5)"};

void attn_methods_help(FILE* f, int markdown) {
    if (markdown)
        fprintf(f,
                "| method (`--attn`, `eval --modes`) | needs | a query keeps | decodes over the KV "
                "cache | CUDA |\n|---|---|---|---|---|\n");
    for (int a = 0; a < NUM_ATTN_METHODS; a++) {
        const AttnMethod* t = attn_methods[a];
        if (!t->setting) continue;
        char name[48];
        snprintf(name, sizeof name, "%s%s%s", t->name, t->budget_arg ? ":" : "",
                 t->budget_arg ? t->budget_arg : "");
        const char* needs = t->needs == NEEDS_NOTHING ? "nothing" : needs_text[t->needs];
        if (markdown) {
            fprintf(f, "| `%s` | %s | %s | %s | %s |\n", name, needs, t->about,
                    t->no_decode ? "no" : "yes", t->cuda ? "yes" : "no");
            continue;
        }
        /* NAME, then what it keeps and needs in lines of at most 100 characters */
        char line[512];
        snprintf(line, sizeof line, "%s%s%s%s%s", t->about, t->needs ? "; needs " : "",
                 t->needs ? needs : "", t->no_decode ? "; no decoding" : "",
                 t->cuda ? "" : "; CPU only");
        fprintf(f, "  %-18s", name);
        const int width = 100 - 21;
        for (const char* p = line; *p;) {
            int n = (int)strlen(p);
            if (n > width) {
                n = width;
                while (n > 0 && p[n] != ' ') n--;
                if (!n) n = width;
            }
            fprintf(f, "%s%.*s\n", p == line ? " " : "                     ", n, p);
            p += n;
            while (*p == ' ') p++;
        }
    }
}

/* A block pattern's count of blocks: N, "up to N" or "any number of" with a share of the mass */
static const char* blocks_budget(const FocusConfig* f, char* buf) {
    if (f->blocks_p <= 0)
        snprintf(buf, 48, "%d", f->blocks);
    else if (f->blocks > 0)
        snprintf(buf, 48, "up to %d", f->blocks);
    else
        snprintf(buf, 48, "any number of");
    return buf;
}

/* ", the best until P of the estimated attention mass" after a block pattern's text */
static void blocks_cover(const FocusConfig* f, char* buf, size_t n) {
    const size_t used = strlen(buf);
    if (f->blocks_p > 0 && used < n)
        snprintf(buf + used, n - used, ", the best until %g of the estimated attention mass",
                 (double)f->blocks_p);
}

void attn_describe_router(const Model* m, const char* what, int with_k, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    char tk[32], dl[1024];
    snprintf(buf, n, "%s, routing %s, K=%d, w=%d, sinks=%d, dense layers %s%s%s", what,
             routing_name(f->routing), f->K, f->w, f->sinks,
             focus_dense_layers_str(f, dl, sizeof dl), with_k ? ", k=" : "",
             with_k ? focus_topk_str(f, tk) : "");
}

void attn_describe_blocks(const Model* m, const char* what, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    char dl[1024], nb[48];
    snprintf(buf, n,
             "%s (no router): %s key blocks of %d per query and key/value head by %s, sinks=%d, "
             "w=%d, dense layers %s%s",
             what, blocks_budget(f, nb), f->block, block_score_name(attn_block_score(f->attn)),
             f->sinks, f->w, focus_dense_layers_str(f, dl, sizeof dl),
             m->method.with_groups ? ", with the token router's groups" : "");
    blocks_cover(f, buf, n);
}

void attn_describe_learned(const Model* m, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    char dl[1024], nb[48];
    snprintf(buf, n,
             "blocks (learned selector): %s key blocks of %d per query and key/value head%s, "
             "sinks=%d, w=%d, dense layers %s%s",
             blocks_budget(f, nb), f->block,
             m->method.selector_blocks ? " on average (per-layer budgets)" : "", f->sinks, f->w,
             focus_dense_layers_str(f, dl, sizeof dl),
             m->method.with_groups ? ", with the token router's groups" : "");
    blocks_cover(f, buf, n);
}
