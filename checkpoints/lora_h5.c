/* lora_h5.c: LoRA adapters in HDF5 (see lora_h5.h). */
#include "lora_h5.h"

#include <string.h>

#include "h5file.h"

#define FORMAT_VERSION 1

static const char* const names[NUM_LORA_TENSORS] = {"lora/qkv_a",    "lora/qkv_b",   "lora/o_a",
                                                    "lora/o_b",      "lora/fc_a",    "lora/fc_b",
                                                    "lora/fcproj_a", "lora/fcproj_b"};

/* dims of tensor k: A (L, rank, in), B (L, out, rank); in and out from the tensor's size */
static void dims_of(const Model* m, int k, hsize_t* d) {
    const size_t L = m->cfg.L, r = m->lora.rank, per = m->lora_sizes[k] / L;
    d[0] = L;
    d[1] = k % 2 ? per / r : r;
    d[2] = k % 2 ? r : per / r;
}

void lora_save(const char* path, const Model* m, uint64_t fingerprint) {
    if (!m->lora.rank) fatal("internal: lora_save of a model without adapters");
    char tmp[4200];
    hid_t f = h5_create(path, tmp, sizeof tmp);
    hid_t g = H5Gcreate2(f, "lora", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(g);
    real* const* w = (real* const*)&m->lw;
    for (int k = 0; k < NUM_LORA_TENSORS; k++) {
        if (!m->lora_sizes[k]) continue;
        hsize_t d[3];
        dims_of(m, k, d);
        h5_write_ds(f, names[k], H5T_NATIVE_FLOAT, w[k], 3, d, tmp);
    }
    const int64_t version = FORMAT_VERSION, rank = m->lora.rank, targets = m->lora.targets;
    const double alpha = m->lora.alpha;
    h5_write_attr(f, "format_version", H5T_NATIVE_INT64, &version, tmp);
    h5_write_attr(f, "rank", H5T_NATIVE_INT64, &rank, tmp);
    h5_write_attr(f, "alpha", H5T_NATIVE_DOUBLE, &alpha, tmp);
    h5_write_attr(f, "targets", H5T_NATIVE_INT64, &targets, tmp);
    h5_write_attr(f, "base_fingerprint", H5T_NATIVE_UINT64, &fingerprint, tmp);
    h5_commit(f, tmp, path);
}

void lora_load(const char* path, Model* m, uint64_t fingerprint) {
    hid_t f = h5_open(path, "LoRA adapter file", FORMAT_VERSION);
    int64_t rank, targets;
    double alpha;
    uint64_t fp;
    h5_read_attr(f, "rank", H5T_NATIVE_INT64, &rank, path);
    h5_read_attr(f, "alpha", H5T_NATIVE_DOUBLE, &alpha, path);
    h5_read_attr(f, "targets", H5T_NATIVE_INT64, &targets, path);
    h5_read_attr(f, "base_fingerprint", H5T_NATIVE_UINT64, &fp, path);
    if (fp != fingerprint)
        fatal(
            "%s: these adapters were trained on a different base model (fingerprint %016llx, "
            "the loaded model is %016llx)",
            path, (unsigned long long)fp, (unsigned long long)fingerprint);
    if (rank < 1 || rank > 4096 || targets < 1 || targets > 15 || !(alpha > 0))
        fatal("%s: rank %lld, alpha %g, targets %lld: not a valid adapter", path, (long long)rank,
              alpha, (long long)targets);
    LoraConfig lc = {(int)rank, (float)alpha, (int)targets};
    model_lora_init(m, &lc, 0);
    real** w = (real**)&m->lw;
    for (int k = 0; k < NUM_LORA_TENSORS; k++) {
        if (!m->lora_sizes[k]) continue;
        hsize_t d[3];
        dims_of(m, k, d);
        h5_read_ds(f, names[k], H5T_NATIVE_FLOAT, w[k], 3, d, path);
    }
    h5_close(f);
}
