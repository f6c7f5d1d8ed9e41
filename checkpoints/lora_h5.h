/* lora_h5.h: LoRA adapters in HDF5 (RUN_DIR/lora.h5), the output of `focus finetune --method lora`.
 *
 * Layout: /lora/{qkv,o,fc,fcproj}_{a,b} float32 for the targets the adapter has (A (L, rank, in),
 * B (L, out, rank)); attributes on /: format_version, rank, alpha, targets (LORA_* bits),
 * base_fingerprint (the backbone it was trained on). Written to a temporary file, fsynced and
 * renamed. lora_load refuses another base model, a wrong shape or a damaged file with one line.
 * Tested by tests/cli_retrofit.sh (round trip, another base model refused). */
#ifndef FOCUS_LORA_H5_H
#define FOCUS_LORA_H5_H

#include "../model/model.h"

void lora_save(const char* path, const Model* m, uint64_t fingerprint);
/* Add the adapters in path to m, whose backbone fingerprint is `fingerprint`. */
void lora_load(const char* path, Model* m, uint64_t fingerprint);

#endif
