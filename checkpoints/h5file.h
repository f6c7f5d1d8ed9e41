/* h5file.h: HDF5 checkpoint files (router.h5, lora.h5): written to a temporary file in the same
 * folder (built in memory first), sealed (a length and checksum of the whole file in its HDF5 user
 * block, checked before libhdf5 parses it), fsynced and renamed; datasets carry no modification
 * times (the same state writes the same bytes); every read checks presence, rank and shape and
 * fails with one line naming the file. */
#ifndef FOCUS_H5FILE_H
#define FOCUS_H5FILE_H

#include <stddef.h>

#include <hdf5.h>

/* Start the file for path, built in memory (tmp gets a name for messages, n bytes); h5_commit
 * seals it and writes it atomically (temporary file, fsync, rename) over path. */
hid_t h5_create(const char* path, char* tmp, size_t n);
void h5_commit(hid_t f, const char* tmp, const char* path);
void h5_write_ds(hid_t loc, const char* name, hid_t type, const void* data, int rank,
                 const hsize_t* dims, const char* path);
void h5_write_attr(hid_t loc, const char* name, hid_t type, const void* v, const char* path);
/* Open path (a `what`, for messages) and check its format_version attribute. */
hid_t h5_open(const char* path, const char* what, int version);
/* Close a file h5_open opened (it is registered with fatal_defer while open). */
void h5_close(hid_t f);
void h5_read_ds(hid_t loc, const char* name, hid_t type, void* out, int rank, const hsize_t* want,
                const char* path);
void h5_read_attr(hid_t loc, const char* name, hid_t type, void* out, const char* path);

#endif
