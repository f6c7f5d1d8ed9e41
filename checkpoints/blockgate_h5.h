/* blockgate_h5.h: the learned block selector in HDF5 (the output of `focus fit-blocks`).
 *
 * Layout: /blockgate/w (L, NH, BLOCKGATE_WIDTH(hs)) float32, the weights of kernels/sparse.h;
 * /blockgate/blocks (L) int64, optional: the per-layer budgets (blocks per query of each layer
 * when the mode asks for n0 = the attribute blocks_mean); attributes on /: format_version,
 * block_selector (1: what marks the kind of file), block (key block size), w and sinks (the band
 * it was fitted with), base_fingerprint (the backbone it was fitted on), checksum (FNV-1a of the
 * weights, the settings and the budgets). Written to a temporary
 * file, fsynced and renamed (h5file.h). Loading refuses another base model, a wrong shape, a
 * changed value or a NaN with one line naming the file. Tested by tests/test_blockgate.c. */
#ifndef FOCUS_BLOCKGATE_H5_H
#define FOCUS_BLOCKGATE_H5_H

#include "../model/model.h"

typedef struct {
    int block, w, sinks;
    int n0;      /* the mean of blocks[], the budget they are for (0: none) */
    int* blocks; /* (L) per-layer budgets, or NULL (load: malloc'd, owned by the model) */
} BlockGateInfo;

void blockgate_save(const char* path, const Model* m, const real* wgt, const BlockGateInfo* info,
                    uint64_t fingerprint);
/* 1 when path is a block selector file (the rest of its content unchecked), else 0. */
int blockgate_file(const char* path);
/* Load the selector onto m (m->method.selector and, when the file has them, its per-layer
 * budgets selector_blocks and selector_n0, allocated here) and its settings into info. */
void blockgate_load(const char* path, Model* m, BlockGateInfo* info, uint64_t fingerprint);

#endif
