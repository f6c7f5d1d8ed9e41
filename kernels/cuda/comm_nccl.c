/* comm_nccl.c: the NCCL backend of comm.h (built with CUDA when CMake finds NCCL): one GPU per
 * rank, buffers in device memory, the unique id broadcast over the parent communicator (MPI).
 * Each call runs on the communicator's own stream and waits for it. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#include "../comm.h"
#include "../common.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int* one; /* a device int for the barrier */
} Nccl;

static Nccl* nc(const Comm* c) { return (Nccl*)c->handle; }

static void check(const Comm* c, ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess)
        fatal("comm (NCCL): rank %d of %d: %s failed: %s", c->rank, c->size, what,
              ncclGetErrorString(rc));
    cudaError_t e = cudaStreamSynchronize(nc(c)->stream);
    if (e != cudaSuccess)
        fatal("comm (NCCL): rank %d of %d: %s: %s", c->rank, c->size, what, cudaGetErrorString(e));
}

static void nccl_allreduce(Comm* c, void* buf, size_t n, CommType type) {
    const ncclDataType_t t = type == COMM_F32   ? ncclFloat32
                             : type == COMM_F64 ? ncclFloat64
                                                : ncclInt64;
    check(c, ncclAllReduce(buf, buf, n, t, ncclSum, nc(c)->comm, nc(c)->stream), "all-reduce");
}

static void nccl_broadcast(Comm* c, void* buf, size_t bytes, int root) {
    check(c, ncclBroadcast(buf, buf, bytes, ncclChar, root, nc(c)->comm, nc(c)->stream),
          "broadcast");
}

static void nccl_barrier(Comm* c) {
    check(c,
          ncclAllReduce(nc(c)->one, nc(c)->one, 1, ncclInt32, ncclSum, nc(c)->comm, nc(c)->stream),
          "barrier");
}

static const CommOps nccl_ops;

static Comm* wrap(ncclComm_t comm, int rank, int size) {
    Comm* c = callocCheck(1, sizeof *c);
    Nccl* h = callocCheck(1, sizeof *h);
    h->comm = comm;
    c->ops = &nccl_ops, c->handle = h, c->rank = rank, c->size = size;
    if (cudaStreamCreateWithFlags(&h->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc((void**)&h->one, sizeof(int)) != cudaSuccess)
        fatal("comm (NCCL): rank %d: cannot create its stream", rank);
    return c;
}

static Comm* nccl_split(Comm* c, int color, int key) {
    ncclComm_t sub;
    check(c, ncclCommSplit(nc(c)->comm, color, key, &sub, NULL), "split");
    int rank, size;
    ncclCommUserRank(sub, &rank);
    ncclCommCount(sub, &size);
    return wrap(sub, rank, size);
}

static void nccl_release(Comm* c) {
    Nccl* h = nc(c);
    ncclCommDestroy(h->comm);
    cudaFree(h->one);
    cudaStreamDestroy(h->stream);
    free(h);
}

static const CommOps nccl_ops = {"nccl",       nccl_allreduce, nccl_broadcast,
                                 nccl_barrier, nccl_split,     nccl_release};

Comm* comm_nccl(Comm* c, int device, char* why, size_t n) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
        snprintf(why, n, "rank %d: no GPU %d (%d found)", c->rank, device, count);
        return NULL;
    }
    cudaSetDevice(device);
    ncclUniqueId id;
    if (c->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        snprintf(why, n, "rank 0: ncclGetUniqueId failed");
        return NULL;
    }
    comm_broadcast(c, &id, sizeof id, 0);
    ncclComm_t comm;
    ncclResult_t rc = ncclCommInitRank(&comm, c->size, id, c->rank);
    if (rc != ncclSuccess) {
        snprintf(why, n, "rank %d: ncclCommInitRank: %s", c->rank, ncclGetErrorString(rc));
        return NULL;
    }
    return wrap(comm, c->rank, c->size);
}
