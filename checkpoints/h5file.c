/* h5file.c: HDF5 files written atomically and read with checks (see h5file.h). */
#define _GNU_SOURCE
#include "h5file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/io.h"
#include "../kernels/common.h"

/* The HDF5 user block (bytes the library leaves to the application at the start of the file)
 * holds a seal: "FOCUSH5\n", the file's length and the FNV-1a hash of everything after the
 * block, both little-endian u64. h5_open checks it before libhdf5 reads a byte: libhdf5 1.10
 * overflows a heap buffer on some corrupted files (fuzz_router found one in H5Aopen), so no file
 * reaches it that is not exactly as written. */
#define USERBLOCK 512
static const char seal_magic[8] = "FOCUSH5\n";

/* A bijection of 64-bit values (the splitmix64 finaliser): mix(a) == mix(b) exactly when a == b.
 * The seal's sums are compared through it so that the comparison never has the file's stored
 * value and the right one as its two sides. libFuzzer copies the sides of a comparison it traces
 * into its inputs, and with a plain == it learnt to forge the seal (CI, 2026-12-02: 6,585
 * executions): the fuzz targets then fuzzed libhdf5 itself, whose 1.10.8 parser leaks, overflows
 * heap buffers and asks for terabytes on crafted files (scripts/forged_h5.sh: 36 of 1,500). The
 * seal catches corruption; it is no defence against a file crafted to pass it (no checksum is). */
static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Read all of fd (its size n) into a malloc'd buffer, or NULL. */
static uint8_t* read_all(int fd, size_t n) {
    uint8_t* b = mallocCheck(n + 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, b + got, n - got, (off_t)got);
        if (r <= 0) {
            free(b);
            return NULL;
        }
        got += (size_t)r;
    }
    return b;
}

hid_t h5_create(const char* path, char* tmp, size_t n) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* built in memory (the core driver, no backing file): libhdf5 never writes to the disk,
     * so a full disk meets write_file_atomic in h5_commit, not an HDF5 file half flushed */
    snprintf(tmp, n, "%s (in memory)", path);
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_userblock(fcpl, USERBLOCK);
    H5Pset_fapl_core(fapl, 1 << 16, 0);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
    H5Pclose(fcpl);
    H5Pclose(fapl);
    if (f < 0) fatal("%s: cannot create the checkpoint in memory", path);
    return f;
}

void h5_commit(hid_t f, const char* tmp, const char* path) {
    (void)tmp;
    /* the image starts at the superblock; the user block (the seal) goes in front of it */
    ssize_t n = H5Fflush(f, H5F_SCOPE_GLOBAL) < 0 ? -1 : H5Fget_file_image(f, NULL, 0);
    if (n <= 0) fatal("%s: building the checkpoint image failed", path);
    uint8_t* b = callocCheck((size_t)n + USERBLOCK, 1);
    fatal_defer(free, b);
    if (H5Fget_file_image(f, b + USERBLOCK, (size_t)n) != n || H5Fclose(f) < 0)
        fatal("%s: building the checkpoint image failed", path);
    uint64_t len = (uint64_t)n + USERBLOCK, sum = fnv1a(FNV1A_START, b + USERBLOCK, (size_t)n);
    memcpy(b, seal_magic, 8);
    memcpy(b + 8, &len, 8);
    memcpy(b + 16, &sum, 8);
    const void* parts[1] = {b};
    size_t sizes[1] = {(size_t)len};
    write_file_atomic(path, parts, sizes, 1); /* temporary file, fsync, rename */
    fatal_release(b);
}

void h5_write_ds(hid_t loc, const char* name, hid_t type, const void* data, int rank,
                 const hsize_t* dims, const char* path) {
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    /* no modification times: the same training run writes the same bytes */
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0);
    hid_t ds = H5Dcreate2(loc, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Pclose(dcpl);
    if (ds < 0 || H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        fatal("%s: writing dataset '%s' failed; nothing was replaced", path, name);
    H5Dclose(ds);
    H5Sclose(sp);
}

void h5_write_attr(hid_t loc, const char* name, hid_t type, const void* v, const char* path) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, type, v) < 0)
        fatal("%s: writing attribute '%s' failed; nothing was replaced", path, name);
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

static void h5_release(void* f) { H5Fclose((hid_t)(intptr_t)f); }

void h5_close(hid_t f) { fatal_release((void*)(intptr_t)f); }

hid_t h5_open(const char* path, const char* what, int version_want) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (access(path, R_OK)) fatal("%s: cannot open %s: %s", path, what, strerror(errno));
    int fd = open(path, O_RDONLY | O_NONBLOCK); /* a FIFO must not block: refused below */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        fatal("%s: cannot open %s: not a regular file (a folder, FIFO or device)", path, what);
    }
    uint8_t* b = st.st_size > USERBLOCK ? read_all(fd, (size_t)st.st_size) : NULL;
    close(fd);
    uint64_t len = 0, sum = 0;
    if (b) memcpy(&len, b + 8, 8), memcpy(&sum, b + 16, 8);
    int sealed = b && !memcmp(b, seal_magic, 8);
    int intact = sealed && mix(len) == mix((uint64_t)st.st_size) &&
                 mix(sum) == mix(fnv1a(FNV1A_START, b + USERBLOCK, (size_t)st.st_size - USERBLOCK));
    free(b);
    /* files from before the seal (format 1 and 2 routers) are read only when asked: libhdf5 then
     * parses them unchecked */
    const char* legacy = getenv("FOCUS_UNSEALED_H5");
    if (!sealed && !(legacy && !strcmp(legacy, "1")))
        fatal(
            "%s: not a sealed %s (one written before focus sealed them, another program's, or "
            "corrupt); to read an older focus file anyway set FOCUS_UNSEALED_H5=1",
            path, what);
    if (sealed && !intact)
        fatal("%s: the %s is truncated or corrupt (its length or checksum does not match)", path,
              what);
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) fatal("%s: not an HDF5 file (truncated or corrupt %s)", path, what);
    /* closing the file closes whatever a failed read left open in it */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    if (f < 0) fatal("%s: HDF5 cannot open the file; it is truncated or corrupt", path);
    fatal_defer(h5_release, (void*)(intptr_t)f);
    int64_t version = 0;
    /* the two kinds of file focus writes, each given where the other belongs */
    const int router_file = H5Aexists(f, "config_checksum") > 0;
    const int lora_file = H5Aexists(f, "alpha") > 0 && H5Aexists(f, "rank") > 0;
    if (strstr(what, "router") && lora_file && !router_file)
        fatal("%s: a LoRA adapter file, not a %s (give it with --lora)", path, what);
    if (strstr(what, "LoRA") && router_file)
        fatal("%s: a router checkpoint, not a %s (give it with --router)", path, what);
    h5_read_attr(f, "format_version", H5T_NATIVE_INT64, &version, path);
    if (version < 1 || version > version_want)
        fatal("%s: %s format %lld, this build reads 1 to %d", path, what, (long long)version,
              version_want);
    return f;
}
