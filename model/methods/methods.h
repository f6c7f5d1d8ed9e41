/* methods.h: what the rows of model/methods/ share (model/methods.c): the descriptions of the
 * router's modes and of the block patterns. */
#ifndef FOCUS_METHODS_H
#define FOCUS_METHODS_H

#include "../model.h"

/* The fields every block pattern shares: the blocks kernel with or without a backward, no gate
 * and no masks, the pairs counted by the kernel, the chosen blocks over the KV cache, no CUDA. */
#define BLOCK_PATTERN                                                                    \
    .sparse = 1, .setting = 1, .budget = "blocks", .budget_arg = "N",                    \
    .kernel = ATTN_KERNEL_BLOCKS, .kernel_train = ATTN_KERNEL_BLOCKS, .gate = GATE_NONE, \
    .masks = MASKS_NONE, .blocks = 1, .count = COUNT_KERNEL, .cache = CACHE_BLOCKS, .cuda = 0

/* "soft" / "hard top-k" (what), then the routing, K, w, sinks, dense layers (and k, with_k) */
void attn_describe_router(const Model* m, const char* what, int with_k, char* buf, size_t n);
/* a block pattern (what: "blocks", "oracle blocks") by its block score, and its budget */
void attn_describe_blocks(const Model* m, const char* what, char* buf, size_t n);
/* the learned selector's blocks and budget (on average, with per-layer budgets) */
void attn_describe_learned(const Model* m, char* buf, size_t n);

#endif
