/* io.h: reading whole files and writing files atomically, for everything that touches disk
 * (checkpoints, shards, run files). Errors are fatal and name the file. */
#ifndef FOCUS_IO_H
#define FOCUS_IO_H

#include <stddef.h>

/* Whole file as a malloc'd NUL-terminated buffer; fatal with the path on error. */
char* read_file(const char* path, size_t* len);
/* The same, but NULL when the file cannot be opened or read (optional files). */
char* read_file_opt(const char* path, size_t* len);

/* Write a file atomically: temporary file in the same folder, fsync, rename, fsync the folder.
 * Fatal with the path and the reason on any failure (a full disk included). */
void write_file_atomic(const char* path, const void* const* parts, const size_t* sizes, int nparts);
/* fsync the folder that holds path (after a rename). */
void fsync_parent_dir(const char* path);

#endif
