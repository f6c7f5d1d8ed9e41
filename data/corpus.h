/* corpus.h: the tokens of a run or an evaluation, wherever they come from. */
#ifndef FOCUS_CORPUS_H
#define FOCUS_CORPUS_H

#include <stddef.h>

/* Tokens from a shard folder (shards named prefix* first, else all *.bin), a folder of *.txt
 * documents, one shard, or a text file. Text is tokenized with tok_path; a folder's documents
 * are cleaned first (text_clean), a single file only if clean is set; documents are separated
 * by the end-of-text token. */
int* load_tokens(const char* path, const char* prefix, const char* tok_path, int clean, size_t* n);
/* Tokens for evaluation from a shard folder, a shard, or a text file (tokenized with tok_path,
 * else the model file's own tokenizer). */
int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n);

#endif
