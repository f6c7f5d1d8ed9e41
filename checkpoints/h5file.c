/* h5file.c: HDF5 files written atomically and read with checks (see h5file.h). */
#define _GNU_SOURCE
#include "h5file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "../io/io.h"
#include "../kernels/common.h"

hid_t h5_create(const char* path, char* tmp, size_t n) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid());
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) fatal("%s: cannot create the checkpoint file", tmp);
    return f;
}

void h5_commit(hid_t f, const char* tmp, const char* path) {
    if (H5Fclose(f) < 0) {
        unlink(tmp);
        fatal("%s: closing the checkpoint failed (disk full?); nothing was replaced", tmp);
    }
    int fd = open(tmp, O_RDONLY);
    if (fd < 0 || fsync(fd)) {
        int e = errno;
        unlink(tmp);
        fatal("%s: fsync failed: %s; nothing was replaced", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        fatal("%s: rename failed: %s", path, strerror(e));
    }
    fsync_parent_dir(path);
}

void h5_write_ds(hid_t loc, const char* name, hid_t type, const void* data, int rank,
                 const hsize_t* dims, const char* path) {
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    /* no modification times: the same training run writes the same bytes */
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0);
    hid_t ds = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    if (ds < 0 || H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        unlink(path); /* the temporary file: what it replaces stays as it was */
        fatal("%s: writing dataset '%s' failed (disk full?); nothing was replaced", path, name);
    }
    H5Dclose(ds);
    H5Sclose(sp);
}

void h5_write_attr(hid_t loc, const char* name, hid_t type, const void* v, const char* path) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, type, v) < 0) {
        unlink(path);
        fatal("%s: writing attribute '%s' failed (disk full?); nothing was replaced", path, name);
    }
    H5Aclose(a);
    H5Sclose(sp);
}

void h5_read_ds(hid_t loc, const char* name, hid_t type, void* out, int rank, const hsize_t* want,
                const char* path) {
    hid_t ds = H5Dopen2(loc, name, H5P_DEFAULT);
    if (ds < 0)
        fatal("%s: dataset '%s' is missing; not this kind of focus checkpoint, or corrupt", path,
              name);
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[8] = {0};
    int r = H5Sget_simple_extent_ndims(sp);
    if (r != rank || r > 8)
        fatal("%s: dataset '%s' has %d dimensions, expected %d", path, name, r, rank);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    for (int i = 0; i < rank; i++) {
        if (dims[i] != want[i])
            fatal(
                "%s: dataset '%s' dimension %d is %llu, but this model needs %llu (trained for a "
                "different model or settings)",
                path, name, i, (unsigned long long)dims[i], (unsigned long long)want[i]);
    }
    if (H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
        fatal("%s: reading dataset '%s' failed; the file is truncated or corrupt", path, name);
    H5Sclose(sp);
    H5Dclose(ds);
}

void h5_read_attr(hid_t loc, const char* name, hid_t type, void* out, const char* path) {
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a < 0 || H5Aread(a, type, out) < 0)
        fatal("%s: attribute '%s' is missing or unreadable; corrupt checkpoint", path, name);
    H5Aclose(a);
}

hid_t h5_open(const char* path, const char* what, int version_want) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (access(path, R_OK)) fatal("%s: cannot open %s: %s", path, what, strerror(errno));
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) fatal("%s: not an HDF5 file (truncated or corrupt %s)", path, what);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) fatal("%s: HDF5 cannot open the file; it is truncated or corrupt", path);
    int64_t version = 0;
    h5_read_attr(f, "format_version", H5T_NATIVE_INT64, &version, path);
    if (version < 1 || version > version_want)
        fatal("%s: %s format %lld, this build reads 1 to %d", path, what, (long long)version,
              version_want);
    return f;
}
