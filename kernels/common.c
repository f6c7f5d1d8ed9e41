/* common.c: fatal errors, checked allocation, clock and the random number generator. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "common.h"
#include <sys/mman.h>

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void (*fatal_hook)(const char* message);

static struct {
    void (*release)(void*);
    void* arg;
} deferred[16];
static int ndeferred;

void fatal_defer(void (*release)(void*), void* arg) {
    if (ndeferred == 16) abort(); /* a programming error: releases are not being run */
    deferred[ndeferred].release = release;
    deferred[ndeferred++].arg = arg;
}

/* Remove the newest entry for arg; its release function, or NULL if there is none. */
static void (*take(void* arg))(void*) {
    for (int i = ndeferred - 1; i >= 0; i--) {
        if (deferred[i].arg != arg) continue;
        void (*release)(void*) = deferred[i].release;
        for (int j = i; j + 1 < ndeferred; j++) deferred[j] = deferred[j + 1];
        ndeferred--;
        return release;
    }
    return NULL;
}

void fatal_release(void* arg) {
    void (*release)(void*) = take(arg);
    if (release) release(arg);
}

void fatal_forget(void* arg) { take(arg); }

void fatal_release_all(void) {
    while (ndeferred > 0) fatal_release(deferred[ndeferred - 1].arg);
}

void fatal(const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* one line, whatever a file put into a name it reports (a newline, a terminal escape) */
    for (char* c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (fatal_hook) {
        fatal_hook(msg);
        abort(); /* the hook must not return */
    }
    fflush(stdout);
    fprintf(stderr, "focus: %s\n", msg);
    exit(1);
}

void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (!p) fatal("out of memory: could not allocate %zu bytes (%s:%d)", size, file, line);
    return p;
}

void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (!p) fatal("out of memory: could not allocate %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}

void* malloc_pages_check(size_t size, const char* file, int line) {
    const size_t huge = (size_t)2 << 20;
    void* p = NULL;
    if (posix_memalign(&p, size >= huge ? huge : 4096, size ? size : 1))
        fatal("out of memory: could not allocate %zu bytes (%s:%d)", size, file, line);
#ifdef MADV_HUGEPAGE
    /* (a hint: where the kernel has no transparent huge pages, or none free, 4 KiB pages) */
    if (size >= huge) madvise(p, size / huge * huge, MADV_HUGEPAGE);
#endif
    return p;
}

void* realloc_check(void* p, size_t size, const char* file, int line) {
    void* q = realloc(p, size ? size : 1);
    if (!q) fatal("out of memory: could not grow a buffer to %zu bytes (%s:%d)", size, file, line);
    return q;
}

/* IEEE half (1 sign, 5 exponent, 10 mantissa bits) and bfloat16 (the top half of a float). */
float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_f16(float f, int saturate) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    /* 65520 and above round to infinity (the largest half is 65504) */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | (saturate ? 0x7bff : 0x7c00));
    if (ax < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or zero */
        if (ax < 0x33000000u) return sign; /* below half the smallest subnormal (2^-25) */
        const int e = (int)(ax >> 23);     /* 102 .. 112 */
        const uint32_t man = (ax & 0x7fffff) | 0x800000;
        const int shift = 126 - e; /* the value is man * 2^(e - 150); a unit is 2^-24 */
        uint32_t h = man >> shift, rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((ax >> 13) - (112u << 10)) & 0xffff; /* rebias 127 -> 15 */
    const uint32_t rest = ax & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1); /* to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

void bf16_to_real_rows(real* dst, const uint16_t* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        const uint32_t b = (uint32_t)src[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        dst[i] = (real)f;
    }
}

void real_to_bf16_rows(uint16_t* dst, const real* src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16((float)src[i]);
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rng_seed(Rng* rng, uint64_t seed) { rng->state = seed ^ 0x9E3779B97F4A7C15ull; }

uint64_t rng_u64(Rng* rng) {
    uint64_t z = (rng->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(Rng* rng) { return (double)(rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0); }

double rng_normal(Rng* rng) {
    double u1 = rng_uniform(rng), u2 = rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t fnv1a(uint64_t h, const void* p, size_t n) {
    const uint8_t* b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}
