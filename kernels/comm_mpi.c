/* comm_mpi.c: the MPI backend of comm.h (built when CMake finds MPI). Errors return to us
 * (MPI_ERRORS_RETURN) so a failed call ends the run with one line naming the rank; a rank that
 * dies is reported by the launcher, which stops the others. */
#include <mpi.h>
#include <stdlib.h>

#include "comm.h"
#include "common.h"

static MPI_Comm handle(const Comm* c) { return *(const MPI_Comm*)c->handle; }

static void check(const Comm* c, int rc, const char* what) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fatal("comm: rank %d of %d: %s failed: %s", c->rank, c->size, what, msg);
}

static MPI_Datatype mpi_type(CommType t) {
    return t == COMM_F32 ? MPI_FLOAT : t == COMM_F64 ? MPI_DOUBLE : MPI_INT64_T;
}

static void mpi_allreduce(Comm* c, void* buf, size_t n, CommType type) {
    const size_t chunk = (size_t)1 << 30; /* MPI counts are ints */
    const size_t es = type == COMM_F32 ? 4 : 8;
    for (size_t at = 0; at < n; at += chunk) {
        const int cnt = (int)(n - at < chunk ? n - at : chunk);
        check(c,
              MPI_Allreduce(MPI_IN_PLACE, (char*)buf + at * es, cnt, mpi_type(type), MPI_SUM,
                            handle(c)),
              "all-reduce");
    }
}

static void mpi_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    const size_t chunk = (size_t)1 << 30;
    for (size_t at = 0; at < bytes; at += chunk) {
        const int cnt = (int)(bytes - at < chunk ? bytes - at : chunk);
        check(c, MPI_Bcast((char*)buf + at, cnt, MPI_BYTE, root, handle(c)), "broadcast");
    }
}

static void mpi_barrier(Comm* c) { check(c, MPI_Barrier(handle(c)), "barrier"); }

static const CommOps mpi_ops;

static Comm* wrap(MPI_Comm h, int world) {
    Comm* c = callocCheck(1, sizeof *c);
    MPI_Comm* p = mallocCheck(sizeof *p);
    *p = h;
    c->ops = &mpi_ops, c->handle = p, c->world = world;
    MPI_Comm_rank(h, &c->rank);
    MPI_Comm_size(h, &c->size);
    return c;
}

static Comm* mpi_split(Comm* c, int color, int key) {
    MPI_Comm h;
    check(c, MPI_Comm_split(handle(c), color, key, &h), "split");
    MPI_Comm_set_errhandler(h, MPI_ERRORS_RETURN);
    return wrap(h, 0);
}

static void mpi_release(Comm* c) {
    if (c->world) {
        free(c->handle);
        MPI_Finalize();
        return;
    }
    MPI_Comm h = handle(c);
    MPI_Comm_free(&h);
    free(c->handle);
}

static const CommOps mpi_ops = {"mpi",       mpi_allreduce, mpi_broadcast,
                                mpi_barrier, mpi_split,     mpi_release};

const CommOps* comm_mpi_ops(void) { return &mpi_ops; }

Comm* comm_mpi_world(int* argc, char*** argv) {
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        fatal("comm: MPI_Init failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return wrap(MPI_COMM_WORLD, 1);
}
