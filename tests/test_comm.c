/* test_comm.c: the collectives of kernels/comm.h on however many processes ran it (ctest runs it
 * alone and under mpirun with 2 and 4 ranks): all-reduce sums in f32, f64 and i64, broadcast from
 * every root, sub-groups from a split (even and odd ranks), barrier. Rank 0 reports. */
#include <math.h>
#include <string.h>

#include "../kernels/comm.h"
#include "testutil.h"

int main(int argc, char** argv) {
    Comm* w = comm_world(&argc, &argv);
    const int r = w->rank, n = w->size;
    enum { N = 1000 };
    float f[N];
    double d[N];
    int64_t q[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)(r + 1) * i, d[i] = 0.5 * r + i, q[i] = (int64_t)r << 33;
    comm_allreduce_sum(w, f, N, COMM_F32);
    comm_allreduce_sum(w, d, N, COMM_F64);
    comm_allreduce_sum(w, q, N, COMM_I64);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bad += fabsf(f[i] - (float)(n * (n + 1) / 2) * i) > 1e-6f * (1 + fabsf(f[i]));
        bad += fabs(d[i] - (0.25 * n * (n - 1) + (double)n * i)) > 1e-9;
        bad += q[i] != ((int64_t)n * (n - 1) / 2) << 33;
    }
    CHECK(bad == 0, "rank %d: %d wrong sums", r, bad);
    for (int root = 0; root < n; root++) {
        char msg[32];
        snprintf(msg, sizeof msg, r == root ? "from %d" : "nothing", root);
        comm_broadcast(w, msg, sizeof msg, root);
        char want[32];
        snprintf(want, sizeof want, "from %d", root);
        CHECK(!strcmp(msg, want), "rank %d: broadcast from %d gave '%s'", r, root, msg);
    }
    Comm* half = comm_split(w, r % 2, r);
    CHECK(half->size == (n + 1 - r % 2) / 2 && half->rank == r / 2, "rank %d: split gave %d of %d",
          r, half->rank, half->size);
    double v = r;
    comm_allreduce_sum(half, &v, 1, COMM_F64);
    double want = 0;
    for (int k = r % 2; k < n; k += 2) want += k;
    CHECK(v == want, "rank %d: sum over its half %g, want %g", r, v, want);
    comm_barrier(half);
    comm_free(half);
    comm_barrier(w);
    char why[256];
    Comm* g = comm_nccl(w, -1, why, sizeof why); /* no GPU -1: refused with a reason */
    CHECK(!g && why[0], "rank %d: comm_nccl must refuse device -1", r);
    if (r == 0)
        printf("  %d rank(s), backend %s: sums, broadcasts, split, barrier\n", n, w->ops->name);
    int failed = tu_finish("test_comm");
    comm_free(w);
    return failed;
}
