/* cli.h: what every command of the `focus` binary shares (cli.c). The commands themselves are
 * declared in commands.h, one file each. */
#ifndef FOCUS_CLI_H
#define FOCUS_CLI_H

#include "../checkpoints/load.h"
#include "../data/corpus.h"
#include "../io/io.h"
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
/* Apply one --set key=value to cfg and fc. */
void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv);
/* The Focus settings a model is loaded with to be evaluated or served: the defaults with the
 * router off (dense attention) and causal routing; --router, --attn and --set change them. */
FocusConfig cli_serving_focus(void);
/* --device: "cpu" (0) or "cuda" (1); fatal() when CUDA was not built in or no GPU is usable. */
int cli_device(const char* v);
/* The context check every command shares: n tokens of `what` (a prompt, --ctx, a task's
 * longest input) must fit the model's context; fatal in one line naming both otherwise. RoPE
 * models would run past it, but on positions they never saw in training: numbers nobody
 * should trust, and a quadratic prompt pass that can look like a hang. */
void cli_check_context(const Model* m, long n, const char* cmd, const char* what);
/* --router/--attn/--topk/--routing of `eval` and `groups` applied to a loaded model (NULL: leave
 * as is). The router's own settings (SET_ROUTER in model/settings.h) come from its stored
 * configuration. */
void apply_router_options(Model* m, const char* router, const char* attn, const char* topk,
                          const char* routing);

/* What a command asks of the model it loads (cli_open_model). */
typedef struct {
    const char* model;  /* the model file */
    const char* router; /* --router: router.h5, a block selector, or SELECTOR.h5,ROUTER.h5 */
    const char* attn;   /* --attn, --topk, --routing; NULL: as the router and the defaults say */
    const char* topk;
    const char* routing;
    const CliList* sets; /* --set overrides (NULL: none) */
    const char* lora;    /* --lora adapters (NULL: none) */
    int device;          /* 0 cpu, 1 cuda */
    /* decoding (generate, serve, bench decode): the file's own blocks where they serve;
     * weights "native" insists on them, "f32" refuses them, NULL takes them where it can */
    int decode;
    const char* weights;
} ModelRequest;

/* The one way a command loads a model. Evaluation: model_load with the serving defaults
 * (cli_serving_focus), then --router, --attn, --topk, --routing (apply_router_options). Decoding:
 * without a router and unless weights is "f32", only the file's blocks (model_load_lean: memory
 * about the file's size); else fp32 weights and the router (hard by default with a token
 * router, blocks_learned with a block selector), the file's blocks on top where they serve.
 * Then the --lora adapters (merged into the weights), the --set overrides (the router's shape K,
 * dg refused) and, for evaluation, the device. */
void cli_open_model(Model* m, ModelInfo* info, const ModelRequest* r);
/* One evaluation mode of a mode list: "dense" (router off), "soft", "hard:k" or "hard:pP" (a
 * budget, as --topk; the router modes need a loaded router), or a training-free pattern
 * (window:W, random:k, blocks:N, blocks_mean:N, oracle:N); MODE@key=value@... sets attention
 * settings for that mode alone (hard:1@w=1024). */
void cli_set_mode(Model* m, const char* mode, int have_router);
/* "dense", or the attention mode, routing, K, w, sinks, dense layers and budget, for reports. */
const char* cli_attention_desc(const Model* m, char* buf, size_t n);

#endif
