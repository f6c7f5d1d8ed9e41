/* comm.h: the processes of a run and their collectives (comm.c). Three backends behind one
 * interface, chosen at run time: one process (no library at all), MPI (CPU ranks, launched by
 * mpirun; comm_mpi.c, built when CMake finds MPI) and NCCL (GPU ranks, one GPU each, its unique
 * id broadcast over MPI; kernels/cuda/comm_nccl.c, built with CUDA and NCCL). Counts are in
 * elements; buffers are host memory, device memory for NCCL. Every call either completes on
 * every rank or stops the run with one line naming the rank and the call. */
#ifndef FOCUS_COMM_H
#define FOCUS_COMM_H

#include <stddef.h>

typedef enum { COMM_F32, COMM_F64, COMM_I64 } CommType;

typedef struct Comm Comm;

/* The operations of one backend (comm.c keeps the single-process one). */
typedef struct {
    const char* name;
    void (*allreduce_sum)(Comm* c, void* buf, size_t n, CommType type);
    void (*broadcast)(Comm* c, void* buf, size_t bytes, int root);
    void (*barrier)(Comm* c);
    Comm* (*split)(Comm* c, int color, int key);
    void (*release)(Comm* c);
} CommOps;

struct Comm {
    const CommOps* ops;
    int rank, size;
    void* handle;   /* the backend's communicator */
    int world;      /* the run's world (comm_free of it ends MPI) */
    double seconds; /* time spent in its collectives so far */
};

/* All the processes of this run: MPI's world when mpirun (or another MPI launcher) started it and
 * MPI was built, else one process. Call once, before threads start. */
Comm* comm_world(int* argc, char*** argv);
/* 1 when the environment says an MPI launcher started this process. */
int comm_launched_by_mpi(void);
/* Sub-groups: ranks with the same color, ordered by key (MPI_Comm_split). */
Comm* comm_split(Comm* c, int color, int key);
/* buf (n elements of type) := its sum over the ranks, in place. */
void comm_allreduce_sum(Comm* c, void* buf, size_t n, CommType type);
/* buf (bytes) := root's buf on every rank. */
void comm_broadcast(Comm* c, void* buf, size_t bytes, int root);
void comm_barrier(Comm* c);
/* Release a communicator; the world's release ends MPI (after which no other may be used). */
void comm_free(Comm* c);

/* NCCL over the ranks of c (one GPU per rank, `device`): NULL with the reason in why when NCCL
 * was not built or the GPU cannot be used. Its buffers are device pointers. */
Comm* comm_nccl(Comm* c, int device, char* why, size_t n);

/* The MPI backend a build has (comm_mpi.c), or NULL (comm_nompi.c); comm_nccl is defined by
 * kernels/cuda/comm_nccl.c or comm_nonccl.c, whichever CMake builds. */
const CommOps* comm_mpi_ops(void);
Comm* comm_mpi_world(int* argc, char*** argv);

#endif
