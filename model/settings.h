/* settings.h: every setting of a model and its router, declared once.
 *
 * Each row: X(section, name, type, field, default, lo, hi, flags, help); lo and hi bound a
 * numeric value (inclusive; a float must also be finite; for topk, the fixed budget and the cap;
 * for dense_layers, each index), checked wherever a value is parsed: INI files, --set, and the
 * configuration a router brings back from router.h5. The tables below (and
 * RUN_SETTINGS in train/runconfig.c, same columns, for the run's own settings) drive parsing of
 * INI files and --set (config_set, setting_parse), config_print, the run configuration text
 * written to RUN_DIR/config.conf and stored in router.h5 (settings_write), `focus settings`,
 * and which settings a trained router brings back with it when it is evaluated (SET_ROUTER).
 * A default of NULL means the model's preset (or the file it is loaded from) decides. */
#ifndef FOCUS_SETTINGS_H
#define FOCUS_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The longest text value (a path): "key = value" must fit a settings-file line as libinih reads
 * it (200 bytes with the line end), with room for the longest key. */
#define SETTING_TEXT_MAX 176

/* flags */
#define SET_ROUTER 1 /* part of the trained router: read back from router.h5 by eval and groups */
#define SET_EVAL 2   /* chosen at evaluation time: not written into a run's configuration */

/* The model's shape (ModelConfig). */
#define MODEL_SETTINGS(X)                                                                  \
    X(model, arch, ARCH, arch, NULL, 0, 0, 0, "architecture: gpt2, llama or gemma3")       \
    X(model, L, INT, L, NULL, 1, 256, 0, "layers")                                         \
    X(model, C, INT, C, NULL, 1, 65536, 0, "model width")                                  \
    X(model, NH, INT, NH, NULL, 1, 4096, 0, "query heads")                                 \
    X(model, NKV, INT, NKV, NULL, 1, 4096, 0,                                              \
      "key/value heads (NH without grouped-query attention)")                              \
    X(model, F, INT, F, NULL, 1, 1048576, 0, "feed-forward hidden width")                  \
    X(model, V, INT, V, NULL, 1, 16777216, 0, "vocabulary size")                           \
    X(model, maxT, INT, maxT, NULL, 1, 4194304, 0, "context length")                       \
    X(model, eps, FLOAT, eps, NULL, 1e-12, 1, 0, "norm epsilon")                           \
    X(model, rope_theta, FLOAT, rope_theta, NULL, 0, 1e12, 0, "rotary base (llama: >= 1)") \
    X(model, qkv_bias, INT, qkv_bias, NULL, 0, 1, 0,                                       \
      "Q/K/V projections carry biases (llama family)")                                     \
    X(model, tied, INT, tied, NULL, 0, 1, 0, "output head shares the token embedding")     \
    X(model, hs, INT, hs, "0", 0, 65536, 0, "head size (0: C / NH)")                       \
    X(model, swa, INT, swa, "0", 0, 4194304, 0,                                            \
      "gemma3: sliding window of the local layers (0: none)")                              \
    X(model, swa_period, INT, swa_period, "0", 0, 256, 0,                                  \
      "gemma3: every swa_period-th layer attends globally")                                \
    X(model, rope_local, FLOAT, rope_local, "0", 0, 1e12, 0,                               \
      "gemma3: rotary base of the local layers")

/* The router and how attention uses it (FocusConfig). Project choices (METHOD.md section 9):
 * sinks = 4 as StreamingLLM (on SmolLM2 one sink took hard k=1 from 35.3 to 21.0, dense 20.3,
 * 4 sinks to 20.96; docs/RESULTS.md); beta_balance = 1 with momentum 0.9 (the paper's EMA of
 * Sinkhorn offsets, beta_balance = 0 and momentum 0.99, left one group with 40 % of a layer's
 * tokens under causal routing). */
#define FOCUS_SETTINGS(X)                                                                          \
    X(focus, K, INT, K, "8", 1, 32, SET_ROUTER, "token groups, at most 32")                        \
    X(focus, dg, INT, dg, "16", 1, 4096, SET_ROUTER, "routing dimension")                          \
    X(focus, tau, FLOAT, tau, "0.1", 1e-4, 1e4, SET_ROUTER, "Sinkhorn / softmax temperature")      \
    X(focus, iters, INT, iters, "10", 1, 1000, SET_ROUTER, "Sinkhorn iterations")                  \
    X(focus, w, INT, w, "128", 0, 4194304, SET_ROUTER,                                             \
      "local window: pairs i - j <= w are never gated")                                            \
    X(focus, lambda, FLOAT, lambda, "10", 0, 1e6, 0,                                               \
      "gate sharpness (initial value when learned)")                                               \
    X(focus, b, FLOAT, bias, "0.5", -1e6, 1e6, 0, "gate offset (initial value when learned)")      \
    X(focus, routing, ROUTING, routing, "sinkhorn", 0, 0, 0,                                       \
      "sinkhorn | causal | prefix_sinkhorn (training; evaluation is causal)")                      \
    X(focus, topk, TOPK, topk, "1", 1, 32, 0,                                                      \
      "hard mode: groups kept per token, or pP / pP:k (until a share P of G_i, at most k)")        \
    X(focus, sinks, INT, sinks, "4", 0, 4194304, SET_ROUTER, "first positions every query keeps")  \
    X(focus, dense_layers, LAYERS, dense_layers, "none", 0, 255, SET_ROUTER,                       \
      "layers that keep dense attention: none, or e.g. 0,1,28-29")                                 \
    X(focus, learn_gate, INT, learn_gate, "0", 0, 1, SET_ROUTER, "lambda and b receive gradients") \
    X(focus, qproj, INT, qproj, "0", 0, 1, SET_ROUTER,                                             \
      "queries choose their groups through their own W_q; keys keep their top-1 group of W_g "     \
      "(project choice, docs/OBJECTIVE.md)")                                                       \
    X(focus, beta_momentum, FLOAT, beta_momentum, "0.9", 0, 1, 0,                                  \
      "EMA momentum of the causal bias")                                                           \
    X(focus, beta_balance, INT, beta_balance, "1", 0, 1, 0,                                        \
      "beta balances causal routing itself (0: EMA of Sinkhorn's offsets)")                        \
    X(focus, seed, U64, seed, "1234", 0, 1.8446744073709552e19, 0, "router initialisation")        \
    X(focus, attn, ATTN, attn, "soft", 0, 0, SET_EVAL,                                             \
      "the attention method: one of those listed below (attention methods)")                       \
    X(focus, block, INT, block, "64", 1, 1048576, SET_EVAL,                                        \
      "blocks, blocks_mean, oracle, blocks_learned: key block size")                               \
    X(focus, blocks, TOPK, blocks, "8", 0, 1048576, SET_EVAL,                                      \
      "block patterns: key blocks kept per query beyond sinks and window, N; or pP / pP:N the "    \
      "best blocks until a share P of the estimated attention mass (at most N)")                   \
    X(focus, local, LOCAL, local, "window", 0, 0, SET_ROUTER,                                      \
      "a model's sliding-window layers (gemma3): window (their own), route (as the others), "      \
      "dense")

typedef enum {
    SETTING_INT,
    SETTING_FLOAT,
    SETTING_U64,
    SETTING_STR, /* char array of `size` bytes */
    SETTING_ARCH,
    SETTING_ATTN,
    SETTING_ROUTING,
    SETTING_TOPK,   /* a count and the share after it (topk, topp; blocks, blocks_p): k, pP, pP:k */
    SETTING_LAYERS, /* the dense_layers bitset */
    SETTING_LOCAL,  /* LocalLayers */
    SETTING_OBJECTIVE
} SettingType;

typedef struct {
    const char* section;
    const char* name;
    SettingType type;
    size_t offset, size; /* the field in its struct */
    const char* def;
    double lo, hi; /* the valid range of a numeric value */
    int flags;
    const char* help;
} Setting;

/* The rows of MODEL_SETTINGS (fields of ModelConfig) and FOCUS_SETTINGS (of FocusConfig). */
extern const Setting model_settings[], focus_settings[];
extern const int model_settings_count, focus_settings_count;

/* Parse v into the field of s in the struct at base: 0, or -2 for a bad value (not of the type,
 * out of the row's range, or for an integer, too large to represent: no wrap-around). */
int setting_parse(const Setting* s, void* base, const char* v);
/* What a value of s must be, for messages: "an integer from 1 to 32", "one of dense, soft,
 * hard". Returns buf. */
const char* setting_expect(const Setting* s, char* buf, size_t n);
/* The field's value as text ("%.9g" for floats when exact, else "%g"); returns buf. */
const char* setting_format(const Setting* s, const void* base, int exact, char* buf, size_t n);
/* The row called name in rows[0..n), or NULL. */
const Setting* setting_find(const Setting* rows, int n, const char* name);
/* Apply every row's default (rows without one are left as they are). */
void settings_defaults(const Setting* rows, int n, void* base);
/* "key = value" lines of the rows in `section`, skipping SET_EVAL rows (the run text). */
void settings_write(FILE* f, const Setting* rows, int n, const void* base, const char* section);
/* Every row with its default and help (`focus settings`). */
void settings_help(FILE* f, const Setting* rows, int n);

#endif
