/* load.h: base models from files users bring.
 *   GGUF (llama, qwen2 and gpt2 architectures; every tensor type of gguf.h),
 *   safetensors (a file or a Hugging Face directory with config.json; GPT-2 and LLaMA names),
 *   llm.c checkpoints (gpt2_124M.bin: fp32 version 3 and bf16 version 5).
 * The format is recognised from the file's first bytes. Errors are fatal and name the file.
 * Tested by tests/test_checkpoints.c (round trips through files the test writes) and
 * tests/test_smollm2.c (the real model). */
#ifndef FOCUS_LOAD_H
#define FOCUS_LOAD_H

#include "../model/model.h"

typedef struct {
    char format[16]; /* "gguf", "safetensors", "llm.c" */
    char name[512];  /* model name from metadata, or the file name (+ the LoRA adapters merged) */
    char arch[16];   /* "llama", "qwen2", "gpt2" */
} ModelInfo;

/* Build m from the file at path with the router settings fc. */
void model_load(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info);
/* The same in the layout lay (model.h; NULL: whole, fp32): only tensor-parallel slice
 * lay->tp->rank of lay->tp->size (model_shard), and/or the projections in the bf16 store
 * (model_store_bf16). The file is mapped (GGUF, safetensors) or read in order (llm.c), and each
 * whole layer tensor passes through one buffer, so the process never holds more than its
 * weights and one layer's tensor. A safetensors checkpoint split over several files is read
 * through its model.safetensors.index.json (the folder, or the index's path). */
void model_load_slice(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info,
                      const ModelLayout* lay);

/* Serialise a llama-architecture model as GGUF (quant: Q8_0 matrices and an F16 embedding
 * instead of F32) into a malloc'd buffer, or write it to path atomically. */
uint8_t* gguf_serialize_llama(const Model* m, int quant, size_t* len);
void gguf_write_model(const Model* m, const char* path, int quant);
/* Let decoding read the weights of the GGUF file `path` (the file m was loaded from) in their
 * stored blocks (m->native; kernels/quant.h): 0, or -1 with the reason in why (not llama, not
 * GGUF, a format the kernels do not read), m unchanged. The file stays mapped until model_free. */
int model_load_native(Model* m, const char* path, char* why, size_t n);
/* Load a llama GGUF for decoding only: the norms and biases as fp32, every projection and the
 * embeddings read in place from the mapped file (model_load_native), so the process holds about
 * the file's size; m->decode_only is set (a forward pass or a router, whose check needs the fp32
 * weights, are refused). 0, or -1 with the reason in why and nothing loaded. */
int model_load_lean(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info, char* why,
                    size_t n);

#endif
