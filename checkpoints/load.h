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
    char format[16];   /* "gguf", "safetensors", "llm.c" */
    char name[128];    /* model name from metadata, or the file name */
    char arch[16];     /* "llama", "qwen2", "gpt2" */
} ModelInfo;

/* Build m from the file at path with the router settings fc. */
void model_load(Model* m, const char* path, const FocusConfig* fc, ModelInfo* info);

/* 64-bit fingerprint of the backbone (configuration and every parameter bit); a router
 * trained on one base model is refused on another (see the retrofit issue). */
uint64_t model_fingerprint(const Model* m);

#endif
