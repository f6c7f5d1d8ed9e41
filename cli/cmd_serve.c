/* cmd_serve.c: `focus serve`, the OpenAI-compatible HTTP server (serve/serve.h) on a model loaded
 * for decoding (with a router: the group KV cache). Listens first (/health answers 503 while
 * the model loads), serves until SIGTERM or SIGINT, then finishes what runs and exits 0. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../checkpoints/load.h"
#include "../data/tokenizer.h"
#include "../io/gguf.h"
#include "../model/decode.h"
#include "../serve/serve.h"
#include "cli.h"
#include "commands.h"

static const char serve_usage[] =
    "usage: focus serve --model M [--tokenizer T] [--router router.h5 [--topk k] [--attn A]]\n"
    "                   [--host 127.0.0.1] [--port 8080] [--parallel 4] [--ctx N] [--queue 64]\n"
    "                   [--api-key KEY] [--alias NAME] [--chat-template chatml|gemma]\n"
    "                   [--kv f16|f32] [--weights native|f32] [--timeout 60] [--grace 10]\n"
    "                   [--max-body 4194304] [--max-connections 256] [--max-per-client 0]\n"
    "                   [--set key=value]...\n"
    "An OpenAI-compatible HTTP server: GET /health, GET /v1/models, POST /v1/completions,\n"
    "POST /v1/chat/completions (\"stream\": true for server-sent events), POST /tokenize,\n"
    "POST /detokenize, GET /metrics (Prometheus), GET /props, GET /slots. Sampling: temperature,\n"
    "top_p, top_k, min_p, seed, stop, logit_bias, frequency/presence/repeat penalties; logprobs.\n"
    "--parallel slots generate together, their\n"
    "decode steps batched through the weights; each slot has its own KV cache of --ctx tokens\n"
    "(default: the model's context; memory is used as tokens arrive), the group KV cache with\n"
    "--router (--set w=N and the other Focus keys as for eval; --attn window serves sinks + a\n"
    "sliding window without a router). A request whose prompt begins with a slot's cached tokens "
    "(a chat that goes on)\n"
    "evaluates only the rest (a prefix a prompt cached; the answer is the same bits either way).\n"
    "Prompts are evaluated in chunks of about 0.25 s between the running slots' decode steps.\n"
    "Beyond the slots, --queue requests wait; more get 503 with Retry-After. --api-key: every "
    "endpoint but /health needs \"Authorization: Bearer KEY\".\n"
    "The chat template is recognised from the GGUF file (ChatML, Gemma) or named with\n"
    "--chat-template. It listens on the loopback address unless --host says otherwise (0.0.0.0:\n"
    "every interface); --port 0 takes a free port (printed). Connections: a request's headers\n"
    "and body must arrive within --timeout seconds of the connection's start or its last\n"
    "answer (a connection idle that long is closed too); at most --max-connections are open, and\n"
    "near that limit the ones waiting longest without a request are closed to make room; at\n"
    "most --max-per-client from one address (default 0: no limit; behind a proxy every client\n"
    "has its address, so set it where clients connect directly). SIGTERM or SIGINT: no new\n"
    "connections, running requests finish (at most --grace seconds), exit 0.\n";

/* What serve loads before it answers, in a thread of its own (cmd_serve says why). */
typedef struct {
    Model* m;
    ModelInfo* info;
    const char *model, *router, *attn, *topk, *weights, *tok;
    CliList* sets;
    int ctx, half;
    Tokenizer* t; /* out */
} Loading;

static void* load_for_serving(void* arg) {
    Loading* ld = arg;
    Model* m = ld->m;
    /* --set: e.g. a wider window */
    cli_open_model(m, ld->info,
                   &(ModelRequest){.model = ld->model,
                                   .router = ld->router,
                                   .attn = ld->attn,
                                   .topk = ld->topk,
                                   .sets = ld->sets,
                                   .decode = 1,
                                   .weights = ld->weights});
    cli_check_context(m, ld->ctx ? ld->ctx : m->cfg.maxT, "serve", "--ctx");
    ld->t = tokenizer_load(ld->tok ? ld->tok : ld->model);
    /* one token through the decode path: a mode it cannot serve stops here, not a request */
    KVCache c;
    kvcache_init(&c, m, 2, ld->half);
    real* lg = mallocCheck(sizeof(real) * m->cfg.V);
    const int first = tokenizer_bos(ld->t) >= 0 ? tokenizer_bos(ld->t) : tokenizer_eot(ld->t);
    model_prefill(m, &c, &first, 1, lg, 0);
    free(lg);
    kvcache_free(&c);
    return NULL;
}

int cmd_serve(int argc, char** argv) {
    const char *model = NULL, *tok = NULL, *router = NULL, *topk = NULL, *attn = NULL,
               *weights = NULL, *host = "127.0.0.1", *key = NULL, *alias = NULL, *tmpl = NULL,
               *kv = "f16";
    int port = 8080, parallel = 4, ctx = 0, queue = 64, timeout = 60, grace = 10;
    int max_body = 4 << 20, max_conns = 256, max_per_client = 0;
    CliList sets = {0};
    if (cli_parse("serve", argc, argv, 1, serve_usage,
                  "--model:s --tokenizer:s --router:s --topk:s --attn:s --weights:s --host:s "
                  "--port:i[0,65535] --parallel:i[1,64] --ctx:i[1,1048576] --queue:i[0,100000] "
                  "--api-key:s --alias:s --chat-template:s --kv:s --timeout:i[1,86400] "
                  "--grace:i[0,3600] --max-body:i[1024,1073741824] --max-connections:i[8,1000] "
                  "--max-per-client:i[0,1000] --set:*",
                  &model, &tok, &router, &topk, &attn, &weights, &host, &port, &parallel, &ctx,
                  &queue, &key, &alias, &tmpl, &kv, &timeout, &grace, &max_body, &max_conns,
                  &max_per_client, &sets))
        return 0;
    if (!model) fatal("serve: needs --model");
    if (strcmp(kv, "f16") && strcmp(kv, "f32"))
        fatal("serve: --kv must be f16 or f32, got '%s'", kv);
    if (key && !key[0]) fatal("serve: --api-key is empty");
    if (!key && strcmp(host, "127.0.0.1") && strcmp(host, "localhost"))
        fprintf(stderr,
                "focus serve: warning: listening on %s without --api-key: anyone who reaches this "
                "address can use the model\n",
                host);
    /* the chat template first: a template we cannot serve stops the start, before the load */
    char why[600];
    const char* src = NULL;
    GGUFFile gf;
    int have_gguf = 0;
    if (gguf_open(&gf, model, why, sizeof why) == 0) {
        have_gguf = 1;
        uint64_t n;
        src = gguf_get_str(&gf, "tokenizer.chat_template", &n);
    }
    char* tsrc = src ? strdup(src) : NULL;
    if (have_gguf) gguf_close(&gf);
    ChatTemplate ct;
    if (!chat_template_init(&ct, tsrc, tmpl, why, sizeof why)) fatal("serve: %s: %s", model, why);
    free(tsrc);
    /* signals to this thread only (sigwait below): every thread started later inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a signal */
    char name[256];
    if (alias) {
        snprintf(name, sizeof name, "%s", alias);
    } else { /* the file's name without its folder and extension */
        const char* b = strrchr(model, '/');
        snprintf(name, sizeof name, "%s", b ? b + 1 : model);
        char* dot = strrchr(name, '.');
        if (dot && (!strcmp(dot, ".gguf") || !strcmp(dot, ".safetensors") || !strcmp(dot, ".bin")))
            *dot = 0;
    }
    ServeOptions o = {.host = host,
                      .port = port,
                      .parallel = parallel,
                      .ctx = ctx,
                      .queue = queue,
                      .api_key = key,
                      .name = name,
                      .max_body = (size_t)max_body,
                      .timeout_s = timeout,
                      .grace = grace,
                      .max_conns = max_conns,
                      .max_per_client = max_per_client,
                      .half = !strcmp(kv, "f16")};
    Server* sv = serve_listen(&o);
    /* The model is loaded and tried in a thread that then exits, and with it the OpenMP
     * threads it started: libgomp spins between parallel regions only while all the threads it
     * manages fit the cores, so a second idle team beside the engine's would put every region of
     * the engine to sleep and wake it (a prompt took 3x as long, measured: docs/RESULTS.md). */
    Model m;
    ModelInfo info;
    Loading ld = {.m = &m,
                  .info = &info,
                  .model = model,
                  .router = router,
                  .attn = attn,
                  .topk = topk,
                  .weights = weights,
                  .tok = tok,
                  .sets = &sets,
                  .ctx = ctx,
                  .half = o.half};
    pthread_t lt;
    if (pthread_create(&lt, NULL, load_for_serving, &ld)) fatal("serve: cannot start a thread");
    pthread_join(lt, NULL);
    Tokenizer* t = ld.t;
    if (!ctx) o.ctx = ctx = m.cfg.maxT;
    char desc[1200];
    fprintf(stderr, "focus serve: %s, attention %s\n", info.name,
            cli_attention_desc(&m, desc, sizeof desc));
    serve_ctx(sv, ctx);
    serve_ready(sv, &m, t, &ct);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "focus serve: %s: stopping (running requests get %d s to finish)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", grace);
    serve_stop(sv);
    tokenizer_free(t);
    model_free(&m);
    free(sets.v);
    fprintf(stderr, "focus serve: stopped\n");
    return 0;
}
