/* testutil.h: tiny assertion helpers shared by the tests. A test program prints one line per
 * check that fails, a summary line, and exits non-zero if anything failed. */
#ifndef FOCUS_TESTUTIL_H
#define FOCUS_TESTUTIL_H

#include "../kernels/common.h"

extern int tu_passed, tu_failed;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            tu_passed++;                                         \
        } else {                                                 \
            tu_failed++;                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
        }                                                        \
    } while (0)

/* Print "name: N passed, N failed" and return the exit code. */
int tu_finish(const char* name);

/* Fill x with N(0, scale^2) draws. */
void tu_randn(real* x, size_t n, double scale, Rng* rng);
/* max |a - b| */
double tu_max_abs_diff(const real* a, const real* b, size_t n);

/* A fresh temporary folder for this test's files, removed with everything in it when the test
 * exits (not when a forked child does). tu_path gives name inside it (8 rotating buffers). */
const char* tu_tmpdir(void);
const char* tu_path(const char* name);

/* Run fn(arg) in a forked child: 1 when it exits non-zero with exactly one line on stderr that
 * contains want (the line is copied to msg), else 0 (msg says what happened instead). */
int tu_fails_with(void (*fn)(const void*), const void* arg, const char* want, char* msg, size_t n);

/* ../shared/data (or $FOCUS_DATA), or NULL when it is not there. */
const char* tu_data_dir(void);
/* The fetched SmolLM2 GGUF (scripts/fetch_model.sh), or NULL when it is not there. */
const char* tu_smollm2(void);
/* The Gemma 3 270M file of `scripts/fetch_model.sh gemma3-270m`, or NULL when it is not there. */
const char* tu_gemma3(void);

#endif
