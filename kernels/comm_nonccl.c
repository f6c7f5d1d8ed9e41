/* comm_nonccl.c: a build without CUDA or NCCL: no GPU communicator. */
#include <stdio.h>

#include "comm.h"

Comm* comm_nccl(Comm* c, int device, char* why, size_t n) {
    (void)c, (void)device;
    snprintf(why, n, "this focus was built without NCCL (it needs the CUDA toolkit and NCCL)");
    return NULL;
}
