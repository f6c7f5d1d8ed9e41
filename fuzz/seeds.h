/* seeds.h: the starting corpus of the fuzz targets (seeds.c), written from tiny models by
 * fuzz_seeds, so that the seeds follow the formats as this build writes and reads them. */
#ifndef FOCUS_FUZZ_SEEDS_H
#define FOCUS_FUZZ_SEEDS_H

#include "../model/model.h"

/* The tiny LLaMA (L 1, C 8, 2 heads / 1 KV head, F 16, V 16) and router (K 4, dg 4) that the
 * seeds hold; fuzz_router loads its inputs onto it. Deterministic. */
void seeds_model(Model* m);
/* Write every target's seeds under dir: dir/gguf, llmc, safetensors, shard, router, config,
 * tokenizer (folders created). */
void seeds_write(const char* dir);

#endif
