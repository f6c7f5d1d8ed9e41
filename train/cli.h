/* cli.h: the `focus` subcommands and small argument helpers shared by them. */
#ifndef FOCUS_CLI_H
#define FOCUS_CLI_H

#include "../model/model.h"

int cmd_bench(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_prepare(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_retrofit(int argc, char** argv);
int cmd_groups(int argc, char** argv);

/* Average over layers of the largest group's share of tokens, from the last forward pass. */
double focus_largest_share(const Model* m);

typedef struct {
    double nll;   /* summed negative log-likelihood */
    size_t count; /* scored tokens */
    double seconds;
    double kept; /* hard attention: fraction of causal pairs kept, averaged over windows */
} PplResult;

/* --router/--attn/--topk/--routing of `eval` and `groups` applied to a loaded model (NULL/0:
 * leave as is). */
void apply_router_options(Model* m, const char* router, const char* attn, const char* topk,
                          const char* routing);
/* Fraction of causal pairs the hard top-k mask keeps in the last forward pass, all layers. */
double hard_pairs_kept(const Model* m);

/* Strided perplexity of m (its current attention and routing settings) on ids. */
PplResult eval_perplexity(Model* m, const int* ids, size_t n, int ctx, int stride, int quiet);

/* Tokens from a shard folder (shards named prefix* first, else all *.bin), a folder of *.txt
 * documents, one shard, or a text file. Text is tokenized with tok_path; a folder's documents
 * are cleaned first (text_clean), a single file only if clean is set; documents are separated
 * by the end-of-text token. */
int* load_tokens(const char* path, const char* prefix, const char* tok_path, int clean, size_t* n);

/* Tokens for evaluation from a shard folder, a shard, or a text file (tokenized with tok_path,
 * else the model file's own tokenizer). */
int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n);

/* Returns argv[i+1] for option argv[i] or exits with a message naming the option. */
const char* cli_value(int argc, char** argv, int i);
int cli_int(const char* opt, const char* v);
/* Split "key=value" into key (NUL-terminated, at most keycap - 1 bytes) and the returned value;
 * fatal on a malformed pair. */
const char* cli_split_set(const char* kv, char* key, size_t keycap);
/* Apply one --set key=value to cfg and fc. */
void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv);
/* --device: "cpu" (0) or "cuda" (1); fatal() when CUDA was not built in or no GPU is usable. */
int cli_device(const char* v);
/* Run m on the device (no-op for the CPU); call after the host model is fully set up. */
void model_use_device(Model* m, int device);
/* Peak resident memory of this process in MiB. */
double peak_rss_mib(void);

#endif
