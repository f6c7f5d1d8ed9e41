/* shard.h: token shards. A shard is a 32-byte header then packed little-endian token ids:
 *   bytes 0-7  magic "FOCUSTOK"     bytes 16-19 vocabulary size
 *   bytes 8-11 version (1)          bytes 20-23 reserved (0)
 *   bytes 12-15 id width (2 or 4)   bytes 24-31 token count (u64)
 * Documents are separated by the tokenizer's end-of-text id. Writes go to a temporary file
 * that is fsynced and renamed. Tested by tests/test_data.c. */
#ifndef FOCUS_SHARD_H
#define FOCUS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#define SHARD_HEADER_BYTES 32

/* Write n ids (each < V) to path atomically; fatal on any I/O error. */
void shard_write(const char* path, const int* ids, size_t n, int V);
/* Read and validate a shard; returns malloc'd ids. *V receives its vocabulary size. */
int* shard_read(const char* path, size_t* n, int* V);
/* 1 if the file starts with the shard magic. */
int shard_is_shard(const char* path);

/* All shards in dir whose names start with prefix ("train_", "val_"), sorted; returns the
 * count and a malloc'd array of malloc'd paths. */
int shard_list(const char* dir, const char* prefix, char*** paths);

#endif
