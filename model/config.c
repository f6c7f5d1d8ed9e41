/* config.c: named model configurations and the settings engine (settings.h, model.h). */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "model.h"

#define MODEL_ROW(sec, nm, ty, fld, def, fl, hp)                                               \
    {#sec, #nm, SETTING_##ty, offsetof(ModelConfig, fld), sizeof(((ModelConfig*)0)->fld), def, \
     fl,   hp},
#define FOCUS_ROW(sec, nm, ty, fld, def, fl, hp)                                               \
    {#sec, #nm, SETTING_##ty, offsetof(FocusConfig, fld), sizeof(((FocusConfig*)0)->fld), def, \
     fl,   hp},
const Setting model_settings[] = {MODEL_SETTINGS(MODEL_ROW)};
const Setting focus_settings[] = {FOCUS_SETTINGS(FOCUS_ROW)};
const int model_settings_count = sizeof model_settings / sizeof model_settings[0];
const int focus_settings_count = sizeof focus_settings / sizeof focus_settings[0];

int model_config_preset(const char* name, ModelConfig* c) {
    memset(c, 0, sizeof(*c));
    c->eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->tied = 1;
    if (!strcmp(name, "gpt2-124m")) {
        *c = (ModelConfig){ARCH_GPT2, 12, 768, 12, 12, 3072, 50257, 1024, 1e-5f, 0, 0, 1};
    } else if (!strcmp(name, "smollm2-135m")) {
        *c = (ModelConfig){ARCH_LLAMA, 30, 576, 9, 3, 1536, 49152, 8192, 1e-5f, 100000.0f, 0, 1};
    } else if (!strcmp(name, "tiny-gpt2")) {
        *c = (ModelConfig){ARCH_GPT2, 2, 32, 4, 4, 128, 64, 64, 1e-5f, 0, 0, 1};
    } else if (!strcmp(name, "tiny-llama")) {
        *c = (ModelConfig){ARCH_LLAMA, 2, 32, 4, 2, 96, 64, 64, 1e-5f, 10000.0f, 0, 0};
    } else {
        return -1;
    }
    return 0;
}

void focus_config_default(FocusConfig* fc) {
    memset(fc, 0, sizeof *fc);
    settings_defaults(focus_settings, focus_settings_count, fc);
}

static int parse_int(const char* v, int* out) {
    char* end;
    long x = strtol(v, &end, 10);
    if (end == v || *end) return -2;
    *out = (int)x;
    return 0;
}

static int parse_float(const char* v, float* out) {
    char* end;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x)) return -2;
    *out = (float)x;
    return 0;
}

/* "2": a fixed budget; "p0.9": groups until 90 % of G_i; "p0.9:2": the same, at most 2 */
static int parse_topk(const char* v, FocusConfig* f) {
    if (v[0] != 'p') {
        f->topp = 0;
        return parse_int(v, &f->topk);
    }
    char* end;
    double p = strtod(v + 1, &end);
    if (end == v + 1 || !(p > 0 && p <= 1)) return -2;
    int cap = 0;
    if (*end == ':') {
        if (parse_int(end + 1, &cap) || cap < 1) return -2;
    } else if (*end) {
        return -2;
    }
    f->topp = (float)p;
    f->topk = cap;
    return 0;
}

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

/* index of v in names[0..n), or -1 */
static int word_index(const char* v, const char* const* names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) return i;
    return -1;
}

static const char* const arch_names[] = {"gpt2", "llama"};
static const char* const attn_names[] = {"dense", "soft", "hard"};
static const char* const objective_names[] = {"lm", "kl", "attn", "kl+attn"};

int setting_parse(const Setting* s, void* base, const char* v) {
    void* field = (char*)base + s->offset;
    int i;
    switch (s->type) {
        case SETTING_INT:
            return parse_int(v, field);
        case SETTING_FLOAT:
            return parse_float(v, field);
        case SETTING_U64: {
            char* end;
            unsigned long long x = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-') return -2;
            *(uint64_t*)field = x;
            return 0;
        }
        case SETTING_STR:
        case SETTING_OBJECTIVE:
            if (strlen(v) >= s->size) return -2;
            if (s->type == SETTING_OBJECTIVE && word_index(v, objective_names, 4) < 0) return -2;
            strcpy(field, v);
            return 0;
        case SETTING_ARCH:
            if ((i = word_index(v, arch_names, 2)) < 0) return -2;
            *(Arch*)field = (Arch)i;
            return 0;
        case SETTING_ATTN:
            if ((i = word_index(v, attn_names, 3)) < 0) return -2;
            *(AttnMode*)field = (AttnMode)i;
            return 0;
        case SETTING_ROUTING:
            return routing_parse(v, field) ? -2 : 0;
        case SETTING_TOPK:
            return parse_topk(v, (FocusConfig*)((char*)field - offsetof(FocusConfig, topk)));
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
            snprintf(buf, n, exact ? "%.9g" : "%g", (double)*(const float*)field);
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
            snprintf(buf, n, "%s", attn_names[*(const AttnMode*)field]);
            break;
        case SETTING_ROUTING:
            snprintf(buf, n, "%s", routing_name(*(const Routing*)field));
            break;
        case SETTING_TOPK: {
            char t[32];
            snprintf(
                buf, n, "%s",
                focus_topk_str(
                    (const FocusConfig*)((const char*)field - offsetof(FocusConfig, topk)), t));
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

int config_set(ModelConfig* c, FocusConfig* f, const char* key, const char* v) {
    const Setting* s = setting_find(model_settings, model_settings_count, key);
    if (s) return setting_parse(s, c, v);
    s = setting_find(focus_settings, focus_settings_count, key);
    if (s) return setting_parse(s, f, v);
    return -1;
}

void config_validate(const ModelConfig* c, const FocusConfig* f) {
    if (c->L < 1 || c->C < 1 || c->NH < 1 || c->NKV < 1 || c->F < 1 || c->V < 2 || c->maxT < 1)
        fatal(
            "model config: L, C, NH, NKV, F, V and maxT must be positive (got L=%d C=%d NH=%d "
            "NKV=%d F=%d V=%d maxT=%d)",
            c->L, c->C, c->NH, c->NKV, c->F, c->V, c->maxT);
    if (c->C % c->NH) fatal("model config: C=%d is not a multiple of NH=%d", c->C, c->NH);
    if (c->NH % c->NKV) fatal("model config: NH=%d is not a multiple of NKV=%d", c->NH, c->NKV);
    if (c->arch == ARCH_GPT2 && c->NKV != c->NH)
        fatal("model config: gpt2 has no grouped-query attention (NKV=%d, NH=%d)", c->NKV, c->NH);
    if (c->arch == ARCH_LLAMA && ((c->C / c->NH) % 2))
        fatal("model config: RoPE needs an even head size (got %d)", c->C / c->NH);
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

const char* focus_topk_str(const FocusConfig* f, char* buf) {
    if (f->topp > 0 && f->topk > 0)
        snprintf(buf, 32, "p%g:%d", (double)f->topp, f->topk);
    else if (f->topp > 0)
        snprintf(buf, 32, "p%g", (double)f->topp);
    else
        snprintf(buf, 32, "%d", f->topk);
    return buf;
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
