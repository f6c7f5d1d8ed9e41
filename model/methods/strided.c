/* strided.c: the attention method `strided` (AttnMethod, model/model.h; the table:
 * model/methods.c). The fixed strided pattern of the Sparse Transformer (Child et al., 2019),
 * training-free: beyond the sinks and the window, a query keeps the earlier tokens at distances
 * that are multiples of a stride. Expressed as groups the router's executor and the KV cache
 * already read: token p is in the k groups (p + t K/k) mod K, t < k, so a query and a key share a
 * group when their distance is a multiple of K/k (with k dividing K; k = 1: every K-th token).
 * strided:k keeps about k/K of the distant pairs, random:k's budget. */
#include "methods.h"

#include <stdio.h>

/* token p's groups: k of K, K/k apart, starting at p mod K; a sink in every group */
static void strided_mask(uint32_t* mask, int B, int T, const Model* md, int l, int pos0) {
    const FocusConfig* f = &md->fc;
    (void)l; /* the same pattern on every layer */
    const int K = f->K, k = f->topk > 0 && f->topk < K ? f->topk : K, step = K / k;
    const uint32_t all = K >= 32 ? 0xffffffffu : (1u << K) - 1u;
    for (int t = 0; t < T; t++) {
        const int p = pos0 + t;
        uint32_t m = 0;
        if (p < f->sinks || k == K)
            m = all;
        else
            for (int i = 0; i < k; i++) m |= 1u << ((p + i * step) % K);
        for (int b = 0; b < B; b++) mask[(size_t)b * T + t] = m;
    }
}

static void describe(const Model* m, char* buf, size_t n) {
    const FocusConfig* f = &m->fc;
    const int k = f->topk > 0 && f->topk < f->K ? f->topk : f->K;
    char dl[1024];
    snprintf(buf, n,
             "strided (no router): beyond w=%d the tokens a multiple of %d back (K=%d, k=%d), "
             "sinks=%d, dense layers %s",
             f->w, f->K / k, f->K, k, f->sinks, focus_dense_layers_str(f, dl, sizeof dl));
}

const AttnMethod attn_method_strided = {
    .mode = ATTN_STRIDED,
    .name = "strided",
    .serve_name = "strided",
    .needs = NEEDS_NOTHING,
    .budget = "topk",
    .budget_arg = "k",
    .sparse = 1,
    .setting = 1,
    .about =
        "the sinks, the window and every (K/k)-th earlier token (Sparse Transformer's strided "
        "pattern; training-free)",
    .kernel = ATTN_KERNEL_SPARSE,
    .kernel_train = ATTN_KERNEL_SPARSE,
    .gate = GATE_HARD,
    .masks = MASKS_PATTERN,
    .pattern_mask = strided_mask,
    .count = COUNT_MASKS,
    .cache = CACHE_GROUPS,
    .cuda = 0,
    .describe = describe,
};
