/* cli.h: what every command of the `focus` binary shares (cli.c). The commands themselves are
 * declared in commands.h, one file each. */
#ifndef FOCUS_CLI_H
#define FOCUS_CLI_H

#include "../checkpoints/load.h"
#include "../model/model.h"

/* Parse argv[first..argc) of command cmd. spec lists the options as "--name:K" separated by
 * spaces, and a destination follows for each, in order, by kind K: s const char*, i int,
 * x double, f int set to 1 (a flag), d int (--device: 0 cpu, 1 cuda), * CliList (each use adds
 * an entry). An i or x kind may declare its valid range, "--ctx:i[1,1048576]": a value outside
 * it (or one that does not fit, or is not finite) is refused naming the range; without one an
 * integer must be in [0, INT_MAX] and a number finite. The name "" takes the positional arguments
 * (":s" or ":*" alone). --help prints help and returns 1 (the command then exits with 0); anything
 * unknown or a bad value is fatal, naming the command. */
typedef struct {
    const char** v; /* malloc'd; the strings are argv's */
    int n;
} CliList;
int cli_parse(const char* cmd, int argc, char** argv, int first, const char* help, const char* spec,
              ...);

/* Returns argv[i+1] for option argv[i] or exits with a message naming the option. */
const char* cli_value(int argc, char** argv, int i);
/* The value of option opt as an integer / a finite number in [lo, hi] (no wrap-around), or exit
 * naming the option and the range. cli_int: [0, INT_MAX]; cli_float: any finite number. */
long long cli_int_range(const char* opt, const char* v, long long lo, long long hi);
int cli_int(const char* opt, const char* v);
double cli_float_range(const char* opt, const char* v, double lo, double hi);
double cli_float(const char* opt, const char* v);
/* Split "key=value" into key (NUL-terminated, at most keycap - 1 bytes) and the returned value;
 * fatal on a malformed pair. */
const char* cli_split_set(const char* kv, char* key, size_t keycap);
/* Apply one --set key=value to cfg and fc. */
void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv);
/* The Focus settings a model is loaded with to be evaluated or served: the defaults with the
 * router off (dense attention) and causal routing; --router, --attn and --set change them. */
FocusConfig cli_serving_focus(void);
/* --device: "cpu" (0) or "cuda" (1); fatal() when CUDA was not built in or no GPU is usable. */
int cli_device(const char* v);
/* Peak resident memory of this process in MiB. */
double peak_rss_mib(void);
/* Resident memory now (MiB); mark_start_rss notes it (main does, before any command); the peak
 * since then, the program and its libraries left out. */
long proc_status_kb(const char* key); /* a kB line of /proc/self/status (RssAnon...), or 0 */
double rss_mib(void);
void mark_start_rss(void);
double peak_rss_growth_mib(void);
/* mkdir -p; 0 on success. */
int make_dirs(const char* path);
/* The context check every command shares: n tokens of `what` (a prompt, --ctx, a task's
 * longest input) must fit the model's context; fatal in one line naming both otherwise. RoPE
 * models would run past it, but on positions they never saw in training: numbers nobody
 * should trust, and a quadratic prompt pass that can look like a hang. */
void cli_check_context(const Model* m, long n, const char* cmd, const char* what);
/* out = dir/name */
void path_join(char* out, size_t n, const char* dir, const char* name);

/* --router/--attn/--topk/--routing of `eval` and `groups` applied to a loaded model (NULL: leave
 * as is). The router's own settings (SET_ROUTER in model/settings.h) come from its stored
 * configuration. */
void apply_router_options(Model* m, const char* router, const char* attn, const char* topk,
                          const char* routing);

/* A model to evaluate: model_load with the serving defaults (cli_serving_focus), then --router,
 * --attn, --topk, --routing (NULL: as is), --lora adapters (lora.h5 of `focus finetune`, merged
 * into the weights), the --set overrides (the router's shape K, dg refused), and placed on the
 * device (0 cpu, 1 cuda). */
void cli_load_model(Model* m, ModelInfo* info, const char* model, const char* router,
                    const char* attn, const char* topk, const char* routing, const CliList* sets,
                    int device, const char* lora);
/* One evaluation mode of a mode list: "dense" (router off), "soft", "hard:k" or "hard:pP" (a
 * budget, as --topk; the router modes need a loaded router), or a training-free pattern
 * (window:W, random:k, blocks:N, blocks_mean:N, oracle:N); MODE@key=value@... sets attention
 * settings for that mode alone (hard:1@w=1024). */
void cli_set_mode(Model* m, const char* mode, int have_router);
/* "dense", or the attention mode, routing, K, w, sinks, dense layers and budget, for reports. */
const char* cli_attention_desc(const Model* m, char* buf, size_t n);

/* Tokens from a shard folder (shards named prefix* first, else all *.bin), a folder of *.txt
 * documents, one shard, or a text file. Text is tokenized with tok_path; a folder's documents
 * are cleaned first (text_clean), a single file only if clean is set; documents are separated
 * by the end-of-text token. */
int* load_tokens(const char* path, const char* prefix, const char* tok_path, int clean, size_t* n);
/* Tokens for evaluation from a shard folder, a shard, or a text file (tokenized with tok_path,
 * else the model file's own tokenizer). */
int* load_eval_tokens(const char* data, const char* model_path, const char* tok_path, size_t* n);

/* Load a model for generation: without a router and unless weights is "f32", only the file's
 * blocks (model_load_lean: memory about the file's size); else fp32 weights and the router, with
 * decoding from the file's blocks on top where it allows (weights NULL: fp32 otherwise, the reason
 * on stderr; "native": fatal otherwise). attn and topk as apply_router_options (hard by default
 * with a router). */
/* --set key=value on a loaded model (after its router): only the Focus keys that are neither the
 * model's own settings nor the router's shape (w, sinks, topk, ...); fatal otherwise. */
void cli_apply_focus_sets(Model* m, const char* model, const char* router, const CliList* sets);
void cli_load_decoder(Model* m, ModelInfo* info, const char* model, const char* router,
                      const char* attn, const char* topk, const char* weights);

#endif
