/* blockgate_h5.c: the learned block selector in HDF5 (see blockgate_h5.h). */
#include "blockgate_h5.h"

#include <math.h>
#include <string.h>

#include "../kernels/sparse.h"
#include "h5file.h"

#define FORMAT_VERSION 1

static uint64_t checksum(const real* w, size_t n, const BlockGateInfo* info, int L) {
    const int64_t s[4] = {info->block, info->w, info->sinks, info->n0};
    uint64_t h = fnv1a(FNV1A_START, s, info->blocks ? sizeof s : 3 * sizeof s[0]);
    h = fnv1a(h, w, n * sizeof(float));
    for (int l = 0; info->blocks && l < L; l++) {
        const int64_t b = info->blocks[l];
        h = fnv1a(h, &b, sizeof b);
    }
    return h;
}

static void dims_of(const Model* m, hsize_t d[3]) {
    d[0] = (hsize_t)m->cfg.L, d[1] = (hsize_t)m->cfg.NH;
    d[2] = (hsize_t)BLOCKGATE_WIDTH(model_head_size(&m->cfg));
}

void blockgate_save(const char* path, const Model* m, const real* wgt, const BlockGateInfo* info,
                    uint64_t fingerprint) {
    hsize_t d[3];
    dims_of(m, d);
    const size_t n = (size_t)(d[0] * d[1] * d[2]);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(wgt[i])) fatal("%s: the block selector holds NaN or inf; not written", path);
    char tmp[4200];
    hid_t f = h5_create(path, tmp, sizeof tmp);
    hid_t g = H5Gcreate2(f, "blockgate", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    h5_write_ds(g, "w", H5T_NATIVE_FLOAT, wgt, 3, d, tmp);
    if (info->blocks) {
        int64_t* b = mallocCheck(sizeof(int64_t) * (size_t)m->cfg.L);
        for (int l = 0; l < m->cfg.L; l++) b[l] = info->blocks[l];
        hsize_t dl[1] = {(hsize_t)m->cfg.L};
        h5_write_ds(g, "blocks", H5T_NATIVE_INT64, b, 1, dl, tmp);
        free(b);
        int64_t n0 = info->n0;
        h5_write_attr(f, "blocks_mean", H5T_NATIVE_INT64, &n0, tmp);
    }
    H5Gclose(g);
    int64_t v = FORMAT_VERSION, one = 1, s[3] = {info->block, info->w, info->sinks};
    h5_write_attr(f, "format_version", H5T_NATIVE_INT64, &v, tmp);
    h5_write_attr(f, "block_selector", H5T_NATIVE_INT64, &one, tmp);
    h5_write_attr(f, "block", H5T_NATIVE_INT64, &s[0], tmp);
    h5_write_attr(f, "w", H5T_NATIVE_INT64, &s[1], tmp);
    h5_write_attr(f, "sinks", H5T_NATIVE_INT64, &s[2], tmp);
    h5_write_attr(f, "base_fingerprint", H5T_NATIVE_UINT64, &fingerprint, tmp);
    uint64_t sum = checksum(wgt, n, info, m->cfg.L);
    h5_write_attr(f, "checksum", H5T_NATIVE_UINT64, &sum, tmp);
    h5_commit(f, tmp, path);
}

/* (opened as a "router checkpoint": the messages for a file of another kind stay those of the
 * router loader, e.g. a LoRA adapter given as --router) */
int blockgate_file(const char* path) {
    hid_t f = h5_open(path, "router checkpoint", 1000);
    const int is = H5Aexists(f, "block_selector") > 0;
    h5_close(f);
    return is;
}

void blockgate_load(const char* path, Model* m, BlockGateInfo* info, uint64_t fingerprint) {
    hid_t f = h5_open(path, "block selector", FORMAT_VERSION);
    if (H5Aexists(f, "block_selector") <= 0)
        fatal("%s: not a block selector (no block_selector attribute)", path);
    uint64_t fp, want;
    int64_t s[3];
    h5_read_attr(f, "base_fingerprint", H5T_NATIVE_UINT64, &fp, path);
    if (fp != fingerprint)
        fatal(
            "%s: this block selector was fitted on a different base model (fingerprint %016llx, "
            "the loaded model is %016llx)",
            path, (unsigned long long)fp, (unsigned long long)fingerprint);
    h5_read_attr(f, "block", H5T_NATIVE_INT64, &s[0], path);
    h5_read_attr(f, "w", H5T_NATIVE_INT64, &s[1], path);
    h5_read_attr(f, "sinks", H5T_NATIVE_INT64, &s[2], path);
    h5_read_attr(f, "checksum", H5T_NATIVE_UINT64, &want, path);
    if (s[0] < 1 || s[0] > 1048576 || s[1] < 0 || s[1] > 4194304 || s[2] < 0 || s[2] > 4194304)
        fatal("%s: block %lld, w %lld, sinks %lld out of range; corrupt file", path,
              (long long)s[0], (long long)s[1], (long long)s[2]);
    info->block = (int)s[0], info->w = (int)s[1], info->sinks = (int)s[2];
    info->n0 = 0, info->blocks = NULL;
    hsize_t d[3];
    dims_of(m, d);
    const size_t n = (size_t)(d[0] * d[1] * d[2]);
    const int L = m->cfg.L;
    real* w = mallocCheck(sizeof(real) * n);
    fatal_defer(free, w);
    h5_read_ds(f, "blockgate/w", H5T_NATIVE_FLOAT, w, 3, d, path);
    int* blocks = NULL;
    if (H5Aexists(f, "blocks_mean") > 0) { /* per-layer budgets */
        int64_t n0;
        h5_read_attr(f, "blocks_mean", H5T_NATIVE_INT64, &n0, path);
        int64_t* b = mallocCheck(sizeof(int64_t) * (size_t)L);
        fatal_defer(free, b);
        hsize_t dl[1] = {(hsize_t)L};
        h5_read_ds(f, "blockgate/blocks", H5T_NATIVE_INT64, b, 1, dl, path);
        if (n0 < 1 || n0 > 1048576)
            fatal("%s: blocks_mean %lld out of range; corrupt", path, (long long)n0);
        blocks = mallocCheck(sizeof(int) * (size_t)L);
        fatal_defer(free, blocks);
        for (int l = 0; l < L; l++) {
            if (b[l] < 0 || b[l] > 1048576)
                fatal("%s: layer %d's budget %lld out of range; corrupt file", path, l,
                      (long long)b[l]);
            blocks[l] = (int)b[l];
        }
        fatal_release(b);
        info->n0 = (int)n0, info->blocks = blocks;
    }
    if (checksum(w, n, info, L) != want) fatal("%s: checksum mismatch; the file is corrupt", path);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i]))
            fatal("%s: the block selector holds NaN or inf; it cannot be used", path);
    if (blocks) fatal_forget(blocks);
    fatal_forget(w);
    h5_close(f);
    free(m->method.selector);
    free(m->method.selector_blocks);
    m->method.selector = w;
    m->method.selector_blocks = blocks;
    m->method.selector_n0 = info->n0;
}
