/* cli.h: the `focus` subcommands and small argument helpers shared by them. */
#ifndef FOCUS_CLI_H
#define FOCUS_CLI_H

#include "../model/model.h"

int cmd_bench(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_prepare(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_generate(int argc, char** argv);

/* Tokens for evaluation from a shard folder, a shard, or a text file (tokenized with tok_path,
 * else the model file's own tokenizer). */
int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n);

/* Returns argv[i+1] for option argv[i] or exits with a message naming the option. */
const char* cli_value(int argc, char** argv, int i);
int cli_int(const char* opt, const char* v);
/* Resolve --config NAME and --set key=value pairs (in order) into cfg and fc. */
void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv);
/* Peak resident memory of this process in MiB. */
double peak_rss_mib(void);

#endif
