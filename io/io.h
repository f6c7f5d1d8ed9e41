/* io.h: reading whole files and writing files atomically, for everything that touches disk
 * (checkpoints, shards, run files). Errors are fatal and name the file. */
#ifndef FOCUS_IO_H
#define FOCUS_IO_H

#include <stddef.h>
#include <stdio.h>

/* 0 if path is a regular file; -1 (errno set) if it cannot be found; fatal naming the file if it
 * is anything else (a FIFO, a device, a folder, a socket): reading one could block or never end,
 * so every input is checked before it is opened. */
int io_regular(const char* path);
/* fopen after io_regular: NULL (errno set) when the file does not exist or cannot be opened. */
FILE* fopen_regular(const char* path, const char* mode);
/* Close a file written with stdio, checked to the end (fflush, ferror, fclose): on a failure (a
 * full disk, a file-size limit) the file at path is removed, so no half-written file is left,
 * and the error is fatal, naming path and the reason. */
void fclose_checked(FILE* f, const char* path);
/* At exit, stdout must have reached its file: a failed flush (a full disk, a closed pipe) exits
 * 1 with one line instead of 0. Also ignores SIGXFSZ, so a file-size limit is a write error with
 * a message (EFBIG) instead of a silent kill. Called once by main. */
void io_guard_output(void);

/* Whole file as a malloc'd NUL-terminated buffer; fatal with the path on error. */
char* read_file(const char* path, size_t* len);
/* Standard input to its end as a malloc'd NUL-terminated buffer (a pipe or a file); fatal on a
 * read error. */
char* read_stdin(size_t* len);
/* The same, but NULL when the file cannot be opened or read (optional files). */
char* read_file_opt(const char* path, size_t* len);

/* Write a file atomically: temporary file in the same folder, fsync, rename, fsync the folder.
 * Fatal with the path and the reason on any failure (a full disk included). */
void write_file_atomic(const char* path, const void* const* parts, const size_t* sizes, int nparts);
/* fsync the folder that holds path (after a rename). */
void fsync_parent_dir(const char* path);

/* Peak resident memory of this process in MiB. */
double peak_rss_mib(void);
/* A kB line of /proc/self/status (RssAnon...), or 0. */
long proc_status_kb(const char* key);
/* Resident memory now (MiB); mark_start_rss notes it (main does, before any command);
 * peak_rss_growth_mib is the peak since then, the program and its libraries left out. */
double rss_mib(void);
void mark_start_rss(void);
double peak_rss_growth_mib(void);

/* mkdir -p; 0 on success. */
int make_dirs(const char* path);
/* out = dir/name */
void path_join(char* out, size_t n, const char* dir, const char* name);

#endif
