/* make_seeds.c: `fuzz_seeds DIR` writes the fuzz targets' seed corpora under DIR (seeds.h). */
#include <stdio.h>

#include "seeds.h"

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    seeds_write(argv[1]);
    return 0;
}
