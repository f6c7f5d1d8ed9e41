/* engine.h: the generation engine of `focus serve`: N slots, each with its own KV cache (the
 * group KV cache when the model has a router), a bounded queue of requests, and one thread that
 * owns the model. Continuous batching: at every step the next token of every active slot goes
 * through the weights as one batched product (model_decode_batch), each slot's arithmetic that
 * of a request served alone, so a text does not depend on what else runs. A prompt is evaluated
 * in chunks of about 0.25 s, the slots taking turns, each chunk followed by a decode step of the
 * running slots: a long prompt neither stalls the streams nor the short prompts behind it. A new
 * request takes a free slot: the one whose cache holds the longest prefix of its prompt (at least
 * half of it, as llama-server's prompt similarity), evaluated from there only, else the least
 * recently used one. Only a prefix that a prompt evaluation cached is reused (decoded tokens
 * are evaluated again): a prompt gives the same bits in any chunks and after any reuse
 * (model_prefill), so a request's tokens do not depend on what ran on its slot before. Requests
 * are cancelled by the client (a closed connection) or by a shutdown; a full cache ends a
 * request with finish reason "length". Tested by tests/serve_api.py through the HTTP server
 * (serve/http.c). */
#ifndef FOCUS_SERVE_ENGINE_H
#define FOCUS_SERVE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../data/tokenizer.h"
#include "../model/decode.h"
#include "../model/sample.h"

enum { JOB_STOPS = 4 }; /* stop strings per request, as the OpenAI API allows */

enum { TOP_LOGPROBS_MAX = 20 }; /* alternatives per token, as the OpenAI API allows */

typedef struct {
    int max_tokens;        /* at most this many tokens generated */
    Sampling s;            /* temperature (0: greedy), top-p, top-k, min-p, penalties, bias
                            * (s.bias malloc'd, owned) */
    uint64_t seed;         /* of the sampler */
    char* stop[JOB_STOPS]; /* the text ends before the first of these (malloc'd, owned) */
    int nstop;
    int logprobs; /* -1: none; else each token's log-probability and its logprobs most likely
                   * alternatives (0 .. TOP_LOGPROBS_MAX) */
} JobParams;

typedef enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_CANCELLED } Finish;

typedef struct {
    Finish finish;         /* FINISH_NONE while it runs */
    int prompt_tokens;     /* the tokens of the prompt */
    int completion_tokens; /* the tokens generated (an end-of-text token not counted) */
    int cached_tokens;     /* of the prompt, found in the slot's cache (not evaluated again) */
    double ttft;           /* seconds from submission to the first token (-1 before it) */
} JobStatus;

typedef struct Engine Engine;
typedef struct Job Job;

typedef struct {
    long requests, completed, cancelled, prompt_tokens, completion_tokens, cached_tokens;
    double ttft_sum; /* over the requests that produced a first token */
    long ttft_count;
    int queued, busy, slots;
    long steps, step_rows; /* batched decode steps, and the rows they carried */
} EngineStats;

/* An engine on a loaded model: `slots` slots of ctx tokens each (half: f16 KV cache), a queue of
 * at most `queue` waiting requests. Starts its thread. */
Engine* engine_new(Model* m, const Tokenizer* t, int slots, int ctx, int queue, int half);
/* Stop: refuse new requests, cancel the queued ones, let the running ones finish for at most
 * grace seconds, cancel the rest, join the thread. Waiting clients see their jobs' ends; the
 * engine stays valid for them until engine_free. */
void engine_stop(Engine* e, double grace);
void engine_free(Engine* e);
int engine_ctx(const Engine* e);

/* Queue a request for the prompt's np tokens (taken: the engine frees them) with its params
 * (the stop strings taken too). NULL when slots + queue requests are in the engine already
 * (*why = 1) or the engine is stopping (*why = 2); the prompt and params are freed then as
 * well. */
Job* engine_submit(Engine* e, int* prompt, int np, JobParams* p, int* why);
/* Wait at most ms milliseconds for text beyond the first `from` bytes of the job's text (only
 * complete UTF-8 characters and nothing that could still become a stop string count) or its
 * end. Returns the text's length now; *text (when not NULL) receives a malloc'd copy of the
 * bytes from `from` on; st its status. */
/* A generated token's log-probability under the model (temperature 1, no bias or penalty) and
 * the most likely alternatives; off: where its bytes begin in the job's text. */
typedef struct {
    int id, ntop;
    float lp;
    size_t off;
    int top_id[TOP_LOGPROBS_MAX];
    float top_lp[TOP_LOGPROBS_MAX];
} TokenLogprob;

size_t engine_wait(Engine* e, Job* j, size_t from, int ms, char** text, JobStatus* st);
/* The client is gone: the job stops at its next step, its slot freed. */
/* The log-probabilities of the job's tokens whose bytes begin in [from, to) of its text (a
 * malloc'd copy in *out; returns their count; 0 when the request asked for none). */
int engine_logprobs(Engine* e, Job* j, size_t from, size_t to, TokenLogprob** out);
void engine_cancel(Engine* e, Job* j);
/* The caller is done with the job (after its end, or after engine_cancel). */
void engine_release(Engine* e, Job* j);
EngineStats engine_stats(Engine* e);

/* What a slot holds now (llama-server's /slots): its cached tokens (of them the prompt-evaluated
 * prefix a new request may reuse), and its running request's counts. */
typedef struct {
    int id, busy, filling; /* filling: its prompt is being evaluated */
    int cached, reusable;  /* tokens in its KV cache; of them, evaluated as a prompt */
    int prompt_tokens, prompt_done, completion_tokens, max_tokens; /* of the running request */
    double temperature, top_p, min_p;
    int top_k;
} SlotInfo;

/* Fills out[0 .. slots) (at most max); returns the slot count. */
int engine_slots(Engine* e, SlotInfo* out, int max);

#endif
