/* config.c: named model configurations and the settings engine (settings.h, model.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "model.h"

#define MODEL_ROW(sec, nm, ty, fld, def, lo, hi, fl, hp) \
    {#sec,                                               \
     #nm,                                                \
     SETTING_##ty,                                       \
     offsetof(ModelConfig, fld),                         \
     sizeof(((ModelConfig*)0)->fld),                     \
     def,                                                \
     lo,                                                 \
     hi,                                                 \
     fl,                                                 \
     hp},
#define FOCUS_ROW(sec, nm, ty, fld, def, lo, hi, fl, hp) \
    {#sec,                                               \
     #nm,                                                \
     SETTING_##ty,                                       \
     offsetof(FocusConfig, fld),                         \
     sizeof(((FocusConfig*)0)->fld),                     \
     def,                                                \
     lo,                                                 \
     hi,                                                 \
     fl,                                                 \
     hp},
const Setting model_settings[] = {MODEL_SETTINGS(MODEL_ROW)};
const Setting focus_settings[] = {FOCUS_SETTINGS(FOCUS_ROW)};
const int model_settings_count = sizeof model_settings / sizeof model_settings[0];
const int focus_settings_count = sizeof focus_settings / sizeof focus_settings[0];

/* The named shapes: published configurations (real weights come from files; these shapes serve
 * benchmarks with random weights) and tiny ones for tests. */
typedef struct {
    const char* name;
    ModelConfig cfg;
} Preset;

#define GPT2(L_, C_, NH_, F_, V_, T_)                                                             \
    {                                                                                             \
        .arch = ARCH_GPT2, .L = L_, .C = C_, .NH = NH_, .NKV = NH_, .F = F_, .V = V_, .maxT = T_, \
        .eps = 1e-5f, .tied = 1                                                                   \
    }
#define LLAMA(L_, C_, NH_, NKV_, F_, V_, T_, theta, tied_)                              \
    {                                                                                   \
        .arch = ARCH_LLAMA, .L = L_, .C = C_, .NH = NH_, .NKV = NKV_, .F = F_, .V = V_, \
        .maxT = T_, .eps = 1e-5f, .rope_theta = theta, .tied = tied_                    \
    }

static const Preset presets[] = {
    {"gpt2-124m", GPT2(12, 768, 12, 3072, 50257, 1024)},
    {"smollm2-135m", LLAMA(30, 576, 9, 3, 1536, 49152, 8192, 100000.0f, 1)},
    {"gemma3-270m",
     {.arch = ARCH_GEMMA3,
      .L = 18,
      .C = 640,
      .NH = 4,
      .NKV = 1,
      .F = 2048,
      .V = 262144,
      .maxT = 32768,
      .eps = 1e-6f,
      .rope_theta = 1e6f,
      .tied = 1,
      .hs = 256,
      .swa = 512,
      .swa_period = 6,
      .rope_local = 1e4f}},
    {"llama2-7b", LLAMA(32, 4096, 32, 32, 11008, 32000, 4096, 10000.0f, 0)},
    {"llama2-13b", LLAMA(40, 5120, 40, 40, 13824, 32000, 4096, 10000.0f, 0)},
    {"llama2-70b", LLAMA(80, 8192, 64, 8, 28672, 32000, 4096, 10000.0f, 0)},
    {"mistral-7b", LLAMA(32, 4096, 32, 8, 14336, 32000, 32768, 10000.0f, 0)},
    {"qwen2.5-7b",
     {.arch = ARCH_LLAMA,
      .L = 28,
      .C = 3584,
      .NH = 28,
      .NKV = 4,
      .F = 18944,
      .V = 152064,
      .maxT = 32768,
      .eps = 1e-6f,
      .rope_theta = 1e6f,
      .qkv_bias = 1}},
    {"llama3-8b", LLAMA(32, 4096, 32, 8, 14336, 128256, 8192, 500000.0f, 0)},
    {"tiny-gpt2", GPT2(2, 32, 4, 128, 64, 64)},
    {"tiny-llama", LLAMA(2, 32, 4, 2, 96, 64, 64, 10000.0f, 0)},
    /* three layers: local, global (swa_period 2), local; head size 16 = 2 C / NH; window 6 */
    {"tiny-gemma3",
     {.arch = ARCH_GEMMA3,
      .L = 3,
      .C = 32,
      .NH = 4,
      .NKV = 2,
      .F = 96,
      .V = 64,
      .maxT = 64,
      .eps = 1e-6f,
      .rope_theta = 1e6f,
      .tied = 1,
      .hs = 16,
      .swa = 6,
      .swa_period = 2,
      .rope_local = 1e4f}},
};

int model_config_preset(const char* name, ModelConfig* c) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        if (strcmp(name, presets[i].name)) continue;
        *c = presets[i].cfg;
        return 0;
    }
    memset(c, 0, sizeof(*c));
    return -1;
}

void focus_config_default(FocusConfig* fc) {
    memset(fc, 0, sizeof *fc);
    settings_defaults(focus_settings, focus_settings_count, fc);
}

/* An integer in [lo, hi]; no wrap-around (strtoll's ERANGE, then the range). */
static int parse_int(const char* v, int* out, double lo, double hi) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE || (double)x < lo || (double)x > hi) return -2;
    *out = (int)x;
    return 0;
}

/* A float setting is stored as a float: its value and its bounds are compared as floats, so
 * the printed bound itself (tau from 0.0001) is accepted, here and when rows_check reads the
 * stored value back. */
static int float_in(double x, double lo, double hi) {
    return isfinite(x) && (float)x >= (float)lo && (float)x <= (float)hi;
}

static int parse_float(const char* v, float* out, double lo, double hi) {
    char* end;
    double x = strtod(v, &end);
    if (end == v || *end || !float_in(x, lo, hi)) return -2;
    *out = (float)x;
    return 0;
}

/* The shortest decimal form that reads back as the same float (0.001, not 0.00100000005). */
static void format_float(char* buf, size_t n, float x) {
    if (x == (float)(long long)x && fabsf(x) < 1e15f) { /* 10000, not 1e+04 */
        snprintf(buf, n, "%lld", (long long)x);
        return;
    }
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, n, "%.*g", prec, (double)x);
        if ((float)strtod(buf, NULL) == x) return;
    }
}

/* "2": a fixed budget; "p0.9": groups until 90 % of G_i; "p0.9:2": the same, at most 2. The
 * budget and the cap are in [lo, hi]. */
/* A budget: a count n ("k"), or a share p with at most n ("pP:k") or no limit ("pP", n = 0) */
static int parse_topk(const char* v, int* n, float* share, double lo, double hi) {
    if (v[0] != 'p') {
        *share = 0;
        return parse_int(v, n, lo, hi);
    }
    char* end;
    double p = strtod(v + 1, &end);
    if (end == v + 1 || !(p > 0 && p <= 1)) return -2;
    int cap = 0;
    if (*end == ':') {
        if (parse_int(end + 1, &cap, lo, hi)) return -2;
    } else if (*end) {
        return -2;
    }
    *share = (float)p;
    *n = cap;
    return 0;
}
/* the share lies right after its count in FocusConfig */
_Static_assert(offsetof(FocusConfig, topp) == offsetof(FocusConfig, topk) + sizeof(int) &&
                   offsetof(FocusConfig, blocks_p) == offsetof(FocusConfig, blocks) + sizeof(int),
               "a budget's share follows its count");

/* "none", or layer indices and ranges: "0,1,28-29" */
static int parse_layers(const char* v, uint64_t* bits) {
    memset(bits, 0, 4 * sizeof(uint64_t));
    if (!strcmp(v, "none") || !*v) return 0;
    const char* q = v;
    while (*q) {
        char* end;
        long a = strtol(q, &end, 10), b = a;
        if (end == q || a < 0 || a > 255) return -2;
        if (*end == '-') {
            q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q || b < a || b > 255) return -2;
        }
        for (long l = a; l <= b; l++) bits[l >> 6] |= 1ull << (l & 63);
        if (*end == ',')
            end++;
        else if (*end)
            return -2;
        q = end;
    }
    return 0;
}

/* A text value that a settings file can carry and give back unchanged (the run text written to
 * config.conf and router.h5 is read again on --resume): no control characters, no leading or
 * trailing blanks, no " ;" and no leading ";" (an INI comment once written after "key = "). */
static int text_value_ok(const char* v) {
    size_t n = strlen(v);
    if (n && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[n - 1]) || v[0] == ';'))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (c < 0x20 || c == 0x7f) return 0;
        if (c == ';' && i && isspace((unsigned char)v[i - 1])) return 0;
    }
    return 1;
}

/* index of v in names[0..n), or -1 */
static int word_index(const char* v, const char* const* names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) return i;
    return -1;
}

static const char* const arch_names[] = {"gpt2", "llama", "gemma3"};
static const char* const objective_names[] = {"lm", "kl", "attn", "kl+attn", "mass"};
static const char* const local_names[] = {"window", "route", "dense"};

int setting_parse(const Setting* s, void* base, const char* v) {
    void* field = (char*)base + s->offset;
    int i;
    switch (s->type) {
        case SETTING_INT:
            return parse_int(v, field, s->lo, s->hi);
        case SETTING_FLOAT:
            return parse_float(v, field, s->lo, s->hi);
        case SETTING_U64: {
            char* end;
            errno = 0;
            unsigned long long x = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-' || errno == ERANGE) return -2;
            *(uint64_t*)field = x;
            return 0;
        }
        case SETTING_STR:
        case SETTING_OBJECTIVE:
            if (strlen(v) >= s->size || strlen(v) > SETTING_TEXT_MAX || !text_value_ok(v))
                return -2;
            if (s->type == SETTING_OBJECTIVE &&
                word_index(v, objective_names,
                           (int)(sizeof objective_names / sizeof *objective_names)) < 0)
                return -2;
            strcpy(field, v);
            return 0;
        case SETTING_ARCH:
            if ((i = word_index(v, arch_names, 3)) < 0) return -2;
            *(Arch*)field = (Arch)i;
            return 0;
        case SETTING_ATTN: {
            const AttnMethod* a = attn_method_named(v, strlen(v));
            if (!a) return -2;
            *(AttnMode*)field = a->mode;
            return 0;
        }
        case SETTING_ROUTING:
            return routing_parse(v, field) ? -2 : 0;
        case SETTING_LOCAL:
            if ((i = word_index(v, local_names, 3)) < 0) return -2;
            *(LocalLayers*)field = (LocalLayers)i;
            return 0;
        case SETTING_TOPK:
            return parse_topk(v, field, (float*)((char*)field + sizeof(int)), s->lo, s->hi);
        case SETTING_LAYERS:
            return parse_layers(v, field);
    }
    return -2;
}

const char* setting_format(const Setting* s, const void* base, int exact, char* buf, size_t n) {
    const void* field = (const char*)base + s->offset;
    switch (s->type) {
        case SETTING_INT:
            snprintf(buf, n, "%d", *(const int*)field);
            break;
        case SETTING_FLOAT:
            if (exact)
                format_float(buf, n, *(const float*)field);
            else
                snprintf(buf, n, "%g", (double)*(const float*)field);
            break;
        case SETTING_U64:
            snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t*)field);
            break;
        case SETTING_STR:
        case SETTING_OBJECTIVE:
            snprintf(buf, n, "%s", (const char*)field);
            break;
        case SETTING_ARCH:
            snprintf(buf, n, "%s", arch_names[*(const Arch*)field]);
            break;
        case SETTING_ATTN:
            snprintf(buf, n, "%s", attn_methods[*(const AttnMode*)field]->name);
            break;
        case SETTING_ROUTING:
            snprintf(buf, n, "%s", routing_name(*(const Routing*)field));
            break;
        case SETTING_LOCAL:
            snprintf(buf, n, "%s", local_names[*(const LocalLayers*)field]);
            break;
        case SETTING_TOPK: {
            char t[32];
            snprintf(buf, n, "%s",
                     budget_str(*(const int*)field,
                                *(const float*)((const char*)field + sizeof(int)), t));
            break;
        }
        case SETTING_LAYERS: {
            FocusConfig f;
            memcpy(f.dense_layers, field, sizeof f.dense_layers);
            focus_dense_layers_str(&f, buf, n);
            break;
        }
    }
    return buf;
}

const char* setting_expect(const Setting* s, char* buf, size_t n) {
    switch (s->type) {
        case SETTING_INT:
        case SETTING_U64:
            snprintf(buf, n, "an integer from %.17g to %.17g", s->lo, s->hi);
            break;
        case SETTING_FLOAT:
            snprintf(buf, n, "a number from %g to %g", s->lo, s->hi);
            break;
        case SETTING_STR:
            snprintf(buf, n, "text of at most %zu bytes, no control characters",
                     s->size - 1 < SETTING_TEXT_MAX ? s->size - 1 : (size_t)SETTING_TEXT_MAX);
            break;
        case SETTING_OBJECTIVE:
            snprintf(buf, n, "one of lm, kl, attn, kl+attn, mass");
            break;
        case SETTING_ARCH:
            snprintf(buf, n, "one of gpt2, llama, gemma3");
            break;
        case SETTING_ATTN: {
            char names[256];
            snprintf(buf, n, "one of %s", attn_method_list(names, sizeof names, ", "));
        } break;
        case SETTING_ROUTING:
            snprintf(buf, n, "one of sinkhorn, causal, prefix_sinkhorn");
            break;
        case SETTING_LOCAL:
            snprintf(buf, n, "one of window, route, dense");
            break;
        case SETTING_TOPK:
            snprintf(buf, n, "N, pP or pP:N with N from %g to %g and 0 < P <= 1", s->lo, s->hi);
            break;
        case SETTING_LAYERS:
            snprintf(buf, n, "none, or layers and ranges from 0 to 255 (0,1,28-29)");
            break;
    }
    return buf;
}

const Setting* setting_find(const Setting* rows, int n, const char* name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].name, name)) return &rows[i];
    return NULL;
}

void settings_defaults(const Setting* rows, int n, void* base) {
    for (int i = 0; i < n; i++)
        if (rows[i].def && setting_parse(&rows[i], base, rows[i].def))
            fatal("internal: the default '%s' of setting %s does not parse", rows[i].def,
                  rows[i].name);
}

void settings_write(FILE* f, const Setting* rows, int n, const void* base, const char* section) {
    char buf[1100];
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].section, section) && !(rows[i].flags & SET_EVAL))
            fprintf(f, "%s = %s\n", rows[i].name,
                    setting_format(&rows[i], base, 1, buf, sizeof buf));
}

void settings_help(FILE* f, const Setting* rows, int n) {
    for (int i = 0; i < n; i++)
        fprintf(f, "  %-8s %-16s %-10s %s%s\n", rows[i].section, rows[i].name,
                rows[i].def ? rows[i].def : "(model)", rows[i].help,
                rows[i].flags & SET_ROUTER ? " [stored with the router]" : "");
}

const Setting* config_find(const char* key) {
    const Setting* s = setting_find(model_settings, model_settings_count, key);
    return s ? s : setting_find(focus_settings, focus_settings_count, key);
}

const char* config_split_setting(const char* kv, char* key, size_t keycap) {
    const char* eq = strchr(kv, '=');
    if (!eq) fatal("--set expects key=value, got '%s'", kv);
    size_t n = (size_t)(eq - kv);
    if (n >= keycap) fatal("--set: key too long in '%s'", kv);
    memcpy(key, kv, n);
    key[n] = 0;
    return eq + 1;
}

int config_set(ModelConfig* c, FocusConfig* f, const char* key, const char* v) {
    const Setting* s = setting_find(model_settings, model_settings_count, key);
    if (s) return setting_parse(s, c, v);
    s = setting_find(focus_settings, focus_settings_count, key);
    if (s) return setting_parse(s, f, v);
    return -1;
}

/* The first numeric field of rows[0..n) in the struct at base outside its declared range (or not
 * finite), described in err; 0 when all are in range. */
static int rows_check(const Setting* rows, int n, const void* base, const char* what, char* err,
                      size_t errlen) {
    for (int i = 0; i < n; i++) {
        const Setting* r = &rows[i];
        const void* field = (const char*)base + r->offset;
        double v;
        if (r->type == SETTING_INT)
            v = *(const int*)field;
        else if (r->type == SETTING_FLOAT)
            v = *(const float*)field;
        else
            continue;
        if (r->type == SETTING_FLOAT ? !float_in(v, r->lo, r->hi) : !(v >= r->lo && v <= r->hi)) {
            char w[96];
            snprintf(err, errlen, "%s: %s = %.9g is out of range (expected %s)", what, r->name, v,
                     setting_expect(r, w, sizeof w));
            return -1;
        }
    }
    return 0;
}

int model_tp_check(const ModelConfig* c, int tp, char* err, size_t n) {
    if (tp < 1) return snprintf(err, n, "tensor parallelism: tp=%d must be at least 1", tp), -1;
    if (c->NH % tp)
        return snprintf(err, n,
                        "tensor parallelism: tp=%d does not divide the model's %d attention heads",
                        tp, c->NH),
               -1;
    if (c->F % tp)
        return snprintf(err, n,
                        "tensor parallelism: tp=%d does not divide the feed-forward width F=%d", tp,
                        c->F),
               -1;
    return 0;
}

int model_config_check(const ModelConfig* c, char* err, size_t n) {
    if (rows_check(model_settings, model_settings_count, c, "model config", err, n)) return -1;
    if (c->V < 2) return snprintf(err, n, "model config: V = %d, fewer than 2 tokens", c->V), -1;
    if (!c->hs && c->C % c->NH)
        return snprintf(err, n, "model config: C=%d is not a multiple of NH=%d", c->C, c->NH), -1;
    if (c->arch != ARCH_GEMMA3 && (c->swa || c->swa_period || c->rope_local))
        return snprintf(err, n, "model config: swa, swa_period and rope_local are gemma3 settings"),
               -1;
    if (c->NH % c->NKV)
        return snprintf(err, n, "model config: NH=%d is not a multiple of NKV=%d", c->NH, c->NKV),
               -1;
    if (c->arch == ARCH_GPT2 && c->NKV != c->NH)
        return snprintf(err, n, "model config: gpt2 has no grouped-query attention (NKV=%d, NH=%d)",
                        c->NKV, c->NH),
               -1;
    if (c->arch != ARCH_GPT2 && (model_head_size(c) % 2))
        return snprintf(err, n, "model config: RoPE needs an even head size (got %d)",
                        model_head_size(c)),
               -1;
    if (c->arch == ARCH_GEMMA3 && c->swa_period && !(c->rope_local >= 1))
        return snprintf(err, n, "model config: rope_local = %g; a rotary base must be at least 1",
                        (double)c->rope_local),
               -1;
    if (c->arch == ARCH_GEMMA3 && c->swa_period && c->swa < 1)
        return snprintf(err, n, "model config: swa_period = %d needs a sliding window (swa = 0)",
                        c->swa_period),
               -1;
    if (c->arch == ARCH_GEMMA3 && c->swa >= c->maxT)
        return snprintf(err, n,
                        "model config: swa = %d: the sliding window is not shorter than the "
                        "context (%d)",
                        c->swa, c->maxT),
               -1;
    if (c->arch != ARCH_GPT2 && !(c->rope_theta >= 1))
        return snprintf(err, n, "model config: rope_theta = %g; a rotary base must be at least 1",
                        (double)c->rope_theta),
               -1;
    if (c->tp > 1 && model_tp_check(c, c->tp, err, n)) return -1;
    if (c->tp_rank < 0 || c->tp_rank >= model_tp(c))
        return snprintf(err, n, "model config: slice %d of %d tensor-parallel slices", c->tp_rank,
                        model_tp(c)),
               -1;
    if (!(c->eps > 0))
        return snprintf(err, n, "model config: eps = %g; a norm epsilon must be positive",
                        (double)c->eps),
               -1;
    return 0;
}

void config_validate(const ModelConfig* c, const FocusConfig* f) {
    char err[512];
    if (model_config_check(c, err, sizeof err) ||
        rows_check(focus_settings, focus_settings_count, f, "focus config", err, sizeof err))
        fatal("%s", err);
    if (f->K < 1 || f->K > 32) fatal("focus config: K=%d must be in 1..32", f->K);
    if (f->dg < 1) fatal("focus config: dg=%d must be positive", f->dg);
    if (f->iters < 1) fatal("focus config: iters=%d must be at least 1", f->iters);
    if (f->w < 0) fatal("focus config: window w=%d must be >= 0", f->w);
    if (f->topp > 0 ? (f->topk < 0 || f->topk > f->K) : (f->topk < 1 || f->topk > f->K))
        fatal("focus config: topk=%d must be in 1..K=%d", f->topk, f->K);
    if (!(f->topp >= 0 && f->topp <= 1))
        fatal("focus config: topk=p%g: the share must be in (0, 1]", (double)f->topp);
    if (f->sinks < 0) fatal("focus config: sinks=%d must be >= 0", f->sinks);
    for (int l = c->L; l < 256; l++)
        if (focus_layer_dense(f, l))
            fatal("focus config: dense_layers names layer %d, but the model has %d (0..%d)", l,
                  c->L, c->L - 1);
    if (!(f->tau > 0)) fatal("focus config: tau=%g must be positive", (double)f->tau);
}

const char* budget_str(int n, float p, char* buf) {
    if (p > 0 && n > 0)
        snprintf(buf, 32, "p%g:%d", (double)p, n);
    else if (p > 0)
        snprintf(buf, 32, "p%g", (double)p);
    else
        snprintf(buf, 32, "%d", n);
    return buf;
}

const char* focus_topk_str(const FocusConfig* f, char* buf) {
    return budget_str(f->topk, f->topp, buf);
}

const char* focus_dense_layers_str(const FocusConfig* f, char* buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int l = 0; l < 256 && at + 8 < n; l++)
        if (focus_layer_dense(f, l)) at += (size_t)snprintf(buf + at, n - at, at ? ",%d" : "%d", l);
    if (!at) snprintf(buf, n, "none");
    return buf;
}

void config_print(const ModelConfig* c, const FocusConfig* f, FILE* o) {
    char buf[1100];
    fprintf(o, "+-----------------+----------------------+\n");
    for (int i = 0; i < model_settings_count; i++)
        fprintf(o, "| %-15s | %-20s |\n", model_settings[i].name,
                setting_format(&model_settings[i], c, 0, buf, sizeof buf));
    for (int i = 0; i < focus_settings_count; i++)
        fprintf(o, "| %-15s | %-20s |\n", focus_settings[i].name,
                setting_format(&focus_settings[i], f, 0, buf, sizeof buf));
    fprintf(o, "+-----------------+----------------------+\n");
}
