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
