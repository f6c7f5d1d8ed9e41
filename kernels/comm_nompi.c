/* comm_nompi.c: a build without MPI (CMake found none): comm_world runs one process. */
#include "comm.h"
#include "common.h"

const CommOps* comm_mpi_ops(void) { return NULL; }

Comm* comm_mpi_world(int* argc, char*** argv) {
    (void)argc, (void)argv;
    fatal("comm: this focus was built without MPI");
    return NULL;
}
