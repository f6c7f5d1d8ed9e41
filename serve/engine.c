/* engine.c: slots, queue and the model's thread for `focus serve` (see engine.h). */
#include "engine.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct Job {
    int* prompt;
    int np;
    JobParams p;
    Rng rng;
    char* text; /* the generated text so far, cut before a stop string */
    size_t len, cap;
    size_t safe; /* the bytes a client may see: complete characters, no possible stop prefix */
    JobStatus st;
    TokenLogprob* lp; /* per generated token, when the request asked (p.logprobs >= 0) */
    int nlp, lpcap;
    double t_submit;
    int cancelled;
    int refs;  /* the engine's and the client's */
    Job* next; /* in the queue */
};

typedef struct {
    KVCache c;
    int* toks; /* the tokens in the cache, in order */
    int ntok;
    int prompt_n; /* of them, the first ones a prompt evaluation cached (decoded ones differ in
                     their arithmetic, so only these are reused: the same bits as evaluating
                     them again, model_prefill) */
    Job* job;
    int filling; /* the job's prompt is being evaluated, a chunk at a time (c.n of np done) */
    double rate; /* seconds per prompt token in the slot's last chunk (0: none yet) */
    int pending; /* the sampled token to feed next (-1: none) */
    real* saved; /* the logits after the slot's last prompt, for a request repeating it */
    int saved_n; /* that prompt's length (0: none) */
    double last_used;
} Slot;

struct Engine {
    Model* m;
    const Tokenizer* t;
    Slot* s;
    int ns, ctx, qcap, V, eos, eot;
    Job *qhead, *qtail;
    int qlen, inflight; /* queued, and queued or in a slot */
    int rr;             /* the slot whose prompt gets the next chunk (round robin) */
    pthread_mutex_t mu;
    pthread_cond_t work, progress;
    int stopping;
    double deadline;
    pthread_t th;
    Governor gov;
    real* logits;         /* (ns, V) of a batched step */
    real* plogits;        /* (V) after a prompt's chunk */
    TokenLogprob lps[64]; /* of a batched step's rows */
    EngineStats stats;
};

static void job_unref(Job* j) {
    if (--j->refs > 0) return;
    free(j->prompt);
    for (int i = 0; i < j->p.nstop; i++) free(j->p.stop[i]);
    free((void*)j->p.s.bias);
    free(j->text);
    free(j->lp);
    free(j);
}

/* The bytes at the end of s[0..n) that begin a UTF-8 character not yet complete. */
static size_t utf8_tail(const char* s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xc0) == 0x80) continue; /* a continuation byte: look further back */
        const size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* How much of the job's text may be shown: all of it once it ended; else not the end of a
 * character still incomplete nor an end that is the beginning of a stop string. */
static void update_safe(Job* j) {
    if (j->st.finish != FINISH_NONE) {
        j->safe = j->len;
        return;
    }
    size_t hold = utf8_tail(j->text, j->len);
    for (int i = 0; i < j->p.nstop; i++) {
        const size_t sl = strlen(j->p.stop[i]);
        for (size_t k = sl - 1; k > hold; k--) /* a proper prefix of stop i, k bytes long */
            if (k <= j->len && !memcmp(j->text + j->len - k, j->p.stop[i], k)) {
                hold = k;
                break;
            }
    }
    j->safe = j->len - hold;
}

/* The job of slot s ends (engine lock held): its slot freed, its client told. */
static void finish_job(Engine* e, Slot* s, Finish why) {
    Job* j = s->job;
    j->st.finish = why;
    update_safe(j);
    e->stats.completed += why != FINISH_CANCELLED;
    e->stats.cancelled += why == FINISH_CANCELLED;
    s->job = NULL;
    s->pending = -1;
    s->filling = 0;
    e->inflight--;
    s->last_used = now_seconds();
    job_unref(j);
    pthread_cond_broadcast(&e->progress);
}

/* The token the job of slot s sampled (engine lock held): its text, stop strings, limits; lp:
 * its log-probabilities (NULL: not asked for). */
static void take_token(Engine* e, Slot* s, int tok, const TokenLogprob* lp) {
    Job* j = s->job;
    if (j->st.ttft < 0) {
        j->st.ttft = now_seconds() - j->t_submit;
        e->stats.ttft_sum += j->st.ttft;
        e->stats.ttft_count++;
    }
    if (tok == e->eos || tok == e->eot) {
        finish_job(e, s, FINISH_STOP);
        return;
    }
    j->st.completion_tokens++;
    e->stats.completion_tokens++;
    size_t n;
    char* piece = tokenizer_decode(e->t, &tok, 1, &n);
    if (j->len + n + 1 > j->cap) {
        j->cap = 2 * (j->len + n + 1) + 64;
        j->text = reallocCheck(j->text, j->cap);
    }
    const size_t before = j->len;
    if (lp) {
        if (j->nlp == j->lpcap) {
            j->lpcap = 2 * j->lpcap + 16;
            j->lp = reallocCheck(j->lp, sizeof(TokenLogprob) * (size_t)j->lpcap);
        }
        j->lp[j->nlp] = *lp;
        j->lp[j->nlp++].off = before;
    }
    memcpy(j->text + j->len, piece, n);
    j->len += n;
    j->text[j->len] = 0;
    free(piece);
    for (int i = 0; i < j->p.nstop; i++) { /* a stop string that ends in the new bytes */
        const size_t sl = strlen(j->p.stop[i]);
        const size_t from = before + 1 > sl ? before + 1 - sl : 0;
        const char* at = strstr(j->text + from, j->p.stop[i]);
        if (at) {
            j->len = (size_t)(at - j->text);
            j->text[j->len] = 0;
            finish_job(e, s, FINISH_STOP);
            return;
        }
    }
    if (j->st.completion_tokens >= j->p.max_tokens || s->c.n >= s->c.cap) {
        finish_job(e, s, FINISH_LENGTH); /* the limit, or a full cache: no room to feed it */
        return;
    }
    s->pending = tok;
    update_safe(j);
    pthread_cond_broadcast(&e->progress);
}

/* The next token of slot s's job from logits (engine lock not held), and its log-probabilities
 * in *lp when the request asked for them (returns lp, or NULL). */
static int sample_slot(Engine* e, Slot* s, const real* logits, TokenLogprob* lp, int* tok) {
    Job* j = s->job;
    const int np = j->np, nr = s->ntok;
    *tok = sample_token(logits, e->V, &j->p.s, s->toks, nr, s->toks + np, nr - np, &j->rng);
    if (j->p.logprobs < 0) return 0;
    lp->id = *tok;
    lp->ntop = j->p.logprobs < e->V ? j->p.logprobs : e->V;
    lp->lp = (float)token_logprobs(logits, e->V, *tok, lp->ntop, lp->top_id, lp->top_lp);
    return 1;
}

/* The seconds a prompt's chunk may take: a running stream waits at most this long for its next
 * token, a new request for its turn. */
#define CHUNK_SECONDS 0.25
/* ... and the tokens it takes at least, and its multiple: a chunk has a fixed cost (every weight
 * read once for its products: about 20-35 ms for SmolLM2 on 2 cores, docs/RESULTS.md), and the
 * attention over the cache runs in products of 32 rows (kernels/sparse.c): 20 rows cost what 32
 * do (with 64-row products, chunks of 40 rows made a prompt of 8K tokens 1.4x slower than chunks
 * of whole products) */
#define CHUNK_MIN 32

/* The tokens slot s's cache shares with the prompt and may keep: its prompt-evaluated prefix. */
static int reusable(const Slot* s, const Job* j) {
    int lcp = 0;
    while (lcp < s->prompt_n && lcp < j->np && s->toks[lcp] == j->prompt[lcp]) lcp++;
    return lcp;
}

/* Job j takes slot s (engine lock held): the cache keeps the longest prefix it shares with the
 * prompt (at least half of the prompt, as llama-server's prompt similarity; else none), and the
 * rest of the prompt is evaluated chunk by chunk. A repeated prompt's logits are kept. */
static void assign_job(Engine* e, Slot* s, Job* j) {
    const int lcp = reusable(s, j), np = j->np;
    int keep = 2 * lcp >= np ? lcp : 0;
    if (keep == np && s->saved_n != np) keep = np - 1; /* the last row again, for its logits */
    if (keep < np) s->saved_n = 0; /* (the saved logits are the cached prompt's only) */
    kvcache_truncate(&s->c, keep);
    memcpy(s->toks, j->prompt, sizeof(int) * (size_t)np);
    s->ntok = s->prompt_n = keep;
    j->st.cached_tokens = keep;
    s->job = j;
    s->filling = 1;
    s->pending = -1;
}

/* One chunk of slot s's prompt (engine lock not held): as many tokens as the slot's last chunk
 * says take CHUNK_SECONDS. Returns the first sampled token once the prompt is done, else -1;
 * -2 when the chunk cannot be fed. */
static int prompt_chunk(Engine* e, Slot* s, Job* j, TokenLogprob* lp, int* has_lp) {
    const int np = j->np, done = s->c.n;
    if (done == np) { /* the slot's last prompt again: its logits kept */
        memcpy(e->plogits, s->saved, sizeof(real) * e->V);
    } else {
        int k = s->rate > 0 ? (int)(CHUNK_SECONDS / s->rate) : CHUNK_MIN;
        k = k < CHUNK_MIN ? CHUNK_MIN : k > 4096 ? 4096 : k;
        k -= k % CHUNK_MIN; /* whole tiles of the attention's 32-row products */
        if (k > np - done) k = np - done;
        const double t0 = now_seconds();
        char why[160];
        if (!model_prefill_checked(e->m, &s->c, j->prompt + done, k, e->plogits, 0, why,
                                   sizeof why)) { /* (the request's checks keep it from here) */
            fprintf(stderr, "focus serve: a prompt could not be evaluated: %s\n", why);
            return -2;
        }
        s->rate = (now_seconds() - t0) / k;
        s->ntok = s->prompt_n = s->c.n;
        if (s->c.n < np) return -1;
        memcpy(s->saved, e->plogits, sizeof(real) * e->V);
        s->saved_n = np;
    }
    int tok;
    *has_lp = sample_slot(e, s, e->plogits, lp, &tok);
    return tok;
}

static void* engine_main(void* arg) {
    Engine* e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        if (e->stopping && now_seconds() > e->deadline) /* the grace is over: cancel the rest */
            for (int i = 0; i < e->ns; i++)
                if (e->s[i].job) e->s[i].job->cancelled = 1;
        for (int i = 0; i < e->ns; i++) /* the jobs whose client left */
            if (e->s[i].job && e->s[i].job->cancelled) finish_job(e, &e->s[i], FINISH_CANCELLED);
        while (e->qhead) { /* queued jobs into free slots */
            Slot* best = NULL;
            int best_lcp = -1;
            Job* j = e->qhead;
            for (int i = 0; i < e->ns; i++) {
                Slot* s = &e->s[i];
                if (s->job) continue;
                int lcp = reusable(s, j);
                if (2 * lcp < j->np) lcp = 0; /* too little in common: as good as empty */
                if (lcp > best_lcp || (lcp == best_lcp && s->last_used < best->last_used))
                    best = s, best_lcp = lcp;
            }
            if (!best) break;
            e->qhead = j->next;
            if (!e->qhead) e->qtail = NULL;
            e->qlen--;
            assign_job(e, best, j);
            e->stats.prompt_tokens += j->np;
            e->stats.cached_tokens += j->st.cached_tokens;
        }
        int active = 0;
        for (int i = 0; i < e->ns; i++) active += e->s[i].job != NULL;
        e->stats.busy = active;
        e->stats.queued = e->qlen;
        if (!active) {
            if (e->stopping) break;
            pthread_cond_wait(&e->work, &e->mu);
            continue;
        }
        /* one chunk of one prompt (the slots take turns), then a decode step for the others:
         * a long prompt neither holds the running streams nor a short prompt behind it */
        for (int k = 0; k < e->ns; k++) {
            Slot* s = &e->s[(e->rr + k) % e->ns];
            if (!s->job || !s->filling) continue;
            e->rr = (e->rr + k + 1) % e->ns;
            Job* j = s->job;
            pthread_mutex_unlock(&e->mu);
            TokenLogprob lp;
            int has_lp = 0;
            const int tok = prompt_chunk(e, s, j, &lp, &has_lp);
            pthread_mutex_lock(&e->mu);
            if (j->cancelled) {
                finish_job(e, s, FINISH_CANCELLED);
            } else if (tok == -2) {
                finish_job(e, s, FINISH_LENGTH);
            } else if (tok >= 0) {
                s->filling = 0;
                take_token(e, s, tok, has_lp ? &lp : NULL);
            }
            break;
        }
        /* one batched step for every slot with a token to feed */
        KVCache* cs[64];
        int toks[64], who[64], n = 0;
        for (int i = 0; i < e->ns && n < 64; i++) {
            Slot* s = &e->s[i];
            if (!s->job || s->pending < 0 || s->job->cancelled) continue;
            cs[n] = &s->c, toks[n] = s->pending, who[n++] = i;
        }
        if (!n) continue;
        pthread_mutex_unlock(&e->mu);
        char why[160];
        if (!model_decode_batch(e->m, cs, toks, n, e->logits, &e->gov, why, sizeof why)) {
            /* (take_token ends a request whose cache is full before it gets here) */
            fprintf(stderr, "focus serve: a decode step failed: %s; its requests end\n", why);
            pthread_mutex_lock(&e->mu);
            for (int r = 0; r < n; r++) finish_job(e, &e->s[who[r]], FINISH_LENGTH);
            continue;
        }
        int next[64], has_lp[64];
        for (int r = 0; r < n; r++) {
            Slot* s = &e->s[who[r]];
            s->toks[s->ntok++] = toks[r];
            s->pending = -1;
            has_lp[r] = sample_slot(e, s, e->logits + (size_t)r * e->V, &e->lps[r], &next[r]);
        }
        pthread_mutex_lock(&e->mu);
        e->stats.steps++;
        e->stats.step_rows += n;
        for (int r = 0; r < n; r++) {
            Slot* s = &e->s[who[r]];
            if (s->job->cancelled)
                finish_job(e, s, FINISH_CANCELLED);
            else
                take_token(e, s, next[r], has_lp[r] ? &e->lps[r] : NULL);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

Engine* engine_new(Model* m, const Tokenizer* t, int slots, int ctx, int queue, int half) {
    if (slots < 1 || slots > 64) fatal("serve: --parallel must be 1 .. 64, got %d", slots);
    Engine* e = callocCheck(1, sizeof(Engine));
    e->m = m, e->t = t, e->ns = slots, e->ctx = ctx, e->qcap = queue, e->V = m->cfg.V;
    e->eos = tokenizer_eos(t), e->eot = tokenizer_eot(t);
    e->s = callocCheck((size_t)slots, sizeof(Slot));
    for (int i = 0; i < slots; i++) {
        Slot* s = &e->s[i];
        kvcache_init(&s->c, m, ctx, half); /* memory is touched only as tokens arrive */
        s->c.gov.on = 0;                   /* the engine governs its batched steps */
        s->toks = mallocCheck(sizeof(int) * (size_t)ctx);
        s->saved = mallocCheck(sizeof(real) * (size_t)e->V);
        s->pending = -1;
    }
    e->logits = mallocCheck(sizeof(real) * (size_t)slots * e->V);
    e->plogits = mallocCheck(sizeof(real) * (size_t)e->V);
    governor_init(&e->gov);
    e->stats.slots = slots;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->progress, NULL);
    if (pthread_create(&e->th, NULL, engine_main, e)) fatal("serve: cannot start a thread");
    return e;
}

void engine_stop(Engine* e, double grace) {
    pthread_mutex_lock(&e->mu);
    if (e->stopping) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    e->stopping = 1;
    e->deadline = now_seconds() + grace;
    while (e->qhead) { /* the queued jobs never start */
        Job* j = e->qhead;
        e->qhead = j->next;
        j->st.finish = FINISH_CANCELLED;
        e->stats.cancelled++;
        e->inflight--;
        job_unref(j);
    }
    e->qtail = NULL;
    e->qlen = 0;
    pthread_cond_broadcast(&e->work);
    pthread_cond_broadcast(&e->progress);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
}

void engine_free(Engine* e) {
    engine_stop(e, 0);
    for (int i = 0; i < e->ns; i++) {
        kvcache_free(&e->s[i].c);
        free(e->s[i].toks);
        free(e->s[i].saved);
    }
    free(e->s);
    free(e->logits);
    free(e->plogits);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->work);
    pthread_cond_destroy(&e->progress);
    free(e);
}

int engine_ctx(const Engine* e) { return e->ctx; }

Job* engine_submit(Engine* e, int* prompt, int np, JobParams* p, int* why) {
    Job* j = callocCheck(1, sizeof(Job));
    j->prompt = prompt, j->np = np, j->p = *p;
    j->refs = 2;
    j->st.ttft = -1;
    j->st.prompt_tokens = np;
    j->t_submit = now_seconds();
    rng_seed(&j->rng, p->seed);
    pthread_mutex_lock(&e->mu);
    /* room: a free slot or a place in the queue (the jobs in slots and queued counted alike,
     * so that a burst on an idle server is not refused before the engine moves it) */
    *why = e->stopping ? 2 : e->inflight >= e->ns + e->qcap ? 1 : 0;
    if (*why) {
        pthread_mutex_unlock(&e->mu);
        j->refs = 1;
        job_unref(j);
        return NULL;
    }
    if (e->qtail)
        e->qtail->next = j;
    else
        e->qhead = j;
    e->qtail = j;
    e->qlen++;
    e->inflight++;
    e->stats.requests++;
    e->stats.queued = e->qlen;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return j;
}

size_t engine_wait(Engine* e, Job* j, size_t from, int ms, char** text, JobStatus* st) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&e->mu);
    while (j->safe <= from && j->st.finish == FINISH_NONE)
        if (pthread_cond_timedwait(&e->progress, &e->mu, &until) == ETIMEDOUT) break;
    const size_t safe = j->safe;
    if (text) {
        const size_t n = safe > from ? safe - from : 0;
        *text = mallocCheck(n + 1);
        if (n) memcpy(*text, j->text + from, n);
        (*text)[n] = 0;
    }
    if (st) *st = j->st;
    pthread_mutex_unlock(&e->mu);
    return safe;
}

int engine_slots(Engine* e, SlotInfo* out, int max) {
    pthread_mutex_lock(&e->mu);
    const int n = e->ns < max ? e->ns : max;
    for (int i = 0; i < n; i++) {
        const Slot* s = &e->s[i];
        const Job* j = s->job;
        out[i] = (SlotInfo){.id = i,
                            .busy = j != NULL,
                            .filling = j && s->filling,
                            .cached = s->ntok,
                            .reusable = s->prompt_n};
        if (j) {
            out[i].prompt_tokens = j->np;
            out[i].prompt_done = s->filling ? s->c.n : j->np;
            out[i].completion_tokens = j->st.completion_tokens;
            out[i].max_tokens = j->p.max_tokens;
            out[i].temperature = j->p.s.temperature, out[i].top_p = j->p.s.top_p;
            out[i].min_p = j->p.s.min_p, out[i].top_k = j->p.s.top_k;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return e->ns;
}

int engine_logprobs(Engine* e, Job* j, size_t from, size_t to, TokenLogprob** out) {
    pthread_mutex_lock(&e->mu);
    int a = 0, n = 0;
    while (a < j->nlp && j->lp[a].off < from) a++;
    while (a + n < j->nlp && j->lp[a + n].off < to) n++;
    *out = n ? mallocCheck(sizeof(TokenLogprob) * (size_t)n) : NULL;
    if (n) memcpy(*out, j->lp + a, sizeof(TokenLogprob) * (size_t)n);
    pthread_mutex_unlock(&e->mu);
    return n;
}

void engine_cancel(Engine* e, Job* j) {
    pthread_mutex_lock(&e->mu);
    if (j->st.finish == FINISH_NONE) {
        j->cancelled = 1;
        /* still queued: out of the queue now */
        for (Job **p = &e->qhead, *prev = NULL; *p; prev = *p, p = &(*p)->next)
            if (*p == j) {
                *p = j->next;
                if (e->qtail == j) e->qtail = prev;
                e->qlen--;
                e->inflight--;
                j->st.finish = FINISH_CANCELLED;
                e->stats.cancelled++;
                job_unref(j);
                break;
            }
        pthread_cond_signal(&e->work);
    }
    pthread_mutex_unlock(&e->mu);
}

void engine_release(Engine* e, Job* j) {
    pthread_mutex_lock(&e->mu);
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
}

EngineStats engine_stats(Engine* e) {
    pthread_mutex_lock(&e->mu);
    EngineStats s = e->stats;
    pthread_mutex_unlock(&e->mu);
    return s;
}
