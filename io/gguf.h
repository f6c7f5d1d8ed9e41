/* gguf.h: a memory-mapped GGUF (v2, v3) reader and the dequantisation of its tensor types.
 *
 * File layout (all little-endian):
 *   magic "GGUF", u32 version, u64 tensor_count, u64 kv_count,
 *   kv_count x (string key, u32 value type, value),
 *   tensor_count x (string name, u32 n_dims, n_dims x u64 ne, u32 type, u64 offset),
 *   padding to `general.alignment` (default 32), then the tensor data; offsets are relative
 *   to the start of the data section. A string is u64 length + bytes; an array is u32 element
 *   type + u64 count + elements. ne[0] is the fastest-varying dimension, so a matrix with
 *   ne = [cols, rows] is stored row-major as (rows, cols).
 * Every read is bounds-checked; a malformed file yields an error message, never a crash.
 * Tested by tests/test_gguf.c (mutated headers, dequantisation fixture). */
#ifndef FOCUS_GGUF_H
#define FOCUS_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum {
    GGUF_VAL_UINT8 = 0,
    GGUF_VAL_INT8 = 1,
    GGUF_VAL_UINT16 = 2,
    GGUF_VAL_INT16 = 3,
    GGUF_VAL_UINT32 = 4,
    GGUF_VAL_INT32 = 5,
    GGUF_VAL_FLOAT32 = 6,
    GGUF_VAL_BOOL = 7,
    GGUF_VAL_STRING = 8,
    GGUF_VAL_ARRAY = 9,
    GGUF_VAL_UINT64 = 10,
    GGUF_VAL_INT64 = 11,
    GGUF_VAL_FLOAT64 = 12
};

/* ggml tensor types this reader understands (the numbers are the file format's). */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30
};

typedef struct {
    const char* key; /* points into the mapping; not NUL-terminated: use key_len */
    uint64_t key_len;
    uint32_t type;
    const uint8_t* val; /* start of the value in the mapping */
    /* arrays */
    uint32_t arr_type;
    uint64_t arr_n;
} GGUFKV;

typedef struct {
    char name[96];
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
    const uint8_t* data;
    size_t nbytes;
    uint64_t nelem;
} GGUFTensor;

typedef struct {
    const char* path;
    uint8_t* map;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    GGUFKV* kv;
    GGUFTensor* tensors;
    uint64_t alignment;
    size_t data_offset;
} GGUFFile;

/* Open and validate. Returns 0, or -1 with a one-line reason in err. */
int gguf_open(GGUFFile* f, const char* path, char* err, size_t errlen);
void gguf_close(GGUFFile* f);
/* A heap copy of the open file f, registered with fatal_defer; fatal_release(copy) closes and
 * frees it. For readers that may call fatal() while the file is open. */
GGUFFile* gguf_hold(const GGUFFile* f);

const GGUFKV* gguf_find(const GGUFFile* f, const char* key);
/* Scalar getters: 0 on success (integer types widen, floats convert), -1 missing/wrong type. */
int gguf_get_u64(const GGUFFile* f, const char* key, uint64_t* out);
int gguf_get_f32(const GGUFFile* f, const char* key, float* out);
/* String value (not NUL-terminated) or NULL. */
const char* gguf_get_str(const GGUFFile* f, const char* key, uint64_t* len);
/* Walk an array of strings: call with *pos = NULL first; returns the next string or NULL. */
const char* gguf_arr_str_next(const GGUFFile* f, const GGUFKV* kv, const uint8_t** pos,
                              uint64_t* len);
const GGUFTensor* gguf_tensor(const GGUFFile* f, const char* name);

const char* ggml_type_name(uint32_t type);
/* Bytes of n elements of a type, or 0 if the type is unsupported or n is not whole blocks. */
size_t ggml_nbytes(uint32_t type, uint64_t n);
/* Convert n elements of a tensor of the given type to float. Returns -1 if unsupported. */
int ggml_dequantize(float* out, const void* data, uint32_t type, uint64_t n);

#endif
