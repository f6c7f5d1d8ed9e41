/* cli.c: what every command of the `focus` binary shares: option values, --set and --device,
 * loading a model and a router for a command, evaluation modes (see cli.h). */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../checkpoints/lora_h5.h"
#include "../checkpoints/blockgate_h5.h"
#include "../checkpoints/router_h5.h"
#include "../io/io.h"

const char* cli_value(int argc, char** argv, int i) {
    if (i + 1 >= argc) fatal("option %s needs a value", argv[i]);
    return argv[i + 1];
}

/* Words for a range in messages: "an integer from 1 to 32", "a number from 0 to 1". */
static const char* range_words(char kind, double lo, double hi, char* buf, size_t n) {
    snprintf(buf, n, "%s from %.9g to %.9g", kind == 'i' ? "an integer" : "a number", lo, hi);
    return buf;
}

long long cli_int_range(const char* opt, const char* v, long long lo, long long hi) {
    char* end;
    char w[96];
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi)
        fatal("option %s expects %s, got '%s'", opt,
              range_words('i', (double)lo, (double)hi, w, sizeof w), v);
    return x;
}

int cli_int(const char* opt, const char* v) { return (int)cli_int_range(opt, v, 0, INT_MAX); }

double cli_float_range(const char* opt, const char* v, double lo, double hi) {
    char* end;
    char w[96];
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || x < lo || x > hi)
        fatal("option %s expects %s, got '%s'", opt, range_words('x', lo, hi, w, sizeof w), v);
    return x;
}

double cli_float(const char* opt, const char* v) {
    return cli_float_range(opt, v, -HUGE_VAL, HUGE_VAL);
}

void cli_apply_set(ModelConfig* cfg, FocusConfig* fc, const char* kv) {
    char key[128];
    const char* value = config_split_setting(kv, key, sizeof key);
    int r = config_set(cfg, fc, key, value);
    if (r == -1) fatal("--set: unknown setting '%s'", key);
    char w[96];
    if (r == -2)
        fatal("--set: bad value '%s' for setting '%s' (expected %s)", value, key,
              setting_expect(config_find(key), w, sizeof w));
}

FocusConfig cli_serving_focus(void) {
    FocusConfig fc;
    focus_config_default(&fc);
    fc.attn = ATTN_DENSE;
    fc.routing = ROUTE_CAUSAL;
    return fc;
}

int cli_device(const char* v) {
    const char* why;
    if (!model_device_usable(v, &why)) fatal("--device %s: %s", v, why);
    return strcmp(v, "cpu") != 0;
}

/* A token router's stored settings (SET_ROUTER in settings.h) and weights onto m; keep_band:
 * its w and sinks are not read (a block selector's band stays). */
static void load_token_router(Model* m, const char* router, int keep_band) {
    FocusConfig* f = &m->fc;
    char* text = router_read_config(router);
    /* a router stored without sinks or dense_layers was trained before they existed: none */
    if (!keep_band) f->sinks = 0;
    memset(f->dense_layers, 0, sizeof f->dense_layers);
    for (char* line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char key[64], val[256];
        if (sscanf(line, " %63[^= ] = %255s", key, val) != 2) continue;
        if (keep_band && (!strcmp(key, "w") || !strcmp(key, "sinks"))) continue;
        const Setting* st = setting_find(focus_settings, focus_settings_count, key);
        if (st && st->flags & SET_ROUTER && setting_parse(st, f, val))
            fatal("%s: stored setting %s = %s is not valid", router, key, val);
    }
    free(text);
    model_set_router_config(m, f);
    router_load(router, m, NULL, NULL, model_fingerprint(m));
}

/* Apply --router/--attn/--topk/--routing to a loaded model. Reads K and dg from the run's
 * config.conf next to router.h5 when there is one (the router's shape). --router
 * SELECTOR.h5,ROUTER.h5: a block selector and a token router whose groups join its blocks. */
void apply_router_options(Model* m, const char* router, const char* attn, const char* topk,
                          const char* routing) {
    FocusConfig* f = &m->fc;
    char pair[4096];
    const char* groups = NULL;
    if (router && strchr(router, ',')) {
        if (strlen(router) >= sizeof pair) fatal("--router: '%.40s...' is too long", router);
        strcpy(pair, router);
        char* comma = strchr(pair, ',');
        *comma = 0;
        router = pair, groups = comma + 1;
        if (!blockgate_file(router))
            fatal(
                "--router %s,%s: the first file must be a block selector (focus fit-blocks), the "
                "second a token router",
                router, groups);
        if (blockgate_file(groups) || strchr(groups, ','))
            fatal("--router %s,%s: the second file must be one token router (router.h5)", router,
                  groups);
    }
    if (router && blockgate_file(router)) {
        /* a block selector (focus fit-blocks): its block size and band, mode blocks_learned */
        BlockGateInfo bi;
        blockgate_load(router, m, &bi, model_fingerprint(m));
        f->block = bi.block, f->w = bi.w, f->sinks = bi.sinks;
        f->attn = ATTN_BLOCKS_LEARNED;
        router = NULL;
        if (groups) { /* the token router's groups beside the blocks, in the selector's band */
            load_token_router(m, groups, 1);
            m->method.with_groups = 1;
        }
    } else if (router) {
        load_token_router(m, router, 0);
        /* a router with a query projection has no soft gate: its default is hard top-k */
        f->attn = f->qproj ? ATTN_HARD : ATTN_SOFT;
    }
    if (attn) {
        if (config_set(&m->cfg, f, "attn", attn)) {
            char list[256];
            fatal("--attn must be one of %s, got '%s'", attn_method_list(list, sizeof list, ", "),
                  attn);
        }
        if (attn_uses_router(f->attn) && !router)
            fatal(
                "--attn %s needs --router router.h5 (window, random, blocks, blocks_mean and "
                "oracle need none)",
                attn);
        if (model_method(m)->needs == NEEDS_SELECTOR && !m->method.selector)
            fatal(
                "--attn blocks_learned needs --router SELECTOR.h5, a block selector of focus "
                "fit-blocks");
    }
    if (topk) {
        if (config_set(&m->cfg, f, "topk", topk))
            fatal(
                "--topk must be a group count (1..K) or pP / pP:k (a share of the group mass), "
                "got '%s'",
                topk);
        if (f->topk > f->K) fatal("--topk %s exceeds the router's K = %d", topk, f->K);
    }
    if (routing && routing_parse(routing, &f->routing))
        fatal("--routing must be causal, sinkhorn or prefix_sinkhorn, got '%s'", routing);
}

void cli_check_context(const Model* m, long n, const char* cmd, const char* what) {
    if (n > m->cfg.maxT)
        fatal("%s: %s is %ld tokens, more than the model's context of %d tokens", cmd, what, n,
              m->cfg.maxT);
}

int cli_parse(const char* cmd, int argc, char** argv, int first, const char* help, const char* spec,
              ...) {
    /* the spec's options and their destinations, in order */
    enum { MAXOPT = 32 };
    char names[MAXOPT][32], kinds[MAXOPT];
    double lo[MAXOPT], hi[MAXOPT];
    void* dst[MAXOPT];
    int n = 0;
    va_list ap;
    va_start(ap, spec);
    for (const char* p = spec; *p;) {
        while (*p == ' ') p++;
        if (!*p) break;
        const char* colon = strchr(p, ':');
        if (!colon || colon - p >= 32 || n == MAXOPT) fatal("internal: bad option spec '%s'", p);
        memcpy(names[n], p, (size_t)(colon - p));
        names[n][colon - p] = 0;
        kinds[n] = colon[1];
        /* integers default to [0, INT_MAX], numbers to any finite value */
        lo[n] = kinds[n] == 'i' ? 0 : -HUGE_VAL;
        hi[n] = kinds[n] == 'i' ? INT_MAX : HUGE_VAL;
        p = colon + 2;
        if (*p == '[') { /* a declared range: [lo,hi] */
            char* end;
            lo[n] = strtod(p + 1, &end);
            if (*end != ',') fatal("internal: bad range in option spec '%s'", colon);
            hi[n] = strtod(end + 1, &end);
            if (*end != ']') fatal("internal: bad range in option spec '%s'", colon);
            p = end + 1;
        }
        dst[n++] = va_arg(ap, void*);
    }
    va_end(ap);
    for (int i = first; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help, stdout);
            if (strstr(spec, "--attn:") || strstr(spec, "--modes:")) { /* from the table */
                printf("Attention methods (--attn NAME; in a list of modes NAME:BUDGET):\n");
                attn_methods_help(stdout, 0);
            }
            return 1;
        }
        const int positional = a[0] != '-' || !a[1];
        int k = 0;
        while (k < n && strcmp(names[k], positional ? "" : a)) k++;
        if (k == n) {
            if (positional)
                fatal("%s: unexpected argument '%s' (see focus %s --help)", cmd, a, cmd);
            fatal("%s: unknown option '%s' (see focus %s --help)", cmd, a, cmd);
        }
        if (kinds[k] == 'f') {
            *(int*)dst[k] = 1;
            continue;
        }
        const char* v = positional ? a : cli_value(argc, argv, i++);
        for (int o = 0; !positional && o < n; o++) /* `--tokenizer --data x`: a value forgotten */
            if (names[o][0] && !strcmp(v, names[o]))
                fatal("%s: option %s needs a value (the next argument is the option %s)", cmd, a,
                      v);
        if (kinds[k] == 's') {
            *(const char**)dst[k] = v;
        } else if (kinds[k] == 'i') {
            *(int*)dst[k] = (int)cli_int_range(a, v, (long long)lo[k], (long long)hi[k]);
        } else if (kinds[k] == 'x') {
            *(double*)dst[k] = cli_float_range(a, v, lo[k], hi[k]);
        } else if (kinds[k] == 'd') {
            *(int*)dst[k] = cli_device(v);
        } else if (kinds[k] == '*') {
            CliList* l = dst[k];
            l->v = reallocCheck(l->v, sizeof(char*) * (size_t)(l->n + 1));
            l->v[l->n++] = v;
        } else {
            fatal("internal: unknown option kind '%c' in '%s'", kinds[k], spec);
        }
    }
    return 0;
}

/* --set key=value on a loaded model: the model's own settings come from its file and the
 * router's shape from router.h5, so only the other Focus keys take effect (w, sinks, topk, ...) */
static void apply_focus_sets(Model* m, const char* model, const char* router, const CliList* sets) {
    for (int i = 0; sets && i < sets->n; i++) {
        ModelConfig from_file = m->cfg;
        FocusConfig want = m->fc;
        cli_apply_set(&from_file, &want, sets->v[i]);
        if (memcmp(&from_file, &m->cfg, sizeof from_file)) {
            char key[128];
            config_split_setting(sets->v[i], key, sizeof key);
            fatal("--set %s: %s is the model's own setting, decided by %s", sets->v[i], key, model);
        }
        if (want.K != m->fc.K || want.dg != m->fc.dg)
            fatal("--set %s: K and dg are the router's shape, fixed by %s", sets->v[i],
                  router ? router : "the model");
        config_validate(&m->cfg, &want);
        if (router && want.sinks != m->fc.sinks)
            fprintf(stderr,
                    "note: sinks = %d for this evaluation (the router was trained with %d)\n",
                    want.sinks, m->fc.sinks);
        m->fc = want;
    }
}

const char* cli_attention_desc(const Model* m, char* buf, size_t n) {
    model_method(m)->describe(m, buf, n);
    return buf;
}

/* The modes a method table row is spelt as in eval --modes: NAME, or NAME:BUDGET with a budget
 * setting (hard:k, window:W, blocks:N, ...), into buf */
static const char* mode_list(char* buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int a = 0; a < NUM_ATTN_METHODS && at < n; a++) {
        const AttnMethod* am = attn_methods[a];
        if (!am->setting) continue;
        at += (size_t)snprintf(buf + at, n - at, "%s%s%s%s%s", at ? ", " : "", am->name,
                               am->budget_arg ? ":" : "", am->budget_arg ? am->budget_arg : "",
                               am->needs == NEEDS_ROUTER     ? " (a token router)"
                               : am->needs == NEEDS_SELECTOR ? " (a block selector)"
                                                             : "");
    }
    return buf;
}

/* mode NAME or NAME:BUDGET of the method table (model/methods.c): the method, what it needs, its
 * budget setting */
static void set_mode_base(Model* m, const char* mode, int have_router) {
    const char* colon = strchr(mode, ':');
    const size_t n = colon ? (size_t)(colon - mode) : strlen(mode);
    const AttnMethod* am = attn_method_named(mode, n);
    /* the router's top-k needs its budget k (hard:k) */
    if (!am || (colon && !am->budget) || (!colon && am->masks == MASKS_ROUTER)) {
        char list[512];
        fatal("unknown mode '%s' (%s; a budget k or N may be pP or pP:k)", mode,
              mode_list(list, sizeof list));
    }
    if (am->needs == NEEDS_SELECTOR && !m->method.selector)
        fatal("mode %s needs --router SELECTOR.h5, a block selector of focus fit-blocks", mode);
    if (am->needs == NEEDS_ROUTER && !have_router) fatal("mode %s needs --router router.h5", mode);
    m->fc.attn = am->mode;
    if (!colon) return;
    if (am->masks == MASKS_ROUTER) { /* the router's groups: at most its K */
        if (config_set(&m->cfg, &m->fc, "topk", colon + 1) || m->fc.topk > m->fc.K)
            fatal("mode %s: the budget must be 1..K=%d groups or pP / pP:k", mode, m->fc.K);
        return;
    }
    if (config_set(&m->cfg, &m->fc, am->budget, colon + 1)) {
        char w[96];
        fatal("mode %s: %s must be %s", mode, am->budget,
              setting_expect(config_find(am->budget), w, sizeof w));
    }
    if (am->masks == MASKS_PATTERN && m->fc.topk > m->fc.K)
        fatal("mode %s: k exceeds K = %d", mode, m->fc.K);
}

void cli_set_mode(Model* m, const char* mode, int have_router) {
    if (m->method.selector)
        have_router = 0; /* --router gave a block selector, not a token router */
    char buf[256];
    if (strlen(mode) >= sizeof buf) fatal("mode '%.40s...' is too long", mode);
    strcpy(buf, mode);
    char* at = strchr(buf, '@');
    if (at) *at = 0;
    set_mode_base(m, buf, have_router);
    /* MODE@key=value@...: settings for this mode alone (hard:1@w=1024) */
    while (at) {
        char* kv = at + 1;
        at = strchr(kv, '@');
        if (at) *at = 0;
        char key[64];
        const char* v = config_split_setting(kv, key, sizeof key);
        if (!strcmp(key, "K") || !strcmp(key, "dg"))
            fatal("mode %s: %s is the router's shape, not a setting of one evaluation", mode, key);
        const Setting* st = config_find(key);
        if (!st) fatal("mode %s: unknown setting '%s'", mode, key);
        if (st < focus_settings || st >= focus_settings + focus_settings_count)
            fatal("mode %s: %s is the model's, not an attention setting", mode, key);
        char w[96];
        if (config_set(&m->cfg, &m->fc, key, v))
            fatal("mode %s: bad value '%s' for %s (expected %s)", mode, v, key,
                  setting_expect(st, w, sizeof w));
    }
}

/* Native weights on top of a fp32 load, as cli_open_model says for decoding (weights already
 * checked). */
static void set_native(Model* m, const char* model, const char* weights) {
    if (weights && !strcmp(weights, "f32")) return;
    char why[600];
    if (m->lora.rank) {
        if (weights) fatal("--weights native: LoRA adapters are merged into fp32 weights only");
        return;
    }
    if (!model_load_native(m, model, why, sizeof why)) return;
    if (weights) fatal("--weights native: %s: %s", model, why);
    fprintf(stderr, "decoding from fp32 weights (%s)\n", why);
}

/* For decoding: without a router and unless the weights are "f32", only the file's blocks; else
 * fp32 weights and the router, with the file's blocks on top where they serve. */
static void open_decoder(Model* m, ModelInfo* info, const ModelRequest* r) {
    FocusConfig fc = cli_serving_focus();
    const char* weights = r->weights;
    if (weights && strcmp(weights, "native") && strcmp(weights, "f32"))
        fatal("--weights must be native or f32, got '%s'", weights);
    char why[600];
    /* without a router nothing needs the fp32 weights: keep only the file's blocks */
    if (!r->router && !(weights && !strcmp(weights, "f32")) &&
        !model_load_lean(m, r->model, &fc, info, why, sizeof why)) {
        apply_router_options(m, NULL, r->attn, r->topk, "causal");
        return;
    }
    model_load(m, r->model, &fc, info);
    /* a token router decodes hard top-k by default, a block selector its blocks */
    const char* router = r->router;
    const char* kind =
        router && (strchr(router, ',') || blockgate_file(router)) ? "blocks_learned" : "hard";
    apply_router_options(m, router, router ? (r->attn ? r->attn : kind) : r->attn, r->topk,
                         "causal");
    set_native(m, r->model, weights);
    /* the router is checked against the fp32 weights: now the file's blocks suffice */
    model_drop_native_copies(m);
}

void cli_open_model(Model* m, ModelInfo* info, const ModelRequest* r) {
    if (r->decode) {
        open_decoder(m, info, r);
    } else {
        FocusConfig fc = cli_serving_focus();
        model_load(m, r->model, &fc, info);
        apply_router_options(m, r->router, r->attn, r->topk, r->routing);
    }
    if (r->lora) { /* after the router, whose base-model check reads the weights as loaded */
        lora_load(r->lora, m, model_fingerprint(m));
        const int rank = m->lora.rank;
        model_lora_merge(m);
        if (info) { /* every output names what it measured */
            size_t used = strlen(info->name);
            snprintf(info->name + used, sizeof info->name - used, " + LoRA %s (rank %d)", r->lora,
                     rank);
        }
    }
    apply_focus_sets(m, r->model, r->router, r->sets);
    if (!r->decode) model_place(m, r->device ? "cuda" : "cpu");
}
