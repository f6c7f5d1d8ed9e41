#include "testutil.h"

#include <math.h>

int tu_passed = 0, tu_failed = 0;

int tu_finish(const char* name) {
    printf("%s: %d passed, %d failed\n", name, tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

void tu_randn(real* x, size_t n, double scale, Rng* rng) {
    for (size_t i = 0; i < n; i++) x[i] = (real)(rng_normal(rng) * scale);
}

double tu_max_abs_diff(const real* a, const real* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || d != d) m = d;
    }
    return m;
}

#include <sys/stat.h>

static int exists(const char* p) {
    struct stat st;
    return stat(p, &st) == 0;
}

const char* tu_data_dir(void) {
    static char buf[4096];
    const char* env = getenv("FOCUS_DATA");
    if (env && exists(env)) return env;
    snprintf(buf, sizeof buf, "%s/../shared/data", FOCUS_SOURCE_DIR);
    return exists(buf) ? buf : NULL;
}

const char* tu_smollm2(void) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", FOCUS_SOURCE_DIR);
    return exists(buf) ? buf : NULL;
}
