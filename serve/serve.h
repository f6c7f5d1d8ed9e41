/* serve.h: `focus serve`, an OpenAI-compatible HTTP server (libmicrohttpd, cJSON) over the
 * generation engine (engine.h). Endpoints, as llama-server and the OpenAI API have them:
 * GET /health (503 while the model loads, then 200), GET /v1/models, POST /v1/completions,
 * POST /v1/chat/completions (streamed as server-sent events with "stream": true), POST /tokenize,
 * POST /detokenize, GET /metrics (Prometheus text). Every request error is an OpenAI-style JSON
 * error with a 4xx status; a closed connection cancels its request. Tested by
 * tests/serve_api.py. */
#ifndef FOCUS_SERVE_H
#define FOCUS_SERVE_H

#include <stddef.h>

#include "../data/tokenizer.h"
#include "../model/model.h"
#include "chat.h"

typedef struct {
    const char* host;    /* address to listen on (127.0.0.1) */
    int port;            /* 0: any free port */
    int parallel;        /* slots */
    int ctx;             /* tokens per slot */
    int queue;           /* waiting requests at most (beyond: 503 with Retry-After) */
    const char* api_key; /* NULL: none needed */
    const char* name;    /* the model's id in the API */
    size_t max_body;     /* request bytes at most */
    int timeout_s;       /* an idle connection is closed after this, and a request's headers and
                          * body must arrive within it (serve/conns.h) */
    int max_conns;       /* open connections at most (the oldest waiting ones make room) */
    int max_per_client;  /* of them from one address (0: no limit) */
    double grace;        /* seconds a shutdown lets running requests finish */
    int half;            /* f16 KV cache */
} ServeOptions;

typedef struct Server Server;

/* Listen (the model not loaded yet: /health answers 503); prints the address on stderr. Fatal
 * when the address cannot be bound. */
Server* serve_listen(const ServeOptions* o);
/* The context per slot, known once the model is (o->ctx 0 at serve_listen: the model's). */
void serve_ctx(Server* s, int ctx);
/* The model is loaded: requests are served from now on. */
void serve_ready(Server* s, Model* m, const Tokenizer* t, const ChatTemplate* ct);
/* Stop accepting, finish or cancel what runs (o->grace), close, free. */
void serve_stop(Server* s);

#endif
