/* http.c: the HTTP face of `focus serve` (see serve.h): libmicrohttpd with one thread per
 * connection (a request waits for its tokens in its own thread), cJSON for the bodies. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "conns.h"
#include "engine.h"
#include "serve.h"

struct Server {
    ServeOptions o;
    struct MHD_Daemon* d;
    ConnGuard* guard;
    Engine* e;
    Model* m;
    const Tokenizer* t;
    ChatTemplate ct;
    atomic_int ready;
    atomic_long http_requests, http_errors, next_id;
    atomic_int streams; /* streamed responses not yet freed (all of their bytes handed over) */
    atomic_int active;  /* requests begun and not yet ended (their answers may be on their way) */
    double started;
};

typedef struct {
    char* body;
    size_t len, cap;
    int too_big, answered; /* answered: refused at its headers */
    int complete;          /* its body has come */
} Req;

/* ------------------------------------------------------------------ responses */

/* The header a status asks for (RFC 9110): 401 says how to authenticate, 405 which method. */
static __thread const char* allow_method;

static enum MHD_Result send_text(struct MHD_Connection* c, unsigned status, const char* type,
                                 char* body, const char* retry_after) {
    struct MHD_Response* r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 405 && allow_method) MHD_add_response_header(r, "Allow", allow_method);
    const enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection* c, unsigned status, cJSON* j) {
    char* s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return send_text(c, status, "application/json", s, NULL);
}

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result send_error(Server* sv, struct MHD_Connection* c, unsigned status,
                                  const char* param, const char* code, const char* fmt, ...)
    __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(Server* sv, struct MHD_Connection* c, unsigned status,
                                  const char* param, const char* code, const char* fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sv->http_errors++;
    cJSON* j = cJSON_CreateObject();
    cJSON* e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type",
                            status == 401   ? "authentication_error"
                            : status >= 500 ? "server_error"
                            : status == 404 ? "not_found_error"
                                            : "invalid_request_error");
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char* s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return send_text(c, status, "application/json", s, status == 503 ? "1" : NULL);
}

/* Whether the client is gone (a cancelled request): its connection reset or broken. A client
 * that only closed its sending half after its request (shutdown(SHUT_WR), as `nc -N` does)
 * still waits for the answer, and a closed socket reads the same: such a request runs on, and
 * its answer fails to send if nobody is there. A stream learns it at its next write. */
static int client_gone(struct MHD_Connection* c) {
    const union MHD_ConnectionInfo* ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* text as valid UTF-8 (malloc'd; frees s): a byte that does not begin a complete, well-formed
 * character becomes U+FFFD, as a UTF-8 reader shows it (a generation cut by max_tokens can end
 * in the middle of a character, and JSON strings must be UTF-8) */
static char* utf8_clean(char* s) {
    const size_t n = strlen(s);
    char* o = mallocCheck(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80                          ? 1
                     : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 2
                     : (c & 0xf0) == 0xe0              ? 3
                     : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 4
                                                       : 0;
        for (size_t j = 1; j < len; j++)
            if (i + j >= n || ((unsigned char)s[i + j] & 0xc0) != 0x80) len = 0;
        if (len) {
            memcpy(o + k, s + i, len);
            k += len, i += len;
        } else {
            memcpy(o + k, "\xef\xbf\xbd", 3);
            k += 3, i++;
        }
    }
    o[k] = 0;
    free(s);
    return o;
}

/* ------------------------------------------------------------------ request fields */

typedef struct {
    JobParams p;
    int stream, include_usage;
} Gen;

static void free_gen(Gen* g) {
    for (int i = 0; i < g->p.nstop; i++) free(g->p.stop[i]);
    g->p.nstop = 0;
    free((void*)g->p.s.bias);
    g->p.s.bias = NULL;
    g->p.s.nbias = 0;
}

/* A number field in [lo, hi] (an integer when integral) into *out; 0: absent or null. -1 with
 * why written: present but not such a number. */
static int number_field(const cJSON* f, const char* name, double lo, double hi, int integral,
                        double* out, char* why, size_t wl) {
    if (!f || cJSON_IsNull(f)) return 0;
    if (!cJSON_IsNumber(f) || !(f->valuedouble >= lo && f->valuedouble <= hi) ||
        (integral && f->valuedouble != (double)(long long)f->valuedouble)) {
        snprintf(why, wl, "%s: must be %s in [%g, %g]", name, integral ? "an integer" : "a number",
                 lo, hi);
        return -1;
    }
    *out = f->valuedouble;
    return 1;
}

/* What the server does not do, refused by name rather than ignored: the field, when present
 * and not its neutral value. */
static const char* unsupported_field(const cJSON* root) {
    static const char* const never[] = {"tools",         "tool_choice",         "functions",
                                        "function_call", "parallel_tool_calls", "audio",
                                        "modalities",    "prediction"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        const cJSON* f = cJSON_GetObjectItemCaseSensitive(root, never[i]);
        if (f && !cJSON_IsNull(f)) return never[i];
    }
    const cJSON* f = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    if (f && !cJSON_IsNull(f)) { /* {"type": "text"}: what every answer is */
        const cJSON* ty = cJSON_GetObjectItemCaseSensitive(f, "type");
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "text")) return "response_format";
    }
    f = cJSON_GetObjectItemCaseSensitive(root, "best_of");
    if (f && !cJSON_IsNull(f) && !(cJSON_IsNumber(f) && f->valuedouble == 1)) return "best_of";
    f = cJSON_GetObjectItemCaseSensitive(root, "suffix");
    if (f && !cJSON_IsNull(f) && !(cJSON_IsString(f) && !f->valuestring[0])) return "suffix";
    return NULL;
}

/* The sampling fields of a completion request into g; 0 with the field and reason otherwise. */
static int parse_gen(Server* sv, const cJSON* root, Gen* g, int chat, const char** param, char* why,
                     size_t wl) {
    memset(g, 0, sizeof(*g));
    g->p.max_tokens = chat ? sv->o.ctx : 16; /* OpenAI's defaults */
    g->p.s = sampling_defaults();
    g->p.logprobs = -1;
    g->p.seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)sv->next_id;
    const cJSON* f;
#define FIELD(name) (f = cJSON_GetObjectItemCaseSensitive(root, (*param = name)))
#define BAD(...)                        \
    do {                                \
        snprintf(why, wl, __VA_ARGS__); \
        return 0;                       \
    } while (0)
    if (FIELD("model") && !cJSON_IsNull(f)) {
        if (!cJSON_IsString(f)) BAD("model: must be a string");
    }
    const char* mt = chat && cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    if (FIELD(mt) && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble != (double)(long)f->valuedouble)
            BAD("%s: must be an integer", mt);
        if (f->valuedouble < 1 || f->valuedouble > sv->o.ctx)
            BAD("%s: %g is out of range (1 .. %d, the context)", mt, f->valuedouble, sv->o.ctx);
        g->p.max_tokens = (int)f->valuedouble;
    }
    if (FIELD("temperature") && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || !(f->valuedouble >= 0 && f->valuedouble <= 100))
            BAD("temperature: must be a number in [0, 100]");
        g->p.s.temperature = f->valuedouble;
    }
    if (FIELD("top_p") && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || !(f->valuedouble > 0 && f->valuedouble <= 1))
            BAD("top_p: must be a number in (0, 1]");
        g->p.s.top_p = f->valuedouble;
    }
    if (FIELD("seed") && !cJSON_IsNull(f)) {
        if (!cJSON_IsNumber(f) || f->valuedouble != (double)(long long)f->valuedouble)
            BAD("seed: must be an integer");
        g->p.seed = (uint64_t)(long long)f->valuedouble;
    }
    if (FIELD("n") && !cJSON_IsNull(f) && !(cJSON_IsNumber(f) && f->valuedouble == 1))
        BAD("n: only one choice per request is served");
    if ((*param = unsupported_field(root))) BAD("%s: not supported by this server", *param);
    if (FIELD("echo") && !cJSON_IsNull(f) && !cJSON_IsFalse(f)) BAD("echo: not supported");
    double v;
    int got;
#define NUMBER(name, lo, hi, integral, dst)                                                       \
    do {                                                                                          \
        if ((got = number_field(FIELD(name), name, lo, hi, integral, &v, why, wl)) < 0) return 0; \
        if (got) dst = v;                                                                         \
    } while (0)
    NUMBER("top_k", 0, 1e9, 1, g->p.s.top_k);
    NUMBER("min_p", 0, 1, 0, g->p.s.min_p);
    NUMBER("repeat_penalty", 0.01, 100, 0, g->p.s.repeat_penalty);
    NUMBER("repeat_last_n", -1, 1e9, 1, g->p.s.repeat_last_n);
    NUMBER("frequency_penalty", -2, 2, 0, g->p.s.frequency_penalty);
    NUMBER("presence_penalty", -2, 2, 0, g->p.s.presence_penalty);
#undef NUMBER
    if (FIELD("logit_bias") && !cJSON_IsNull(f)) {
        if (!cJSON_IsObject(f)) BAD("logit_bias: must be an object of token ids and numbers");
        const int n = cJSON_GetArraySize(f);
        if (n > 1024) BAD("logit_bias: at most 1024 tokens");
        LogitBias* b = mallocCheck(sizeof(LogitBias) * (size_t)(n ? n : 1));
        g->p.s.bias = b;
        for (const cJSON* x = f->child; x; x = x->next) {
            char* end;
            const long id = strtol(x->string, &end, 10);
            if (!x->string[0] || *end || id < 0 || id >= sv->m->cfg.V)
                BAD("logit_bias: '%.40s' is not a token id in [0, %d)", x->string, sv->m->cfg.V);
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= -100 && x->valuedouble <= 100))
                BAD("logit_bias: the bias of token %ld must be a number in [-100, 100]", id);
            b[g->p.s.nbias++] = (LogitBias){(int)id, (float)x->valuedouble};
        }
    }
    if (chat) { /* "logprobs": true, "top_logprobs": 0 .. 20 */
        if (FIELD("logprobs") && !cJSON_IsNull(f)) {
            if (!cJSON_IsBool(f)) BAD("logprobs: must be true or false");
            if (cJSON_IsTrue(f)) g->p.logprobs = 0;
        }
        if ((got = number_field(FIELD("top_logprobs"), "top_logprobs", 0, TOP_LOGPROBS_MAX, 1, &v,
                                why, wl)) < 0)
            return 0;
        if (got && g->p.logprobs < 0) BAD("top_logprobs: needs \"logprobs\": true");
        if (got) g->p.logprobs = (int)v;
    } else { /* "logprobs": 0 .. 20, the alternatives per token */
        if ((got = number_field(FIELD("logprobs"), "logprobs", 0, TOP_LOGPROBS_MAX, 1, &v, why,
                                wl)) < 0)
            return 0;
        if (got) g->p.logprobs = (int)v;
    }
    if (FIELD("stop") && !cJSON_IsNull(f)) {
        const int one = cJSON_IsString(f);
        if (!one && !cJSON_IsArray(f)) BAD("stop: must be a string or an array of strings");
        const int n = one ? 1 : cJSON_GetArraySize(f);
        if (n > JOB_STOPS) BAD("stop: at most %d strings", JOB_STOPS);
        for (int i = 0; i < n; i++) {
            const cJSON* s = one ? f : cJSON_GetArrayItem(f, i);
            if (!cJSON_IsString(s)) BAD("stop: must be a string or an array of strings");
            if (!s->valuestring[0]) continue; /* an empty stop string stops nothing */
            if (strlen(s->valuestring) > 256) BAD("stop: strings of at most 256 bytes");
            g->p.stop[g->p.nstop++] = strdup(s->valuestring);
        }
    }
    if (FIELD("stream") && !cJSON_IsNull(f)) {
        if (!cJSON_IsBool(f)) BAD("stream: must be true or false");
        g->stream = cJSON_IsTrue(f);
    }
    if (FIELD("stream_options") && !cJSON_IsNull(f)) {
        if (!cJSON_IsObject(f)) BAD("stream_options: must be an object");
        const cJSON* u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
        if (u && !cJSON_IsBool(u)) BAD("stream_options.include_usage: must be true or false");
        g->include_usage = cJSON_IsTrue(u);
    }
#undef FIELD
#undef BAD
    *param = NULL;
    return 1;
}

/* ------------------------------------------------------------------ completions */

typedef struct {
    Server* sv;
    struct MHD_Connection* c;
    Job* j;
    int chat, include_usage, sent_role, ended, logprobs;
    char id[40];
    long created;
    size_t from; /* bytes of the job's text sent */
    char* buf;   /* SSE bytes ready to send */
    size_t blen, bpos, bcap;
} Stream;

static cJSON* usage_json(const JobStatus* st) {
    cJSON* u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", st->completion_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", st->prompt_tokens + st->completion_tokens);
    cJSON* d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", st->cached_tokens);
    return u;
}

static const char* finish_name(Finish f) {
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : NULL;
}

/* The body of a response or of a streamed chunk: the envelope with its one choice (NULL: a
 * chunk without choices, the usage one). */
static cJSON* envelope(Server* sv, const char* id, long created, int chat, int chunk,
                       cJSON* choice) {
    cJSON* r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", id);
    cJSON_AddStringToObject(
        r, "object",
        chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(r, "created", (double)created);
    cJSON_AddStringToObject(r, "model", sv->o.name);
    cJSON_AddStringToObject(r, "system_fingerprint", "focus");
    cJSON* cs = cJSON_AddArrayToObject(r, "choices");
    if (choice) cJSON_AddItemToArray(cs, choice);
    return r;
}

/* A token as the logprobs objects show it: its text (valid UTF-8) and, for chat, its bytes. */
static cJSON* add_token(cJSON* o, Server* sv, int id, int with_bytes) {
    size_t n;
    char* raw = tokenizer_decode(sv->t, &id, 1, &n);
    char* z = mallocCheck(n + 1);
    memcpy(z, raw, n);
    z[n] = 0; /* (a NUL inside a token's bytes ends its text; its bytes keep it) */
    z = utf8_clean(z);
    cJSON_AddStringToObject(o, "token", z);
    if (with_bytes) {
        cJSON* b = cJSON_AddArrayToObject(o, "bytes");
        for (size_t i = 0; i < n; i++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    }
    free(z);
    free(raw);
    return o;
}

/* The logprobs of a choice, in the OpenAI shapes: chat {"content": [{token, logprob, bytes,
 * top_logprobs: [...]}]}; completions {tokens, token_logprobs, top_logprobs: [{text: lp}],
 * text_offset (bytes into the completion's text)}. */
static cJSON* logprobs_json(Server* sv, int chat, const TokenLogprob* lp, int n) {
    cJSON* r = cJSON_CreateObject();
    if (chat) {
        cJSON* content = cJSON_AddArrayToObject(r, "content");
        for (int i = 0; i < n; i++) {
            cJSON* t = add_token(cJSON_CreateObject(), sv, lp[i].id, 1);
            cJSON_AddNumberToObject(t, "logprob", lp[i].lp);
            cJSON* tops = cJSON_AddArrayToObject(t, "top_logprobs");
            for (int k = 0; k < lp[i].ntop; k++) {
                cJSON* a = add_token(cJSON_CreateObject(), sv, lp[i].top_id[k], 1);
                cJSON_AddNumberToObject(a, "logprob", lp[i].top_lp[k]);
                cJSON_AddItemToArray(tops, a);
            }
            cJSON_AddItemToArray(content, t);
        }
        cJSON_AddNullToObject(r, "refusal");
        return r;
    }
    cJSON* toks = cJSON_AddArrayToObject(r, "tokens");
    cJSON* lps = cJSON_AddArrayToObject(r, "token_logprobs");
    cJSON* tops = cJSON_AddArrayToObject(r, "top_logprobs");
    cJSON* offs = cJSON_AddArrayToObject(r, "text_offset");
    for (int i = 0; i < n; i++) {
        cJSON* t = add_token(cJSON_CreateObject(), sv, lp[i].id, 0);
        cJSON_AddItemToArray(toks, cJSON_DetachItemFromObject(t, "token"));
        cJSON_Delete(t);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp[i].lp));
        cJSON* d = cJSON_CreateObject();
        for (int k = 0; k < lp[i].ntop; k++) { /* two tokens of one text: the likelier shown */
            cJSON* a = add_token(cJSON_CreateObject(), sv, lp[i].top_id[k], 0);
            const char* key = cJSON_GetObjectItemCaseSensitive(a, "token")->valuestring;
            if (!cJSON_GetObjectItemCaseSensitive(d, key))
                cJSON_AddNumberToObject(d, key, lp[i].top_lp[k]);
            cJSON_Delete(a);
        }
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)lp[i].off));
    }
    return r;
}

/* The logprobs of the job's tokens that begin in [from, to) of its text (NULL: not asked for). */
static cJSON* job_logprobs(Server* sv, Job* j, int chat, int asked, size_t from, size_t to) {
    if (!asked) return NULL;
    TokenLogprob* lp;
    const int n = engine_logprobs(sv->e, j, from, to, &lp);
    cJSON* r = logprobs_json(sv, chat, lp, n);
    free(lp);
    return r;
}

static cJSON* choice_json(int chat, int chunk, const char* text, const char* role,
                          const char* finish, cJSON* logprobs) {
    cJSON* ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", 0);
    if (chat) {
        cJSON* msg = cJSON_AddObjectToObject(ch, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(msg, "role", role);
        if (text) cJSON_AddStringToObject(msg, "content", text);
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    }
    if (logprobs)
        cJSON_AddItemToObject(ch, "logprobs", logprobs);
    else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish)
        cJSON_AddStringToObject(ch, "finish_reason", finish);
    else
        cJSON_AddNullToObject(ch, "finish_reason");
    return ch;
}

static void stream_put(Stream* s, cJSON* j) {
    char* body = j ? cJSON_PrintUnformatted(j) : strdup("[DONE]");
    if (j) cJSON_Delete(j);
    const size_t n = strlen(body) + 8;
    if (s->blen + n > s->bcap) {
        s->bcap = 2 * (s->blen + n) + 256;
        s->buf = reallocCheck(s->buf, s->bcap);
    }
    s->blen += (size_t)sprintf(s->buf + s->blen, "data: %s\n\n", body);
    free(body);
}

/* More SSE bytes: the role, new text, the end. 0 when the client is gone. */
static int stream_refill(Stream* s) {
    s->blen = s->bpos = 0;
    if (s->chat && !s->sent_role) {
        s->sent_role = 1;
        stream_put(s, envelope(s->sv, s->id, s->created, 1, 1,
                               choice_json(1, 1, "", "assistant", NULL, NULL)));
        return 1;
    }
    char* text;
    JobStatus st;
    const size_t safe = engine_wait(s->sv->e, s->j, s->from, 100, &text, &st);
    text = utf8_clean(text);
    const int more_text = safe > s->from;
    if (more_text) /* (a NUL byte, which JSON strings in C cannot hold, ends the piece) */
        stream_put(
            s,
            envelope(s->sv, s->id, s->created, s->chat, 1,
                     choice_json(s->chat, 1, text, NULL, NULL,
                                 job_logprobs(s->sv, s->j, s->chat, s->logprobs, s->from, safe))));
    s->from = more_text ? safe : s->from;
    free(text);
    if (st.finish != FINISH_NONE && !more_text) {
        if (st.finish == FINISH_CANCELLED) {
            cJSON* e = cJSON_CreateObject();
            cJSON* er = cJSON_AddObjectToObject(e, "error");
            cJSON_AddStringToObject(er, "message", "the server is shutting down");
            cJSON_AddStringToObject(er, "type", "server_error");
            stream_put(s, e);
        } else {
            stream_put(s, envelope(s->sv, s->id, s->created, s->chat, 1,
                                   choice_json(s->chat, 1, s->chat ? NULL : "", NULL,
                                               finish_name(st.finish), NULL)));
            if (s->include_usage) {
                cJSON* u = envelope(s->sv, s->id, s->created, s->chat, 1, NULL);
                cJSON_AddItemToObject(u, "usage", usage_json(&st));
                stream_put(s, u);
            }
        }
        stream_put(s, NULL);
        s->ended = 1;
        return 1;
    }
    if (!s->blen && client_gone(s->c)) return 0;
    return 1;
}

static ssize_t stream_read(void* cls, uint64_t pos, char* out, size_t max) {
    (void)pos;
    Stream* s = cls;
    while (s->bpos == s->blen) {
        if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_refill(s)) {
            engine_cancel(s->sv->e, s->j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = s->blen - s->bpos;
    if (n > max) n = max;
    memcpy(out, s->buf + s->bpos, n);
    s->bpos += n;
    return (ssize_t)n;
}

static void stream_free(void* cls) {
    Stream* s = cls;
    JobStatus st;
    engine_wait(s->sv->e, s->j, 0, 0, NULL, &st);
    if (st.finish == FINISH_NONE) engine_cancel(s->sv->e, s->j); /* the client left mid-stream */
    engine_release(s->sv->e, s->j);
    atomic_fetch_sub(&s->sv->streams, 1);
    free(s->buf);
    free(s);
}

/* The tokens of a completion request's prompt: a string, one string in an array, or ids. */
static int* completion_prompt(Server* sv, const cJSON* root, int* np, char* why, size_t wl) {
    const cJSON* p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(p->child)) p = p->child;
    const int bos = tokenizer_bos(sv->t);
    if (cJSON_IsString(p)) {
        size_t n;
        int* ids = tokenizer_encode(sv->t, p->valuestring, strlen(p->valuestring), &n);
        int* out = mallocCheck(sizeof(int) * (n + 2));
        int k = 0;
        if (bos >= 0) out[k++] = bos;
        memcpy(out + k, ids, sizeof(int) * n);
        k += (int)n;
        free(ids);
        if (!k) out[k++] = tokenizer_eot(sv->t); /* an empty prompt: the start of a document */
        *np = k;
        return out;
    }
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0) {
        const int n = cJSON_GetArraySize(p);
        int* out = mallocCheck(sizeof(int) * (size_t)n);
        int k = 0;
        for (const cJSON* x = p->child; x; x = x->next) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= sv->m->cfg.V ||
                x->valuedouble != (double)(int)x->valuedouble) {
                snprintf(why, wl, "prompt: an array must hold one string or token ids in [0, %d)",
                         sv->m->cfg.V);
                free(out);
                return NULL;
            }
            out[k++] = (int)x->valuedouble;
        }
        *np = k;
        return out;
    }
    snprintf(why, wl, "prompt: must be a string, an array of one string, or of token ids");
    return NULL;
}

static int* chat_prompt(Server* sv, const cJSON* root, int* np, char* why, size_t wl) {
    if (sv->ct.kind == CHAT_NONE) {
        snprintf(why, wl,
                 "this model has no chat template: use /v1/completions, or start the server "
                 "with --chat-template chatml or gemma");
        return NULL;
    }
    const cJSON* ms = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0) {
        snprintf(why, wl, "messages: must be a non-empty array");
        return NULL;
    }
    const int n = cJSON_GetArraySize(ms);
    ChatMessage* m = callocCheck((size_t)n, sizeof(ChatMessage));
    char** joined = callocCheck((size_t)n, sizeof(char*));
    int i = 0, bad = 0;
    for (const cJSON* x = ms->child; x && !bad; x = x->next, i++) {
        const cJSON* role = cJSON_GetObjectItemCaseSensitive(x, "role");
        const cJSON* content = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsObject(x) || !cJSON_IsString(role)) {
            snprintf(why, wl, "messages[%d]: needs a string role", i);
            bad = 1;
            break;
        }
        m[i].role = role->valuestring;
        if (cJSON_IsString(content)) {
            m[i].content = content->valuestring;
        } else if (cJSON_IsArray(content)) { /* parts: {"type": "text", "text": ...} */
            size_t len = 0;
            for (const cJSON* p = content->child; p; p = p->next) {
                const cJSON* tx = cJSON_GetObjectItemCaseSensitive(p, "text");
                const cJSON* ty = cJSON_GetObjectItemCaseSensitive(p, "type");
                if (!cJSON_IsString(tx) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text")) {
                    snprintf(why, wl, "messages[%d].content: only text parts are served", i);
                    bad = 1;
                    break;
                }
                len += strlen(tx->valuestring);
            }
            if (bad) break;
            joined[i] = callocCheck(len + 1, 1);
            for (const cJSON* p = content->child; p; p = p->next)
                strcat(joined[i], cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring);
            m[i].content = joined[i];
        } else {
            snprintf(why, wl, "messages[%d].content: must be a string or an array of text parts",
                     i);
            bad = 1;
        }
    }
    int* ids = bad ? NULL : chat_encode(&sv->ct, sv->t, m, n, tokenizer_bos(sv->t), np, why, wl);
    for (int k = 0; k < n; k++) free(joined[k]);
    free(joined);
    free(m);
    return ids;
}

static enum MHD_Result completions(Server* sv, struct MHD_Connection* c, const cJSON* root,
                                   int chat) {
    char why[512];
    const char* param = NULL;
    Gen g;
    if (!parse_gen(sv, root, &g, chat, &param, why, sizeof why)) {
        free_gen(&g);
        return send_error(sv, c, 400, param, NULL, "%s", why);
    }
    const cJSON* model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (cJSON_IsString(model) && strcmp(model->valuestring, sv->o.name)) {
        free_gen(&g);
        return send_error(sv, c, 404, "model", "model_not_found",
                          "the model '%.200s' is not served here (this server has '%s')",
                          model->valuestring, sv->o.name);
    }
    int np = 0;
    int* prompt = chat ? chat_prompt(sv, root, &np, why, sizeof why)
                       : completion_prompt(sv, root, &np, why, sizeof why);
    if (!prompt) {
        free_gen(&g);
        return send_error(sv, c, 400, chat ? "messages" : "prompt", NULL, "%s", why);
    }
    if (np > sv->o.ctx) {
        free(prompt);
        free_gen(&g);
        return send_error(sv, c, 400, chat ? "messages" : "prompt", "context_length_exceeded",
                          "the prompt has %d tokens, more than the context of %d", np, sv->o.ctx);
    }
    /* no idle timeout while the request runs: a long prompt ahead in the queue can keep the
     * first token away for longer (the timeout returns for the next request, in completed()) */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)0);
    int busy;
    Job* j = engine_submit(sv->e, prompt, np, &g.p, &busy);
    if (!j)
        return send_error(sv, c, 503, NULL, busy == 1 ? "queue_full" : "shutting_down",
                          busy == 1 ? "every slot is busy and the queue is full: retry later"
                                    : "the server is shutting down");
    char id[40];
    snprintf(id, sizeof id, "%s-%lx%06lx", chat ? "chatcmpl" : "cmpl", (long)time(NULL),
             (long)++sv->next_id);
    const long created = (long)time(NULL);
    if (g.stream) {
        Stream* s = callocCheck(1, sizeof(Stream));
        s->sv = sv, s->c = c, s->j = j, s->chat = chat, s->include_usage = g.include_usage;
        s->logprobs = g.p.logprobs >= 0;
        s->created = created;
        memcpy(s->id, id, sizeof id);
        atomic_fetch_add(&sv->streams, 1);
        struct MHD_Response* r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        const enum MHD_Result ok = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ok;
    }
    JobStatus st;
    size_t at = 0;
    for (;;) { /* until the end, or until the client leaves */
        at = engine_wait(sv->e, j, at, 200, NULL, &st);
        if (st.finish != FINISH_NONE) break;
        if (client_gone(c)) {
            engine_cancel(sv->e, j);
            engine_release(sv->e, j);
            return MHD_NO; /* nobody to answer */
        }
    }
    char* text;
    const size_t len = engine_wait(sv->e, j, 0, 0, &text, &st);
    cJSON* lp =
        st.finish == FINISH_CANCELLED ? NULL : job_logprobs(sv, j, chat, g.p.logprobs >= 0, 0, len);
    engine_release(sv->e, j);
    text = utf8_clean(text);
    if (st.finish == FINISH_CANCELLED) {
        free(text);
        return send_error(sv, c, 503, NULL, "shutting_down", "the server is shutting down");
    }
    cJSON* r =
        envelope(sv, id, created, chat, 0,
                 choice_json(chat, 0, text, chat ? "assistant" : NULL, finish_name(st.finish), lp));
    free(text);
    cJSON_AddItemToObject(r, "usage", usage_json(&st));
    return send_json(c, 200, r);
}

/* ------------------------------------------------------------------ the other endpoints */

static enum MHD_Result tokenize(Server* sv, struct MHD_Connection* c, const cJSON* root) {
    const cJSON* content = cJSON_GetObjectItemCaseSensitive(root, "content");
    const cJSON* special = cJSON_GetObjectItemCaseSensitive(root, "add_special");
    if (!cJSON_IsString(content))
        return send_error(sv, c, 400, "content", NULL, "content: must be a string");
    if (special && !cJSON_IsBool(special))
        return send_error(sv, c, 400, "add_special", NULL, "add_special: must be true or false");
    size_t n;
    int* ids = tokenizer_encode(sv->t, content->valuestring, strlen(content->valuestring), &n);
    cJSON* r = cJSON_CreateObject();
    cJSON* a = cJSON_AddArrayToObject(r, "tokens");
    if (cJSON_IsTrue(special) && tokenizer_bos(sv->t) >= 0)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(tokenizer_bos(sv->t)));
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    free(ids);
    return send_json(c, 200, r);
}

static enum MHD_Result detokenize(Server* sv, struct MHD_Connection* c, const cJSON* root) {
    const cJSON* toks = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(toks))
        return send_error(sv, c, 400, "tokens", NULL, "tokens: must be an array of token ids");
    const int n = cJSON_GetArraySize(toks);
    int* ids = mallocCheck(sizeof(int) * (size_t)(n + 1));
    int k = 0;
    for (const cJSON* x = toks->child; x; x = x->next) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= sv->m->cfg.V ||
            x->valuedouble != (double)(int)x->valuedouble) {
            free(ids);
            return send_error(sv, c, 400, "tokens", NULL,
                              "tokens[%d]: must be a token id in [0, %d)", k, sv->m->cfg.V);
        }
        ids[k++] = (int)x->valuedouble;
    }
    size_t len;
    char* text = utf8_clean(tokenizer_decode(sv->t, ids, (size_t)k, &len));
    free(ids);
    cJSON* r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "content", text);
    free(text);
    return send_json(c, 200, r);
}

static enum MHD_Result models(Server* sv, struct MHD_Connection* c) {
    cJSON* r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON* a = cJSON_AddArrayToObject(r, "data");
    cJSON* m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", sv->o.name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", sv->started);
    cJSON_AddStringToObject(m, "owned_by", "focus");
    cJSON* meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_ctx", sv->o.ctx);
    cJSON_AddNumberToObject(meta, "n_vocab", sv->m->cfg.V);
    cJSON_AddNumberToObject(meta, "slots", sv->o.parallel);
    const AttnMode am = sv->m->fc.attn;
    cJSON_AddStringToObject(meta, "attention",
                            am >= 0 && am < NUM_ATTN_METHODS ? attn_methods[am]->serve_name : "dense");
    cJSON_AddStringToObject(meta, "chat_template", chat_template_name(&sv->ct));
    cJSON_AddItemToArray(a, m);
    return send_json(c, 200, r);
}

static enum MHD_Result metrics(Server* sv, struct MHD_Connection* c) {
    const EngineStats s = engine_stats(sv->e);
    int open;
    long kicked;
    conn_counts(sv->guard, &open, &kicked);
    char* b = mallocCheck(5120);
    snprintf(
        b, 5120,
        "# HELP focus_requests_total Completion requests accepted.\n"
        "# TYPE focus_requests_total counter\nfocus_requests_total %ld\n"
        "# HELP focus_requests_completed_total Completion requests finished.\n"
        "# TYPE focus_requests_completed_total counter\nfocus_requests_completed_total %ld\n"
        "# HELP focus_requests_cancelled_total Requests cancelled (client gone, shutdown).\n"
        "# TYPE focus_requests_cancelled_total counter\nfocus_requests_cancelled_total %ld\n"
        "# HELP focus_http_requests_total HTTP requests received.\n"
        "# TYPE focus_http_requests_total counter\nfocus_http_requests_total %ld\n"
        "# HELP focus_http_errors_total HTTP requests answered with an error.\n"
        "# TYPE focus_http_errors_total counter\nfocus_http_errors_total %ld\n"
        "# HELP focus_prompt_tokens_total Prompt tokens received.\n"
        "# TYPE focus_prompt_tokens_total counter\nfocus_prompt_tokens_total %ld\n"
        "# HELP focus_prompt_tokens_cached_total Prompt tokens found in a slot's cache.\n"
        "# TYPE focus_prompt_tokens_cached_total counter\nfocus_prompt_tokens_cached_total %ld\n"
        "# HELP focus_completion_tokens_total Tokens generated.\n"
        "# TYPE focus_completion_tokens_total counter\nfocus_completion_tokens_total %ld\n"
        "# HELP focus_time_to_first_token_seconds Time from a request to its first token.\n"
        "# TYPE focus_time_to_first_token_seconds summary\n"
        "focus_time_to_first_token_seconds_sum %.6f\n"
        "focus_time_to_first_token_seconds_count %ld\n"
        "# HELP focus_queue_length Requests waiting for a slot.\n"
        "# TYPE focus_queue_length gauge\nfocus_queue_length %d\n"
        "# HELP focus_slots_busy Slots generating.\n"
        "# TYPE focus_slots_busy gauge\nfocus_slots_busy %d\n"
        "# HELP focus_slots Slots.\n# TYPE focus_slots gauge\nfocus_slots %d\n"
        "# HELP focus_decode_steps_total Batched decode steps.\n"
        "# TYPE focus_decode_steps_total counter\nfocus_decode_steps_total %ld\n"
        "# HELP focus_decode_rows_total Tokens those steps decoded (rows per step summed).\n"
        "# TYPE focus_decode_rows_total counter\nfocus_decode_rows_total %ld\n"
        "# HELP focus_connections_open HTTP connections open.\n"
        "# TYPE focus_connections_open gauge\nfocus_connections_open %d\n"
        "# HELP focus_connections_closed_total Connections the server closed: a request's\n"
        "# headers or body past the deadline, or room made for a client with a request.\n"
        "# TYPE focus_connections_closed_total counter\nfocus_connections_closed_total %ld\n",
        s.requests, s.completed, s.cancelled, (long)sv->http_requests, (long)sv->http_errors,
        s.prompt_tokens, s.cached_tokens, s.completion_tokens, s.ttft_sum, s.ttft_count, s.queued,
        s.busy, s.slots, s.steps, s.step_rows, open, kicked);
    return send_text(c, 200, "text/plain; version=0.0.4", b, NULL);
}

/* ------------------------------------------------------------------ dispatch */

/* The API key compared in time that does not depend on where it differs (only on its length). */
static int same_key(const char* got, const char* key) {
    const size_t gl = strlen(got), kl = strlen(key);
    unsigned char d = gl != kl;
    for (size_t i = 0; i < kl; i++) d |= (unsigned char)(key[i] ^ (i < gl ? got[i] : 0));
    return d == 0;
}

/* A key twice in one object, anywhere in the tree (1: found). */
static int duplicate_key(const cJSON* j, const char** name) {
    for (const cJSON* x = j ? j->child : NULL; x; x = x->next) {
        if (cJSON_IsObject(j))
            for (const cJSON* y = x->next; y; y = y->next)
                if (x->string && y->string && !strcmp(x->string, y->string)) {
                    *name = x->string;
                    return 1;
                }
        if (duplicate_key(x, name)) return 1;
    }
    return 0;
}

/* The body as one JSON object, strictly: nothing after it, no key twice in an object, no NUL
 * (raw or escaped) that would cut a C string short. NULL with the reason otherwise. */
static cJSON* parse_body(const char* b, size_t n, char* why, size_t wl) {
    if (!b || !n) {
        snprintf(why, wl, "the body must be a JSON object (it is empty)");
        return NULL;
    }
    if (memchr(b, 0, n)) {
        snprintf(why, wl, "the body holds a NUL byte");
        return NULL;
    }
    for (size_t i = 0; i + 6 <= n; i++) /* \u0000 in a string (a backslash itself escaped is \\) */
        if (b[i] == '\\') {
            if (!strncasecmp(b + i + 1, "u0000", 5)) {
                snprintf(why, wl, "a JSON string holds \\u0000 (NUL), which is not accepted");
                return NULL;
            }
            i++; /* the escaped character */
        }
    const char* end = NULL;
    cJSON* j = cJSON_ParseWithLengthOpts(b, n, &end, 0);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        snprintf(why, wl, "the body must be a JSON object");
        return NULL;
    }
    while (end && end < b + n && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end && end < b + n) {
        cJSON_Delete(j);
        snprintf(why, wl, "the body has data after its JSON object (at byte %zu)",
                 (size_t)(end - b));
        return NULL;
    }
    const char* dup = NULL;
    if (duplicate_key(j, &dup)) {
        snprintf(why, wl, "the key \"%.80s\" appears twice in one object", dup);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static int is(const char* url, const char* a, const char* b) {
    return !strcmp(url, a) || (b && !strcmp(url, b));
}

/* GET /props (llama-server's): the server's settings and a request's defaults. */
static enum MHD_Result props(Server* sv, struct MHD_Connection* c) {
    cJSON* r = cJSON_CreateObject();
    cJSON* d = cJSON_AddObjectToObject(r, "default_generation_settings");
    cJSON_AddNumberToObject(d, "n_ctx", sv->o.ctx);
    cJSON* p = cJSON_AddObjectToObject(d, "params");
    const Sampling s = sampling_defaults();
    cJSON_AddNumberToObject(p, "n_predict", 16);
    cJSON_AddNumberToObject(p, "temperature", s.temperature);
    cJSON_AddNumberToObject(p, "top_k", s.top_k);
    cJSON_AddNumberToObject(p, "top_p", s.top_p);
    cJSON_AddNumberToObject(p, "min_p", s.min_p);
    cJSON_AddNumberToObject(p, "repeat_penalty", s.repeat_penalty);
    cJSON_AddNumberToObject(p, "repeat_last_n", s.repeat_last_n);
    cJSON_AddNumberToObject(p, "frequency_penalty", s.frequency_penalty);
    cJSON_AddNumberToObject(p, "presence_penalty", s.presence_penalty);
    cJSON_AddNumberToObject(r, "total_slots", sv->o.parallel);
    cJSON_AddStringToObject(r, "model_alias", sv->o.name);
    cJSON_AddStringToObject(r, "chat_template", chat_template_name(&sv->ct));
    cJSON_AddNumberToObject(r, "n_vocab", sv->m->cfg.V);
    cJSON_AddNumberToObject(r, "queue", sv->o.queue);
    cJSON_AddNumberToObject(r, "max_body", (double)sv->o.max_body);
    cJSON_AddNumberToObject(r, "timeout", sv->o.timeout_s);
    cJSON_AddStringToObject(r, "build_info", "focus");
    return send_json(c, 200, r);
}

/* GET /slots (llama-server's): each slot's cache and running request. */
static enum MHD_Result slots(Server* sv, struct MHD_Connection* c) {
    SlotInfo si[64];
    const int n = engine_slots(sv->e, si, 64);
    cJSON* r = cJSON_CreateArray();
    for (int i = 0; i < n && i < 64; i++) {
        cJSON* o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", si[i].id);
        cJSON_AddNumberToObject(o, "n_ctx", sv->o.ctx);
        cJSON_AddBoolToObject(o, "is_processing", si[i].busy);
        cJSON_AddNumberToObject(o, "n_cached", si[i].cached);
        cJSON_AddNumberToObject(o, "n_reusable", si[i].reusable);
        if (si[i].busy) {
            cJSON* t = cJSON_AddObjectToObject(o, "task");
            cJSON_AddStringToObject(t, "state", si[i].filling ? "prompt" : "generating");
            cJSON_AddNumberToObject(t, "n_prompt_tokens", si[i].prompt_tokens);
            cJSON_AddNumberToObject(t, "n_prompt_tokens_processed", si[i].prompt_done);
            cJSON_AddNumberToObject(t, "n_decoded", si[i].completion_tokens);
            cJSON_AddNumberToObject(t, "n_predict", si[i].max_tokens);
            cJSON* p = cJSON_AddObjectToObject(t, "params");
            cJSON_AddNumberToObject(p, "temperature", si[i].temperature);
            cJSON_AddNumberToObject(p, "top_k", si[i].top_k);
            cJSON_AddNumberToObject(p, "top_p", si[i].top_p);
            cJSON_AddNumberToObject(p, "min_p", si[i].min_p);
        }
        cJSON_AddItemToArray(r, o);
    }
    return send_json(c, 200, r);
}

/* The guard's record of connection c, in its stage s. */
static void stage(Server* sv, struct MHD_Connection* c, ConnStage s) {
    const union MHD_ConnectionInfo* ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    if (ci && ci->socket_context) conn_stage(sv->guard, ci->socket_context, s);
}

static void notify_connection(void* cls, struct MHD_Connection* c, void** socket_context,
                              enum MHD_ConnectionNotificationCode toe) {
    Server* sv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo* ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? conn_open(sv->guard, ci->connect_fd) : NULL;
    } else if (*socket_context) {
        conn_close(sv->guard, *socket_context);
        *socket_context = NULL;
    }
}

static enum MHD_Result handle(void* cls, struct MHD_Connection* c, const char* url,
                              const char* method, const char* version, const char* upload,
                              size_t* upload_size, void** con_cls) {
    (void)version;
    Server* sv = cls;
    Req* rq = *con_cls;
    if (!rq) { /* the headers: a body announced beyond the limit is refused before it comes */
        rq = *con_cls = callocCheck(1, sizeof(Req));
        stage(sv, c, CONN_BODY); /* the headers came: the body has until the deadline */
        sv->http_requests++;
        atomic_fetch_add(&sv->active, 1);
        const char* cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > sv->o.max_body) {
            rq->too_big = rq->answered = 1;
            return send_error(sv, c, 413, NULL, "body_too_large",
                              "the request body (%s bytes) is over the limit of %zu bytes", cl,
                              sv->o.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_big && rq->len + *upload_size <= sv->o.max_body) {
            if (rq->len + *upload_size + 1 > rq->cap) {
                rq->cap = 2 * (rq->len + *upload_size) + 1024;
                rq->body = reallocCheck(rq->body, rq->cap);
            }
            memcpy(rq->body + rq->len, upload, *upload_size);
            rq->len += *upload_size;
        } else {
            rq->too_big = 1;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!rq->complete) { /* the whole request is here: its answer has no deadline */
        rq->complete = 1;
        stage(sv, c, CONN_ANSWERING);
    }
    if (rq->answered) return MHD_YES;
    if (rq->too_big)
        return send_error(sv, c, 413, NULL, "body_too_large",
                          "the request body is over the limit of %zu bytes", sv->o.max_body);
    const int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (is(url, "/health", "/v1/health")) {
        if (!get) {
            allow_method = "GET";
            return send_error(sv, c, 405, NULL, NULL, "%s: use GET", url);
        }
        if (!sv->ready)
            return send_text(c, 503, "application/json", strdup("{\"status\":\"loading model\"}"),
                             "1");
        return send_text(c, 200, "application/json", strdup("{\"status\":\"ok\"}"), NULL);
    }
    if (sv->o.api_key) {
        const char* auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) || !same_key(auth + 7, sv->o.api_key))
            return send_error(
                sv, c, 401, NULL, "invalid_api_key",
                auth ? "invalid API key" : "an API key is needed (Authorization: Bearer KEY)");
    }
    if (!sv->ready) return send_error(sv, c, 503, NULL, "loading", "the model is loading");
    const int known_get = is(url, "/v1/models", "/models") || is(url, "/metrics", NULL) ||
                          is(url, "/props", NULL) || is(url, "/slots", NULL);
    const int known_post = is(url, "/v1/completions", "/completions") ||
                           is(url, "/v1/chat/completions", "/chat/completions") ||
                           is(url, "/tokenize", NULL) || is(url, "/detokenize", NULL);
    if (!known_get && !known_post)
        return send_error(sv, c, 404, NULL, NULL, "no endpoint %.200s", url);
    if ((known_get && !get) || (known_post && !post)) {
        allow_method = known_get ? "GET" : "POST";
        return send_error(sv, c, 405, NULL, NULL, "%.200s: use %s", url,
                          known_get ? "GET" : "POST");
    }
    if (is(url, "/v1/models", "/models")) return models(sv, c);
    if (is(url, "/metrics", NULL)) return metrics(sv, c);
    if (is(url, "/props", NULL)) return props(sv, c);
    if (is(url, "/slots", NULL)) return slots(sv, c);
    char why[160];
    cJSON* root = parse_body(rq->body, rq->len, why, sizeof why);
    if (!root) return send_error(sv, c, 400, NULL, NULL, "%s", why);
    enum MHD_Result ok;
    if (is(url, "/tokenize", NULL))
        ok = tokenize(sv, c, root);
    else if (is(url, "/detokenize", NULL))
        ok = detokenize(sv, c, root);
    else
        ok = completions(sv, c, root, is(url, "/v1/chat/completions", "/chat/completions"));
    cJSON_Delete(root);
    return ok;
}

static void completed(void* cls, struct MHD_Connection* c, void** con_cls,
                      enum MHD_RequestTerminationCode why) {
    Server* sv = cls;
    (void)why;
    /* idle again: a connection that sends nothing for --timeout seconds is closed */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)sv->o.timeout_s);
    stage(sv, c, CONN_WAITING); /* the next request's headers have until the deadline */
    Req* rq = *con_cls;
    if (!rq) return;
    atomic_fetch_sub(&sv->active, 1);
    free(rq->body);
    free(rq);
    *con_cls = NULL;
}

Server* serve_listen(const ServeOptions* o) {
    Server* sv = callocCheck(1, sizeof(Server));
    sv->o = *o;
    sv->started = (double)time(NULL);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)o->port);
    const char* host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
        fatal("serve: --host must be an IPv4 address (127.0.0.1, 0.0.0.0), got '%s'", o->host);
    sv->guard = conn_guard_new(o->max_conns, o->timeout_s);
    sv->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                 MHD_USE_ITC | MHD_USE_ERROR_LOG,
                             (uint16_t)o->port, NULL, NULL, handle, sv, MHD_OPTION_EXTERNAL_LOGGER,
                             conn_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr*)&a,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->timeout_s,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_conns,
                             MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)o->max_per_client,
                             MHD_OPTION_NOTIFY_COMPLETED, completed, sv,
                             MHD_OPTION_NOTIFY_CONNECTION, notify_connection, sv, MHD_OPTION_END);
    if (!sv->d)
        fatal("serve: cannot listen on %s:%d (in use, or not this machine's)", host, o->port);
    const union MHD_DaemonInfo* di = MHD_get_daemon_info(sv->d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "focus serve: listening on http://%s:%u\n", host, di ? di->port : o->port);
    return sv;
}

void serve_ctx(Server* sv, int ctx) { sv->o.ctx = ctx; }

void serve_ready(Server* sv, Model* m, const Tokenizer* t, const ChatTemplate* ct) {
    sv->m = m, sv->t = t, sv->ct = *ct;
    sv->e = engine_new(m, t, sv->o.parallel, sv->o.ctx, sv->o.queue, sv->o.half);
    sv->ready = 1;
    fprintf(stderr, "focus serve: ready (%s, %d slots of %d tokens, chat template %s)\n",
            sv->o.name, sv->o.parallel, sv->o.ctx, chat_template_name(ct));
}

void serve_stop(Server* sv) {
    MHD_socket s = MHD_quiesce_daemon(sv->d); /* no new connections */
    if (sv->e) engine_stop(sv->e, sv->o.grace);
    /* The engine has finished every job, but an answer or a stream's last events may still be
     * on their way to the client: stopping the daemon now would cut them off. Wait for every
     * begun request to end and the streams to drain (a client that stops reading is not waited
     * for past the grace and a few seconds more). */
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int i = 0; (atomic_load(&sv->streams) > 0 || atomic_load(&sv->active) > 0) &&
                    i < 100 * (sv->o.grace + 5);
         i++)
        nanosleep(&tick, NULL);
    MHD_stop_daemon(sv->d); /* the connections' threads end */
    conn_guard_free(sv->guard);
    if (s != MHD_INVALID_SOCKET) close(s);
    if (sv->e) engine_free(sv->e);
    free(sv);
}
