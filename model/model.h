/* model.h: GPT-2, LLaMA and Gemma 3 transformers with the Focus router, forward and backward.
 *
 * One config struct covers the families, and one per-layer description computed from it
 * (model_layer_spec: norms, activation, head size, RoPE, sliding window) is what the passes
 * read instead of the family; parameters live in one buffer carved into named
 * pointers by walking a size table (tensors a family does not use have size 0 and a NULL
 * pointer). Router parameters live in a second buffer, so that retrofit training can give
 * gradients to them alone. Tested by tests/test_gradcheck.c, tests/test_causality.c and
 * tests/test_equivalence.c. */
#ifndef FOCUS_MODEL_H
#define FOCUS_MODEL_H

#include "../kernels/adamw.h"
#include "../kernels/attention.h"
#include "../kernels/comm.h"
#include "../kernels/common.h"
#include "../kernels/quant.h"
#include "../kernels/router.h"
#include "../kernels/sparse.h"
#include "settings.h"

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1, ARCH_GEMMA3 = 2 } Arch;

typedef struct {
    Arch arch;
    int L;            /* layers */
    int C;            /* model width */
    int NH, NKV;      /* query heads, key/value heads (NKV = NH without grouped-query attention) */
    int F;            /* feed-forward hidden width */
    int V;            /* vocabulary size */
    int maxT;         /* context length (GPT-2: rows of the position table) */
    float eps;        /* norm epsilon */
    float rope_theta; /* LLaMA rotary base */
    int qkv_bias;     /* LLaMA family: Q/K/V projections carry biases (Qwen2) */
    int tied;         /* output head shares the token embedding */
    /* Tensor parallelism (Megatron-LM): this model holds one of tp slices of the shape above
     * (0 or 1: the whole model). Slice tp_rank has query heads [tp_rank NH/tp, ...) and their
     * key/value heads (model_kv_head), feed-forward columns [tp_rank F/tp, ...); the norms,
     * embeddings, output head and output biases are whole on every rank. See model_shard. */
    int tp, tp_rank;
    /* Gemma 3 (0 in the other families, so their fingerprints are unchanged): the head size
     * when it is not C / NH (model_head_size); the sliding window of the local layers (a query
     * keeps the swa keys i - swa < j <= i) and the period of the global layers (layer l attends
     * globally when l % swa_period == swa_period - 1; 0: every layer); the local layers' rotary
     * base (rope_theta is the global layers'). */
    int hs;
    int swa, swa_period;
    float rope_local;
} ModelConfig;

/* The head size: hs, or C / NH. */
static inline int model_head_size(const ModelConfig* c) { return c->hs > 0 ? c->hs : c->C / c->NH; }

/* One layer as the passes see it, computed from the config once (model_layer_spec) instead of
 * branches on the family:
 *   gpt2    LayerNorm, GELU MLP, learned positions, biases
 *   llama   RMSNorm, SwiGLU, RoPE on adjacent pairs (GGUF's order)
 *   gemma3  RMSNorm before and after each sub-layer ("sandwich"), RMSNorm of each q and k head
 *           before RoPE, gated GELU (tanh), RoPE on half-split pairs, token embeddings scaled by
 *           sqrt(C), 5 of 6 layers attending within a sliding window with their own RoPE base */
typedef enum { NORM_LAYER = 0, NORM_RMS = 1 } NormKind;
typedef enum { ACT_GELU = 0, ACT_SWIGLU = 1, ACT_GEGLU = 2 } ActKind;
typedef struct {
    NormKind norm;
    int sandwich;     /* a norm after attention and after the MLP, before each residual add */
    int qk_norm;      /* RMSNorm of every q and k head (hs weights each) before RoPE */
    ActKind act;      /* ACT_SWIGLU / ACT_GEGLU: fcw holds F gate rows, then F up rows */
    int rope;         /* rotary positions (else learned, wpe) */
    int rope_halves;  /* RoPE rotates (i, i + hs/2) (NEOX, Gemma's GGUF) instead of (2i, 2i + 1) */
    float rope_theta; /* this layer's rotary base */
    int hs;           /* head size */
    int window;       /* a local layer keeps keys i - j <= window whatever the mode; -1: global */
} LayerSpec;
LayerSpec model_layer_spec(const ModelConfig* c, int l);
/* The scale of the token embedding (sqrt(C) for gemma3, else 1). */
real model_embed_scale(const ModelConfig* c);
/* The tensor-parallel ranks of a model (1 without), and its slice's shape: query heads, key/value
 * heads, feed-forward width. Key/value heads are split with the query heads when tp divides NKV;
 * otherwise each rank keeps copies of the ones its query heads read: one when its query heads
 * all share it, else one per query head (the kernels' mapping, local query head i to local
 * key/value head i / (heads / kv_heads), then holds in every case). */
static inline int model_tp(const ModelConfig* c) { return c->tp > 1 ? c->tp : 1; }
static inline int model_heads(const ModelConfig* c) { return c->NH / model_tp(c); }
static inline int model_ffn(const ModelConfig* c) { return c->F / model_tp(c); }
int model_kv_heads(const ModelConfig* c);
/* The whole model's key/value head that the slice's key/value head j holds. */
int model_kv_head(const ModelConfig* c, int j);
/* Widths of the slice's tensors: q, k, v rows (NH_l + 2 NKV_l) hs; attention output NH_l hs;
 * first MLP projection F_l (gpt2) or 2 F_l (llama: gate rows, then up rows). */
int model_qkv_width(const ModelConfig* c);
int model_att_width(const ModelConfig* c);
int model_fc_width(const ModelConfig* c);

/* dense: router off; soft: the gate (training); hard: the router's top-k groups. The training-free
 * patterns a router has to beat at the same budget (kernels/sparse.h): window (sinks and window
 * only), random (random groups with the router's K and k), blocks / blocks_mean (per query and key/
 * value head the best key blocks by Quest's bounds / by mean keys), oracle (the blocks holding
 * the most dense attention mass: the ceiling of block selection); blocks_learned: the blocks
 * of most mass by the learned block selector (`focus fit-blocks`, Model.method.selector). */
typedef enum {
    ATTN_DENSE = 0,
    ATTN_SOFT = 1,
    ATTN_HARD = 2,
    ATTN_WINDOW = 3,
    ATTN_RANDOM = 4,
    ATTN_BLOCKS = 5,
    ATTN_BLOCKS_MEAN = 6,
    ATTN_ORACLE = 7,
    ATTN_BLOCKS_LEARNED = 8,
    ATTN_STRIDED = 9,
    /* not a setting: a local layer of a model with sliding-window layers keeping its own window
     * (LocalLayers, model_layer_attn) */
    ATTN_LOCAL = 10,
    NUM_ATTN_METHODS /* the rows of attn_methods */
} AttnMode;

/* How the sliding-window layers of a model that has them (gemma3) attend under Focus: their own
 * window whatever the mode (the default: the router and the patterns act on the global layers,
 * where a query's keys are not already bounded), as the global layers (the window replaced by
 * the mode's pattern), or dense. */
typedef enum { LOCAL_WINDOW = 0, LOCAL_ROUTE = 1, LOCAL_DENSE = 2 } LocalLayers;
/* What an attention method needs beside the frozen model. */
typedef enum { NEEDS_NOTHING = 0, NEEDS_ROUTER = 1, NEEDS_SELECTOR = 2 } MethodNeeds;
/* Which keys of the KV cache a decoded row attends to (model/kvcache.c): all, its groups' and
 * its window, sinks and window, or the chosen key blocks and the band. */
typedef enum { CACHE_ALL = 0, CACHE_GROUPS = 1, CACHE_WINDOW = 2, CACHE_BLOCKS = 3 } CacheKeys;

/* Which attention kernel a layer runs over whole sequences (prefill, evaluation, training), the
 * same choice on every backend:
 *   SPARSE  hard top-k: the executor that skips dropped pairs
 *   DENSE   dense attention with no backward to follow (evaluation): the backend's fastest
 *           exact dense kernel (CPU: attention_flash_forward; GPU: the fp32 kernel, no gate)
 *   GATED   the reference kernel with the layer's gate, whose backward exists (training, and
 *           soft evaluation)
 *   BAND    sinks and window only (the window pattern; a sliding-window layer's own window
 *           without sinks; CPU)
 *   BLOCKS  sinks, window and the best key blocks per query (the block patterns; CPU) */
typedef enum {
    ATTN_KERNEL_SPARSE = 0,
    ATTN_KERNEL_DENSE = 1,
    ATTN_KERNEL_GATED = 2,
    ATTN_KERNEL_BAND = 3,
    ATTN_KERNEL_BLOCKS = 4
} AttnKernel;
/* The masks a method's kernel reads over whole sequences: none, the router's groups (top-k, or
 * a query projection's), a pattern's own groups (AttnMethod.pattern_mask: the random control's,
 * the strided pattern's), or all zero (no group: the band alone). */
typedef enum { MASKS_NONE = 0, MASKS_ROUTER = 1, MASKS_PATTERN = 2, MASKS_ZERO = 3 } MaskKind;
/* How the pairs a method keeps are counted (Model.pattern_kept): every causal pair, the band's,
 * from the masks, by its kernel, or, for the router's groups, by evaluate.c from the groups (from
 * the masks when the router has a query projection). */
typedef enum {
    COUNT_ALL = 0,
    COUNT_BAND = 1,
    COUNT_MASKS = 2,
    COUNT_KERNEL = 3,
    COUNT_GROUPS = 4
} PairCount;

struct Model;
/* One attention method, a row of attn_methods (model/methods.c), indexed by its AttnMode, each
 * row defined in its own file (model/methods/NAME.c): the command line, eval --modes, serve and
 * the settings read its name and budget from here; the passes over whole sequences, the KV cache
 * and the pair counts what it keeps. No code outside the rows names a method to decide how it
 * runs. */
typedef struct {
    AttnMode mode;
    const char* name;       /* --attn, eval --modes NAME[:BUDGET], router.h5's settings */
    const char* serve_name; /* what serve's /v1/models reports */
    MethodNeeds needs;
    const char* budget;     /* the setting NAME:V sets (w, topk, blocks), NULL: none */
    const char* budget_arg; /* how the modes' list spells it ("W", "k", "N"), NULL: none */
    int sparse;             /* keeps a subset of the causal pairs (reported with its share) */
    int setting;            /* a value of the attn setting (ATTN_LOCAL is not) */
    const char* about;      /* what a query keeps, for focus settings, --help and the README */
    /* over whole sequences (training, evaluation, a prompt into an empty cache) */
    AttnKernel kernel;       /* the kernel with no backward to follow */
    AttnKernel kernel_train; /* the kernel of a pass kept for a backward */
    GateMode gate;           /* the reference kernel's gate (GATE_SOFT: differentiable) */
    MaskKind masks;          /* the masks its kernel reads */
    /* MASKS_PATTERN: the groups of T positions from pos0 (B sequences alike) of layer l, each
     * token's mask serving it as a key and as a query; a sink (position < sinks) is in every
     * group. The full pass and the KV cache call it alike. */
    void (*pattern_mask)(uint32_t* mask, int B, int T, const struct Model* m, int l, int pos0);
    int blocks;       /* a block pattern: per query and key/value head, chosen key blocks */
    BlockScore score; /* a block pattern's score of its candidate blocks */
    int own_window;   /* its band is the layer's own sliding window, without sinks */
    PairCount count;  /* how its pairs kept are counted */
    /* over the KV cache (a decoded token, a prompt after cached tokens) */
    CacheKeys cache;       /* the keys of a decoded row */
    const char* no_decode; /* why it cannot decode, NULL: it can */
    int causal_routing;    /* decoding needs causal routing (its groups must not see ahead) */
    int cuda;              /* the CUDA path runs it */
    /* its short name in the reports of decoding, NULL: its description */
    const char* brief;
    /* the method and its settings on model m in one line, for reports ("window (no router):
     * sinks=4, w=512, ...") */
    void (*describe)(const struct Model* m, char* buf, size_t n);
} AttnMethod;
extern const AttnMethod* const attn_methods[NUM_ATTN_METHODS];
/* The method named by the first n characters of name (a setting's value), or NULL. */
const AttnMethod* attn_method_named(const char* name, size_t n);
/* "dense, soft, hard, ..." (sep between names) of every setting value, into buf */
const char* attn_method_list(char* buf, size_t n, const char* sep);
/* The methods as one line each (name, what it needs, what a query keeps), or (markdown) as the
 * README's table: what focus settings prints. */
void attn_methods_help(FILE* f, int markdown);

/* modes that keep a subset of the causal pairs (reported with the share they keep) */
static inline int attn_is_sparse(AttnMode a) { return attn_methods[a]->sparse; }
/* modes that read the trained router */
static inline int attn_uses_router(AttnMode a) { return attn_methods[a]->needs == NEEDS_ROUTER; }
/* block patterns (blocks, blocks_mean, oracle, blocks_learned) */
static inline int attn_is_blocks(AttnMode a) { return attn_methods[a]->blocks; }
/* how a block pattern scores its candidate blocks */
static inline BlockScore attn_block_score(AttnMode a) { return attn_methods[a]->score; }

typedef struct {
    AttnMode attn;   /* dense: router off; soft: gated (training); hard: top-k groups */
    Routing routing; /* sinkhorn | causal | prefix_sinkhorn */
    int K;           /* groups, at most 32 */
    int dg;          /* routing dimension */
    int iters;       /* Sinkhorn iterations */
    int w;           /* local window */
    int topk;        /* groups kept per token in hard mode (with topp: at most; 0 = K) */
    float topp;      /* hard mode, adaptive: keep groups until this share of G_i (0 = off) */
    int sinks;       /* the first `sinks` positions are kept by every query, every mode */
    int block;       /* blocks, blocks_mean, oracle: key block size */
    int blocks;      /* blocks, blocks_mean, oracle: key blocks kept per query beyond the band */
    float blocks_p;  /* ... adaptive: until this share of the estimated mass (blocks: at most) */
    uint64_t dense_layers[4]; /* bitset: layers that keep dense attention (router unused) */
    float tau;                /* Sinkhorn / softmax temperature */
    float lambda, bias;       /* gate sharpness and offset (initial values if learned) */
    float beta_momentum;      /* EMA momentum of the causal per-group bias */
    int beta_balance;  /* beta balances causal routing itself (else: EMA of Sinkhorn's offsets) */
    int learn_gate;    /* lambda and b receive gradients */
    int qproj;         /* queries' groups from their own projection W_q, keys' from W_g (top-1) */
    uint64_t seed;     /* router initialisation */
    LocalLayers local; /* sliding-window layers: their window, routed, or dense */
} FocusConfig;

/* the seed of layer l's random groups (--attn random): one per layer, the same in the forward
 * pass and in decoding */
static inline uint64_t focus_random_seed(const FocusConfig* f, int l) {
    return f->seed + 0x9e3779b97f4a7c15ull * (uint64_t)(l + 1);
}

/* The parameter tensors by name: each one's place in Params (below), what it is in
 * model_params, its shape from the config in model_param_shape. */
typedef enum {
    P_WTE,
    P_WPE,
    P_LN1W,
    P_LN1B,
    P_QKVW,
    P_QKVB,
    P_ATTPROJW,
    P_ATTPROJB,
    P_LN2W,
    P_LN2B,
    P_FCW,
    P_FCB,
    P_FCPROJW,
    P_FCPROJB,
    P_LNFW,
    P_LNFB,
    P_LMHEAD,
    P_QNORMW,
    P_KNORMW,
    P_PAN,
    P_PFN,
    NUM_PARAM_TENSORS
} ParamId;

/* What a tensor-parallel slice holds of a slab: all of it, the rows of its own heads (q heads,
 * then the k and v heads it uses), of its own feed-forward units (llama: of the gate and of the
 * up part), or the input columns of its heads / units. */
typedef enum { CUT_WHOLE, CUT_HEAD_ROWS, CUT_FFN_ROWS, CUT_HEAD_COLS, CUT_FFN_COLS } ParamCut;
typedef enum { INIT_RANDOM, INIT_ONE, INIT_ZERO } ParamInit;

typedef struct {
    const char* name; /* the field of Params */
    int per_layer;    /* stacked over the layers: one slab per layer (else one slab) */
    ParamCut cut;     /* tensor parallelism */
    int proj;         /* 0-3: one of a layer's four projection matrices (the bf16 store's
                       * place); -1 otherwise */
    int native;       /* decoding from the file's blocks reads it there (a lean load skips it) */
    ParamInit init;   /* synthetic weights (bench forward): N(0, 0.02), ones (norms), zeros */
    /* Its tensors in the files (per layer: the names after "blk.N.", "model.layers.N.",
     * "h.N."; NULL: not in that format). A tensor that llama-family files hold in parts (q, k,
     * v; gate, up) lists them, each part's shape from model_param_part. */
    const char* gguf;         /* GGUF, one tensor */
    const char* gguf_part[3]; /* GGUF llama and gemma3 files, where they hold it in parts */
    const char* hf_part[3];   /* Hugging Face LLaMA safetensors (one name, or the parts) */
    const char* hf_gpt2;      /* Hugging Face GPT-2 safetensors (Conv1D projections transposed) */
} ParamSpec;
extern const ParamSpec model_params[NUM_PARAM_TENSORS];
/* The parameter tensor of a layer's projection k (0 q k v, 1 attention output, 2 fc or gate +
 * up, 3 fc projection or down: model_params' proj). */
ParamId model_proj_tensor(int k);
/* The parts of tensor t in a llama-family file (1, or those of model_params' gguf_part and
 * hf_part), part i's GGUF name (split: a llama-family file, else the one tensor's name) and its
 * shape (rows 1: a vector). */
int model_param_parts(int t);
const char* model_param_gguf(int t, int i, int split);
void model_param_part(const ModelConfig* c, int t, int i, size_t* rows, size_t* cols);
typedef struct {
    real* wte;      /* (V, C) */
    real* wpe;      /* (maxT, C)      gpt2 */
    real* ln1w;     /* (L, C) */
    real* ln1b;     /* (L, C)         gpt2 */
    real* qkvw;     /* (L, QKV, C)    QKV = (NH + 2*NKV) * hs; rows: q heads, k heads, v heads */
    real* qkvb;     /* (L, QKV)       gpt2, or llama with qkv_bias */
    real* attprojw; /* (L, C, A)      A = NH * hs */
    real* attprojb; /* (L, C)         gpt2 */
    real* ln2w;     /* (L, C) */
    real* ln2b;     /* (L, C)         gpt2 */
    real* fcw;      /* (L, FC, C)     FC = F (gpt2) or 2F (llama: F gate rows, then F up rows) */
    real* fcb;      /* (L, FC)        gpt2 */
    real* fcprojw;  /* (L, C, F) */
    real* fcprojb;  /* (L, C)         gpt2 */
    real* lnfw;     /* (C) */
    real* lnfb;     /* (C)            gpt2 */
    real* lmhead;   /* (V, C)         untied only */
    real* qnormw;   /* (L, hs)        gemma3: the q and k heads' norms */
    real* knormw;   /* (L, hs)        gemma3 */
    real* pan;      /* (L, C)         gemma3: the norm after attention (post_attention_norm) */
    real* pfn;      /* (L, C)         gemma3: the norm after the MLP (post_ffw_norm) */
} Params;

#define NUM_ROUTER_TENSORS 4
enum { ROUTER_WG, ROUTER_CENT, ROUTER_WQ, ROUTER_GATE }; /* router_sizes' indices */
typedef struct {
    real* wg;   /* (L, C, dg) */
    real* cent; /* (L, K, dg) */
    real* wq;   /* (L, C, dg)  the queries' projection (qproj = 1), else NULL */
    real* gate; /* (L, 2)     lambda, b */
} RouterParams;

#define NUM_ACT_TENSORS 27
typedef struct {
    real* encoded;  /* (B, T, C)       residual stream entering layer 0 */
    real* ln1;      /* (L, B, T, C) */
    real* ln1_mean; /* (L, B, T) */
    real* ln1_rstd; /* (L, B, T) */
    real* qkv;      /* (L, B, T, QKV)  after RoPE */
    real* att;      /* (L, B, T, C)    attention output before the projection */
    real* lse;      /* (L, B, NH, T) */
    real* res2;     /* (L, B, T, C)    residual after attention */
    real* ln2;      /* (L, B, T, C) */
    real* ln2_mean; /* (L, B, T) */
    real* ln2_rstd; /* (L, B, T) */
    real* fch;      /* (L, B, T, FC) */
    real* fch_act;  /* (L, B, T, F) */
    real* res3;     /* (L, B, T, C)    residual after the MLP = layer output */
    real* rproj;    /* (L, B, T, dg) */
    real* rS;       /* (L, B, T, K)    router scores */
    real* rG;       /* (L, B, T, K)    group distributions */
    real* colofs;   /* (L, B, K)       Sinkhorn per-group log-scaling (beta estimate) */
    real* lnf;      /* (B, T, C) */
    real* lnf_stat; /* (2, B, T)       final norm mean, rstd */
    real* logits;   /* (B, T, V)       overwritten by dlogits in the backward pass */
    /* gemma3 only (size 0 otherwise): what the backward of its extra norms reads */
    real* qkpre;     /* (L, B, T, NH + NKV, hs) q and k heads before QK-norm */
    real* qkrstd;    /* (L, B, T, NH + NKV) */
    real* attp;      /* (L, B, T, C)    attention output projection, before its norm */
    real* attp_rstd; /* (L, B, T) */
    real* mlpp;      /* (L, B, T, C)    MLP output, before its norm */
    real* mlpp_rstd; /* (L, B, T) */
} Acts;

/* LoRA adapters (Hu et al., 2021), the fine-tuning baseline a router retrofit is compared with:
 * W x becomes W x + (alpha / rank) B A x for the targeted projections of every layer, with
 * A (rank, in) drawn N(0, 1/in) and B (out, rank) zero at the start (the model is unchanged until
 * B learns). Only A and B get gradients (GRAD_LORA); the frozen weights pass input gradients.
 * The targets, in the order of LoraParams and of lora_targets' names, and each one's bit in
 * LoraConfig.targets: */
typedef enum {
    LORA_TARGET_QKV = 0,
    LORA_TARGET_O = 1,
    LORA_TARGET_FC = 2,
    LORA_TARGET_FCPROJ = 3,
    NUM_LORA_TARGETS = 4
} LoraTarget;
enum {
    LORA_QKV = 1 << LORA_TARGET_QKV,
    LORA_O = 1 << LORA_TARGET_O,
    LORA_FC = 1 << LORA_TARGET_FC,
    LORA_FCPROJ = 1 << LORA_TARGET_FCPROJ
};
typedef struct {
    int rank;    /* 0: no adapters */
    float alpha; /* the update is scaled by alpha / rank */
    int targets; /* LORA_* bits */
} LoraConfig;

#define NUM_LORA_TENSORS 8
typedef struct {
    real *qkv_a, *qkv_b;       /* (L, r, C), (L, QKV, r) */
    real *o_a, *o_b;           /* (L, r, C), (L, C, r) */
    real *fc_a, *fc_b;         /* (L, r, C), (L, FC, r) */
    real *fcproj_a, *fcproj_b; /* (L, r, F), (L, C, r) */
} LoraParams;
/* Where target k's A (L, r, in) and B (L, out, r) are among LoraParams' tensors and
 * Model.lora_sizes. */
static inline int lora_a_at(LoraTarget k) { return 2 * (int)k; }
static inline int lora_b_at(LoraTarget k) { return 2 * (int)k + 1; }
static inline real* lora_a(const LoraParams* p, LoraTarget k) {
    return ((real* const*)p)[lora_a_at(k)];
}
static inline real* lora_b(const LoraParams* p, LoraTarget k) {
    return ((real* const*)p)[lora_b_at(k)];
}

typedef enum { GRAD_ROUTER = 0, GRAD_ALL = 1, GRAD_LORA = 2 } GradMode;

/* How the frozen weights are held: fp32; bf16 throughout (the GPU layout focus plan plans for);
 * the CPU's bf16 store (model_store_bf16: the projections in bf16, the rest fp32, one layer's
 * fp32 buffer). */
typedef enum { WEIGHTS_FP32 = 0, WEIGHTS_BF16 = 1, WEIGHTS_BF16_PROJ = 2 } WeightStore;

/* Where a process's model comes from: its tensor-parallel group (NULL or of one rank: the whole
 * model) and how it holds the weights (WEIGHTS_FP32 or WEIGHTS_BF16_PROJ). */
typedef struct {
    Comm* tp;
    WeightStore store;
} ModelLayout;

enum {
    NATIVE_Q,
    NATIVE_K,
    NATIVE_V,
    NATIVE_O,
    NATIVE_GATE,
    NATIVE_UP,
    NATIVE_DOWN,
    NATIVE_PER_LAYER
};
/* Native matrix k of a layer: part `part` of parameter tensor t (model_param_part; its GGUF
 * name model_param_gguf(t, part, 1)). */
typedef struct {
    ParamId t;
    int part;
} NativePart;
extern const NativePart model_native[NATIVE_PER_LAYER];

/* The state of the active attention method (Model.fc.attn, a row of attn_methods) that its
 * settings do not hold: what the loader gave it. The token router's own parameters are
 * Model.router. */
typedef struct AttnState {
    /* the learned block selector of blocks_learned (L, NH, BLOCKGATE_WIDTH(hs)), NULL unless
     * loaded (checkpoints/blockgate_h5.h) */
    real* selector;
    /* its per-layer budgets (L): blocks kept per query in each layer when blocks = selector_n0,
     * scaled to other budgets (model_selector_budget); NULL: blocks in every layer */
    int* selector_blocks;
    int selector_n0;
    /* the centroids with the blocks (--router SELECTOR.h5,ROUTER.h5): a block pattern's query
     * also keeps the distant keys it shares a token group with (kernels/sparse.h,
     * attention_blocks_forward; the KV cache's group lists in decoding) */
    int with_groups;
} AttnState;

/* How the passes over whole sequences run: set by the training loops and teacher passes around
 * the passes they make, not by the attention method. */
typedef struct PassFlags {
    int no_head;      /* forward passes stop after the last layer (no norm, head or loss) */
    int kl_active;    /* tprob holds the teacher of the current (B, T): backward follows the KL */
    int mass_ready;   /* the group mass of the last teacher pass is there (host or device) */
    int routed_dense; /* set during a teacher pass: dense attention, routing still computed */
    /* A keep = 1 forward pass on the CPU keeps only what a router's backward reads (keep becomes
     * KEEP_ROUTER: ln2 and the MLP activation are not kept per layer; they feed only weight
     * gradients). Set by router training; a GRAD_ALL or GRAD_LORA backward is then refused. */
    int lean_acts;
} PassFlags;

/* How far each layer's attention is from the dense attention of the same input (`focus eval ppl
 * --attn-error`; CPU passes over whole sequences, the global layers: a local layer's window is the
 * model's own). Sums over the passes since the arrays were zeroed, per layer (L each):
 *   heads:  |o - o_D|^2, o the heads' outputs before the output projection, o_D dense's
 *   out:    |y - y_D|^2, y the residual stream after the attention's contribution (the output
 *           projection, and its norm where the model has one: Gemma 3), y_D dense's
 * each with the same for the window alone (sinks and w: what the sparse part adds to) and the
 * reference |o_D|^2, |y_D - x|^2 (x the layer's input): relative errors are the ratios. */
typedef struct {
    double *heads, *heads_window, *heads_ref;
    double *out, *out_window, *out_ref;
} AttnError;

typedef struct Model {
    ModelConfig cfg;
    FocusConfig fc;
    Params params;
    real* params_mem;
    size_t param_sizes[NUM_PARAM_TENSORS];
    size_t num_params;
    Params grads; /* allocated on the first GRAD_ALL backward */
    real* grads_mem;
    RouterParams router;
    real* router_mem;
    size_t router_sizes[NUM_ROUTER_TENSORS];
    size_t num_router;
    RouterParams rgrads;
    real* rgrads_mem;
    LoraConfig lora;   /* adapters (model_lora_init), rank 0 without */
    LoraParams lw, lg; /* their weights and gradients */
    real *lora_mem, *lora_grads_mem, *lora_scratch;
    size_t lora_sizes[NUM_LORA_TENSORS], num_lora, lora_scratch_n;
    real* beta; /* (L, K) causal routing bias, an EMA of colofs; not a gradient parameter */
    long beta_updates;
    /* the active method's state beside fc.attn: its block selector and whether groups join it */
    AttnState method;
    /* called by the CPU forward pass over whole sequences after each layer's attention, when set,
     * with that layer's normalised input h (B, T, C: the router's input), its q, k, v (B, T, QKV;
     * RoPE applied) and the attention's log-sum-exps lse (B, NH, T): how `focus fit-blocks` and
     * the mass objective's teacher (train/mass.c) see a frozen model's attention */
    void (*layer_observer)(void* ctx, int layer, const real* h, const real* qkv, const real* lse,
                           int B, int T);
    void* layer_observer_ctx;
    /* activations for the current (B, T); with keep == 0 every layer shares one slot */
    Acts acts;
    real* acts_mem;
    uint32_t* rmask; /* (L, B, T) hard top-k masks */
    int B, T, keep;
    int* inputs;  /* (B, T) */
    int* targets; /* (B, T) */
    real* losses; /* (B, T) */
    /* after a forward pass with targets: each scored row's largest logit and its target's logit
     * (the target is the greedy choice when they are equal), whether or not the pass kept its
     * logits (model_head_rows) */
    real *row_max, *row_target;
    real mean_loss; /* -1 when no targets were given */
    /* teacher signals of the kl and attn objectives (model_teacher_forward) */
    real* tprob;     /* (B, T, V) the dense model's next-token probabilities */
    real* tnegent;   /* (B, T) sum_v p log p of each row of tprob */
    real* kl_losses; /* (B, T) KL(teacher || model) per token */
    real mean_kl;    /* with pass.kl_active and targets: the mean KL of the last forward */
    real* atarget;   /* (L, B, T, K) dense attention mass beyond the window, by group */
    size_t teacher_bt, atarget_n; /* sizes of the teacher buffers */
    /* pairs kept and causal pairs, summed over layers and sequences, of the last forward pass in
     * a training-free pattern (window, random, blocks, oracle; the router's hard mode is counted
     * from its masks by the caller) */
    double pattern_kept, pattern_pairs;
    AttnError* attn_error; /* when set (the caller's), the CPU passes add to it */
    PassFlags pass;        /* how the passes run, set by the training loops and teacher passes */
    /* backward scratch */
    real* scratch_mem;
    size_t scratch_size;
    /* where the passes run (model_place; backend.h): the CPU after model_build */
    const struct ModelBackend* backend;
    void* device; /* the backend's own state (device copies), NULL on the CPU */
    /* Decoding from the weights as the file stores them (model_decode_step; filled by
     * model_load_native in checkpoints/load.c, llama models): per layer NATIVE_PER_LAYER
     * matrices (q, k, v, o, gate, up, down), then the output head, then the token embedding;
     * NULL: decode reads the fp32 parameters. native_owner (the mapped file) is released by
     * native_release in model_free. decode_only: the fp32 copies of those matrices were never
     * loaded (model_load_lean), so only model_decode_step may run. */
    QMatrix* native;
    int decode_only;   /* see model_drop_native_copies too */
    int prefill_exact; /* a prompt's products from native weights in fp32, not int8 (qmatmul) */
    /* data-parallel training: the ranks whose batches together are the step's batch (NULL: this
     * process alone); model_update_beta adds up its statistics across them */
    Comm* dp;
    /* tensor parallelism: the ranks holding the other slices of this model (cfg.tp of them; NULL
     * for a whole model). Their partial sums are added up after the attention output and MLP
     * down projections (forward) and after the QKV and MLP up projections (backward). */
    Comm* tp;
    uint64_t whole_fingerprint; /* of the whole model this slice was cut from (model_shard), or
                                 * of the fp32 weights a bf16 store was rounded from */
    /* The frozen projections (qkvw, attprojw, fcw, fcprojw) in bf16 (model_store_bf16), each
     * (L, rows, cols) from its offset; NULL: they are fp32 in params. wstage: one layer's matrix
     * widened to fp32 for the pass that uses it. */
    uint16_t* wbf16;
    size_t wbf16_off[4], wbf16_n;
    real* wstage;
    size_t wstage_n;
    void* native_owner;
    void (*native_release)(void*);
    char source[512]; /* the file it was loaded from ("" for a model built here): errors name it */
    /* the token a sequence starts with, when the model's tokenizer adds one (GGUF
     * add_bos_token: Gemma's <bos>), else -1: evaluation windows start with it */
    int bos;
} Model;

/* The row of the method the model runs (fc.attn; a sliding-window layer may run its own:
 * model_layer_attn). */
static inline const AttnMethod* model_method(const Model* m) { return attn_methods[m->fc.attn]; }

/* The selector's budget of layer l scaled to n blocks a query keeps on average: its per-layer
 * budget times n / method.selector_n0, rounded; n itself without per-layer budgets. */
static inline int model_selector_budget(const Model* m, int l, int n) {
    const AttnState* s = &m->method;
    if (!s->selector_blocks || s->selector_n0 <= 0) return n;
    const long long b = s->selector_blocks[l];
    return (int)((2 * b * n + s->selector_n0) / (2 * (long long)s->selector_n0));
}

/* The key blocks layer l keeps per query in the block patterns: fc.blocks, or under the learned
 * selector its budget of the layer (model_selector_budget). */
static inline int model_layer_blocks(const Model* m, int l) {
    if (attn_block_score(m->fc.attn) != BLOCKS_LEARNED) return m->fc.blocks;
    return model_selector_budget(m, l, m->fc.blocks);
}

/* Named configurations: gpt2-124m, smollm2-135m, gemma3-270m, tiny-gpt2, tiny-llama, tiny-gemma3,
 * and the shapes of
 * llama2-7b, llama2-13b, llama2-70b, mistral-7b, qwen2.5-7b, llama3-8b (random weights, for
 * benchmarks). 0 on success. */
int model_config_preset(const char* name, ModelConfig* cfg);
void focus_config_default(FocusConfig* fc);
/* Set one key of MODEL_SETTINGS or FOCUS_SETTINGS (settings.h; e.g. "K", "tau", "routing",
 * "attn", "L", "arch") from a string. 0 on success, -1 unknown key, -2 bad value. */
int config_set(ModelConfig* cfg, FocusConfig* fc, const char* key, const char* value);
/* Split a --set "key=value" into key (NUL-terminated, at most keycap - 1 bytes) and the returned
 * value; fatal on a malformed pair. */
const char* config_split_setting(const char* kv, char* key, size_t keycap);
/* The MODEL_SETTINGS or FOCUS_SETTINGS row called key, or NULL. */
const Setting* config_find(const char* key);
/* Layer l keeps dense attention (listed in dense_layers). */
static inline int focus_layer_dense(const FocusConfig* f, int l) {
    return l >= 0 && l < 256 && ((f->dense_layers[l >> 6] >> (l & 63)) & 1);
}
/* The attention mode layer l runs in: the model's, or dense where dense_layers says so. */
static inline AttnMode focus_layer_attn(const FocusConfig* f, int l) {
    return focus_layer_dense(f, l) ? ATTN_DENSE : f->attn;
}
/* The attention mode layer l of m runs in: ATTN_LOCAL on a sliding-window layer keeping its own
 * window (LocalLayers), ATTN_DENSE on one made dense, else focus_layer_attn. */
AttnMode model_layer_attn(const Model* m, int l);
/* Layer l's router is used (and trained): not dense by dense_layers, not a sliding-window layer
 * keeping its own window or made dense. */
int model_layer_routed(const Model* m, int l);
/* "1", "2", or "p0.9" / "p0.9:2" for an adaptive budget (with a cap on k). buf: 32 bytes. */
const char* focus_topk_str(const FocusConfig* f, char* buf);
/* a budget as its setting reads: "n", "pP" (n = 0) or "pP:n"; buf of 32 bytes */
const char* budget_str(int n, float p, char* buf);
/* "0,1,29", or "none". buf: at least 1024 bytes. */
const char* focus_dense_layers_str(const FocusConfig* f, char* buf, size_t n);
/* The model shape c within its settings' ranges (settings.h) and consistent: 0, or -1 with a
 * one-line reason in err. Readers call it before anything the shape sizes is allocated. */
int model_config_check(const ModelConfig* c, char* err, size_t n);
/* Parameters a model of shape c holds (as model_build would allocate); c must pass
 * model_config_check (then no product overflows). */
size_t model_param_count(const ModelConfig* c);
/* Check a configuration for consistency; fatal() with a message naming the problem. */
void config_validate(const ModelConfig* cfg, const FocusConfig* fc);
void config_print(const ModelConfig* cfg, const FocusConfig* fc, FILE* f);

/* 64-bit fingerprint of the backbone (configuration and every parameter bit; for a slice, of the
 * whole model it was cut from); a router trained on one base model is refused on another. */
uint64_t model_fingerprint(const Model* m);
/* The same hash over the weights this process holds (a slice's own): what must not change while
 * a router trains. */
uint64_t model_weights_hash(const Model* m);

/* Store the frozen projection matrices (Q/K/V, attention output, MLP up/gate and down) in bf16,
 * rounded to nearest even: half their memory (the norms, biases, embeddings and head stay fp32);
 * a pass widens each layer's matrix to fp32 in one buffer when it uses it. The passes then use
 * the rounded weights; the fingerprint stays that of the fp32 weights (a router trained on the
 * store is the file's model's). For router training and evaluation on the CPU: weight or adapter
 * gradients, decoding, writing the model and other devices are refused afterwards. */
void model_store_bf16(Model* m);
/* Layer l's matrix of projection tensor t (4 qkvw, 6 attprojw, 10 fcw, 12 fcprojw; Params
 * order): in params, or widened from the bf16 store into m->wstage (valid until the next call). */
const real* model_layer_weight(Model* m, int t, int l);

/* Keep only slice cfg.tp_rank of cfg.tp of a whole model (Megatron-LM tensor parallelism):
 * column-parallel Q/K/V and MLP up/gate rows, row-parallel attention output and MLP down columns;
 * the rest stays whole. tp: the ranks of the slices, rank i holding slice i. The router stays
 * whole (replicated). The model must be on the CPU, without LoRA adapters or native weights
 * (they are dropped). Fatal with a one-line reason when the layout is impossible (tp does not
 * divide the heads or the feed-forward width). */
void model_shard(Model* m, Comm* tp);
/* The whole model's weights, one slab at a time: slab(ctx, t, l, dst) writes layer l of
 * parameter tensor t (Params order; 0 for tensors not stacked over layers) of the whole model,
 * fp32, to dst. What a model loader offers model_fill. */
typedef struct {
    void* ctx;
    void (*slab)(void* ctx, int t, int l, real* dst);
} WeightSource;
/* The reals of one slab (one layer's part of a tensor stacked over layers, or the whole of
 * another) of parameter tensor t of a model of shape c. */
size_t model_param_slab(const ModelConfig* c, int t);
/* The (rows, cols) of one slab of tensor t for config c (a slice's for a slice); rows 0 for a
 * tensor this model does not have. */
void model_param_shape(const ModelConfig* c, int t, size_t* rows, size_t* cols);
/* Fill m's parameters from the whole model of shape `whole`: all of them, or, for a slice or a
 * bf16 store (model_build_slice), its part, each whole slab passing through one buffer (the
 * process never holds more than its weights and one slab) and hashed for the whole fp32 model's
 * fingerprint. */
void model_fill(Model* m, const ModelConfig* whole, const WeightSource* src);
/* model_build for the layout lay (NULL: whole, fp32) of the shape whole: slice tp->rank of
 * tp->size, the projections in a bf16 store; fill it with model_fill. */
void model_build_slice(Model* m, const ModelConfig* whole, const FocusConfig* fc,
                       const ModelLayout* lay);
/* The layout of cfg split over tp ranks is possible: 0, or -1 with a one-line reason in err. */
int model_tp_check(const ModelConfig* c, int tp, char* err, size_t n);

/* Allocate parameters (zeroed) and the router (randomly initialised from fc->seed). */
void model_build(Model* m, const ModelConfig* cfg, const FocusConfig* fc);
void model_free(Model* m);
/* With native weights: the fp32 copies of the matrices they replace (projections, embedding,
 * head) given back to the system, page by page (the process then holds about the file's
 * size); the model is decode-only from then on. For a model loaded in full to check a router
 * against it. */
void model_drop_native_copies(Model* m);

/* What a router training step of B x T tokens holds in memory, in bytes, computed from the
 * shapes alone (no model is built): the frozen weights (held as w says), the
 * activations kept for the input-gradient backward, the logits, the router with its gradients
 * and AdamW moments, the backward's scratch and the masks, the teacher's buffers of the kl / attn
 * objectives. The same sizes model_act_sizes and the CPU backward allocate; a data-parallel rank
 * holds all of it for its B / N rows. */
typedef struct {
    size_t weights, activations, logits, router, workspace, teacher, total;
} MemoryPlan;
MemoryPlan model_memory_plan(const ModelConfig* c, const FocusConfig* f, int B, int T,
                             int objective_kl, int objective_attn, WeightStore w);
/* The same for the mass objective (train/mass.c): the teacher's dense forward pass at B = 1 with
 * one layer's activations and no head, one window's teacher (h in bf16 and `queries` rows of
 * `keys` entries for each of `layers` routed layers, the scratch of `threads` threads), and the
 * router step's buffers; values: the teacher scores the output a key restores (mass_values). */
MemoryPlan model_memory_plan_mass(const ModelConfig* c, const FocusConfig* f, int T, int layers,
                                  int queries, int keys, int threads, int values, WeightStore w);
/* Replace the router settings (K, dg, ...): router buffers are reallocated and re-initialised. */
void model_set_router_config(Model* m, const FocusConfig* fc);
/* GPT-2-style random backbone (N(0, 0.02), scaled residual projections, unit norms). */
void model_init_backbone(Model* m, uint64_t seed);
/* W_g ~ N(0, 1/C), C ~ N(0, 1/dg), lambda and b from the config, beta = 0. */
void model_init_router(Model* m, uint64_t seed);
/* How many of the router's values AdamW trains, a prefix of router_mem: W_g, C, W_q and (with
 * learn_gate) lambda and b. */
size_t model_router_trained(const Model* m, int learn_gate);

/* model->keep after a keep = 1 pass with pass.lean_acts (backend.h: model_act_sizes). */
enum { KEEP_ROUTER = 2 };

/* Forward pass over tokens (B, T). With targets (or NULL) it sets mean_loss. keep = 1 stores
 * every layer's activations for a backward pass; keep = 0 uses one layer's worth. */
void model_forward(Model* m, const int* inputs, const int* targets, int B, int T, int keep);
/* Zero the gradients that a backward with this mode fills. */
void model_zero_grad(Model* m, GradMode mode);
/* Backward from the mean loss of the last forward (which must have had targets and keep = 1).
 * GRAD_ROUTER: W_g and C (and lambda, b if learn_gate) only, input gradients through every
 * frozen layer. GRAD_ALL: every parameter too. GRAD_LORA: the LoRA adapters only (lg). Gradients
 * accumulate. */
void model_backward(Model* m, GradMode mode);
/* Teacher pass of the kl and attn objectives (METHOD.md section 9): the same frozen model with
 * the router off (dense attention, keep = 1) on inputs (B, T). want_logp keeps its next-token
 * log-probabilities: the next forward with targets also sets mean_kl, and the next backward
 * follows KL(teacher || model) instead of the LM loss. want_mass also runs the router on the dense
 * hidden states and keeps, per routed layer, where each token's dense attention beyond its window
 * goes, by group (attention_group_mass): call model_attn_objective before the next forward. */
void model_teacher_forward(Model* m, const int* inputs, int B, int T, int want_logp, int want_mass);
/* The attn objective after a want_mass teacher pass: each routed layer's group distribution G_i
 * should put its mass where token i's dense attention beyond the window goes:
 *   loss = -1/(L' N NH) sum_l sum_i sum_k t_lik log G_lik,  t = attention_group_mass
 * (N = B T tokens, L' routed layers; t carries each token's distant mass, so tokens whose
 * attention stays local weigh little). t is a constant (the teacher's), so the gradient flows
 * only through G_i into W_g and C of the same layer: no backward through the backbone. With
 * backward, weight * dloss accumulates into the router gradients. Returns the loss. */
double model_attn_objective(Model* m, real weight, int backward);

/* Fold the last forward pass (keep = 1, router on) into beta, the causal routing bias, as an EMA:
 * with beta_balance, the beta under which causal routing gives each group 1/K of the mass on this
 * batch's scores (project choice, METHOD.md section 9); else Sinkhorn's per-group offsets. */
void model_update_beta(Model* m);

/* Add LoRA adapters to m (config lc, A drawn from seed, B zero); lc->targets is a set of
 * LORA_* bits. model_lora_merge folds them into the weights (W += alpha/rank B A) and removes
 * them: the model then runs with no adapter cost (how a trained adapter is served). Adapters run
 * on the CPU. */
void model_lora_init(Model* m, const LoraConfig* lc, uint64_t seed);
void model_lora_merge(Model* m);
/* "qkv,o,fc,fcproj" (any subset) to LORA_* bits; -1 for an unknown name. */
int lora_parse_targets(const char* s);

/* Run m on a device from now on: "cpu" (where model_build leaves it) or "cuda" (one GPU; the
 * host weights, router and beta are copied there). Call after the host model is fully set up.
 * What callers read on the host stays valid: losses and mean_loss after a forward pass, router
 * gradients after a backward pass, group distributions through model_groups; logits stay on the
 * device. Only router training (GRAD_ROUTER) runs on a GPU. Fatal with a one-line message when
 * the device was not built in or cannot be used here. */
void model_place(Model* m, const char* device);
/* 1 when model_place(m, device) would work on this machine, else 0 and *why says why not. */
int model_device_usable(const char* device, const char** why);

/* The router update, where the model runs, after the backward passes of accum micro-batches:
 * model_router_grad_norm divides the first n router gradients by accum and returns their global
 * L2 norm; model_router_adamw scales them to norm clip when above it (clip > 0) and takes one
 * AdamW step on the first opt->n router parameters (the host copy is updated);
 * model_router_adamw_sync brings the moments into opt (before a checkpoint is written). */
double model_router_grad_norm(Model* m, size_t n, int accum);
void model_router_adamw(Model* m, AdamW* opt, float lr, double gnorm, float clip, int accum);
void model_router_adamw_sync(Model* m, AdamW* opt);
/* After a step: the first n router values move by the share rate (at most 1) of their way to
 * center (the anchor of train_anchor_step); on a device, its copy too. */
void model_router_pull(Model* m, const real* center, size_t n, real rate);

/* The rows of logits a forward pass holds at once: all B T, or for an evaluation pass (keep = 0)
 * whose logits would pass 4 GiB (Gemma's 262,144-token vocabulary at 8K tokens and beyond) a
 * chunk of rows at a time, the head and the loss computed chunk by chunk (model_logits then
 * holds the last chunk's; losses, row_max and row_target every row's). */
size_t model_head_rows(const ModelConfig* c, size_t BT, int keep);
/* Tests: the logits (in reals) above which an evaluation pass goes chunk by chunk (0: 2^30). */
void model_set_head_limit(size_t reals);
/* Logits of the last forward: (B, T, V), valid until the next backward. */
static inline const real* model_logits(const Model* m) { return m->acts.logits; }
/* Group distributions of layer l from the last forward: (B, T, K). */
const real* model_groups(const Model* m, int l);

#endif
