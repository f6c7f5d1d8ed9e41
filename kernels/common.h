/* common.h: the scalar type, checked allocation and file calls, fatal errors.
 *
 * The engine computes in `real`, which is float in the normal build and double when
 * FOCUS_DOUBLE is defined; the double build of the same sources is what the gradient
 * checks run (tests/test_gradcheck.c). */
#ifndef FOCUS_COMMON_H
#define FOCUS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef FOCUS_DOUBLE
typedef double real;
#define REAL_NAME "double"
#else
typedef float real;
#define REAL_NAME "float"
#endif

/* Print "focus: <message>" and exit(1). Every user-facing error goes through here so
 * that it is one line naming what was expected and what was found (control characters that a
 * file's contents bring into the message are shown as '?'). */
void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* For the fuzz targets (fuzz/), which feed one bad input after another to a reader in the same
 * process: when set, fatal() calls fatal_hook with the message (which must not return, e.g.
 * longjmp back to the target) instead of printing it and exiting. */
extern void (*fatal_hook)(const char* message);
/* What a reader holds while it may still call fatal() (a mapped file, a parsed header): it
 * registers the release with fatal_defer and, when done, runs it with fatal_release(arg). A
 * process that exits on fatal() never needs the rest; a fuzz target returning through fatal_hook
 * calls fatal_release_all() to run them, newest first. At most 16 at a time. */
void fatal_defer(void (*release)(void*), void* arg);
void fatal_release(void* arg);
void fatal_release_all(void);
/* Unregister arg without releasing it (it is returned to the caller after all). */
void fatal_forget(void* arg);

/* IEEE half precision and bfloat16 to float. */
float f16_to_f32(uint16_t h);
float bf16_to_f32(uint16_t h);
/* float to IEEE half precision, rounded to nearest even (subnormals kept); beyond the half
 * range infinity, or the largest finite half when `saturate`; NaN stays NaN. */
uint16_t f32_to_f16(float f, int saturate);
/* float to bfloat16, rounded to nearest even; NaN stays NaN. */
uint16_t f32_to_bf16(float f);
/* n bfloat16 values widened to reals, and n reals rounded to bfloat16 (f32_to_bf16); threads
 * share the work. */
void bf16_to_real_rows(real* dst, const uint16_t* src, size_t n);
void real_to_bf16_rows(uint16_t* dst, const real* src, size_t n);

/* FNV-1a: h advanced over the n bytes at p (start from FNV1A_START); the fingerprints and
 * checksums of files and weights. */
#define FNV1A_START 0xcbf29ce484222325ull
uint64_t fnv1a(uint64_t h, const void* p, size_t n);

void* malloc_check(size_t size, const char* file, int line);
void* calloc_check(size_t n, size_t size, const char* file, int line);
void* realloc_check(void* p, size_t size, const char* file, int line);
#define mallocCheck(size) malloc_check((size), __FILE__, __LINE__)
#define callocCheck(n, size) calloc_check((n), (size), __FILE__, __LINE__)
#define reallocCheck(p, size) realloc_check((p), (size), __FILE__, __LINE__)
/* A buffer that starts on a page (4096 bytes), freed with free(): the KV cache, whose rows of 64
 * halves then lie in whole 128-byte pairs of cache lines, as the L2 fetches them (a large malloc
 * starts 16 bytes past a page: each row touched three lines, and the rows read far apart paid
 * for it). One of 2 MiB or more starts on a 2 MiB boundary and asks the kernel for transparent
 * huge pages (madvise: in the kernel's "madvise" mode, a common default, only such buffers get
 * them): a decode step reads the weights and the chosen keys across hundreds of megabytes, and with
 * 4 KiB pages nearly every page it touched missed the TLB. */
void* malloc_pages_check(size_t size, const char* file, int line);
#define mallocPages(size) malloc_pages_check((size), __FILE__, __LINE__)

/* Wall-clock seconds from a monotonic clock. */
double now_seconds(void);

/* Deterministic random numbers: splitmix64 state, uniform and normal draws. The state is a
 * single uint64 so that checkpoints can store and restore it exactly. */
typedef struct {
    uint64_t state;
} Rng;
void rng_seed(Rng* rng, uint64_t seed);
uint64_t rng_u64(Rng* rng);
double rng_uniform(Rng* rng); /* [0, 1) */
double rng_normal(Rng* rng);  /* N(0, 1), Box-Muller */

#endif
