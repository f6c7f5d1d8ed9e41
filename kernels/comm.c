/* comm.c: one process as a communicator, and the calls of comm.h routed to a backend. */
#include "comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

static void single_allreduce(Comm* c, void* buf, size_t n, CommType type) {
    (void)c, (void)buf, (void)n, (void)type; /* the sum over one rank is the buffer */
}
static void single_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes;
    if (root != 0) fatal("comm: broadcast from rank %d in a run of one process", root);
}
static void single_barrier(Comm* c) { (void)c; }
static Comm* single_split(Comm* c, int color, int key) {
    (void)c, (void)color, (void)key;
    Comm* s = callocCheck(1, sizeof *s);
    *s = *c;
    s->world = 0;
    return s;
}
static void single_release(Comm* c) { (void)c; }

static const CommOps single_ops = {"single",       single_allreduce, single_broadcast,
                                   single_barrier, single_split,     single_release};

int comm_launched_by_mpi(void) {
    /* Open MPI, MPICH / Hydra and PMIx launchers set one of these in every rank */
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

Comm* comm_world(int* argc, char*** argv) {
    if (comm_launched_by_mpi()) {
        if (!comm_mpi_ops())
            fatal(
                "comm: started by an MPI launcher, but this focus was built without MPI "
                "(install libopenmpi-dev and configure again)");
        return comm_mpi_world(argc, argv);
    }
    Comm* c = callocCheck(1, sizeof *c);
    c->ops = &single_ops, c->rank = 0, c->size = 1, c->world = 1;
    return c;
}

Comm* comm_split(Comm* c, int color, int key) { return c->ops->split(c, color, key); }

void comm_allreduce_sum(Comm* c, void* buf, size_t n, CommType type) {
    if (c->size < 2 || !n) return;
    const double t0 = now_seconds();
    c->ops->allreduce_sum(c, buf, n, type);
    c->seconds += now_seconds() - t0;
}

void comm_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) fatal("comm: broadcast from rank %d of %d", root, c->size);
    if (c->size < 2 || !bytes) return;
    const double t0 = now_seconds();
    c->ops->broadcast(c, buf, bytes, root);
    c->seconds += now_seconds() - t0;
}

void comm_barrier(Comm* c) {
    if (c->size < 2) return;
    const double t0 = now_seconds();
    c->ops->barrier(c);
    c->seconds += now_seconds() - t0;
}

void comm_free(Comm* c) {
    if (!c) return;
    c->ops->release(c);
    free(c);
}
