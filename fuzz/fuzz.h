/* fuzz.h: what the fuzz targets share (fuzz_common.c). Each target is a libFuzzer entry point,
 * LLVMFuzzerTestOneInput, over one of the project's readers; built with clang and
 * -fsanitize=fuzzer by `cmake -DFOCUS_FUZZ=ON` (scripts/fuzz.sh), and built into replay_*
 * programs by the normal build, which run the seeds and the saved regressions as a test.
 *
 * A reader meets bad input with fatal(); here fatal_hook jumps back to the target instead of
 * exiting, the target releases what the reader registered (fatal_release_all) and goes on with
 * the next input. A crash, a sanitizer report (a leak included), a broken promise of the reader
 * (an abort in the target) or a time-out is a finding. */
#ifndef FOCUS_FUZZ_H
#define FOCUS_FUZZ_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels/common.h"

extern jmp_buf fuzz_jump;
/* fatal_hook for the targets: back to the setjmp in FUZZ_TRY */
void fuzz_on_fatal(const char* message);

/* Run the statements (a block); a fatal() inside them comes back here, with what the reader
 * held released. */
#define FUZZ_TRY(...)               \
    do {                            \
        fatal_hook = fuzz_on_fatal; \
        if (!setjmp(fuzz_jump)) {   \
            __VA_ARGS__;            \
        }                           \
        fatal_release_all();        \
    } while (0)

/* A private folder for the target's files (created once, removed at exit), and name in it. */
const char* fuzz_path(const char* name);
/* Write data to fuzz_path(name); returns that path. */
const char* fuzz_write(const char* name, const uint8_t* data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif
