/* tokenizer.c: byte-level BPE and SentencePiece-style merging by score (see tokenizer.h). */
#define _GNU_SOURCE /* memmem */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include <pcre2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../io/gguf.h"
#include "../kernels/common.h"
#include "../io/io.h"
#include "text.h"

/* The GPT-2 pre-tokenizer pattern: contractions, letters, numbers, other symbols, each
 * optionally led by one space; then runs of whitespace (not eating the space before a word). */
static const char* GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    uint64_t key; /* (left << 32) | right, 0 = empty slot (ids are stored + 1) */
    int rank, merged;
} PairSlot;

typedef struct {
    char* bytes;
    int len;
} Tok;

struct Tokenizer {
    int V;
    Tok* tok;       /* raw bytes of every token */
    int* str_slots; /* open-addressing table: token bytes -> id (-1 empty) */
    size_t str_cap;
    PairSlot* pairs; /* merge table */
    size_t pair_cap;
    int byte_tok[256]; /* id of each single-byte token, -1: none (replaced by U+FFFD's bytes) */
    int split_digits;  /* SmolLM / StarCoder pre-tokenizer */
    char pre[32];
    int eot, eos, bos;
    pcre2_code* re;
    pcre2_code* re_digit;
    /* SentencePiece ("llama" in GGUF): tok holds each piece's text (spaces as U+2581), out the
     * bytes it decodes to; score its merge priority; user (n_user ids, longest first) the
     * user-defined pieces matched in the raw text before merging */
    int spm;
    float* score;
    Tok* out;
    int* user;
    int n_user;
};

/* ---------------------------------------------------------------- byte <-> unicode */

/* GPT-2 maps each byte to a printable code point: the printable Latin-1 bytes ('!'..'~',
 * 0xA1..0xAC, 0xAE..0xFF) to themselves, the other 68 bytes to 256, 257, ... in byte order. */
static void byte_unicode_tables(int* b2u, int* u2b /* size 512 */) {
    int n = 0;
    for (int i = 0; i < 512; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        b2u[b] = printable ? b : 256 + n++;
        u2b[b2u[b]] = b;
    }
}

/* Decode a token string written in GPT-2's byte-to-unicode alphabet back to raw bytes. If any
 * code point is outside the alphabet (added tokens), the UTF-8 text is kept as it is. */
static Tok unicode_to_bytes(const char* s, size_t n, const int* u2b) {
    Tok t = {mallocCheck(n + 1), 0};
    size_t i = 0;
    while (i < n) {
        unsigned c = (unsigned char)s[i];
        int cp, len;
        if (c < 0x80)
            cp = c, len = 1;
        else if ((c >> 5) == 6 && i + 1 < n)
            cp = ((c & 0x1f) << 6) | (s[i + 1] & 0x3f), len = 2;
        else
            cp = -1, len = 1;
        if (cp < 0 || cp >= 512 || u2b[cp] < 0) {
            memcpy(t.bytes, s, n);
            t.len = (int)n;
            return t;
        }
        t.bytes[t.len++] = (char)u2b[cp];
        i += (size_t)len;
    }
    return t;
}

/* ---------------------------------------------------------------- hash tables */

static int str_lookup(const Tokenizer* t, const char* s, int n) {
    size_t i = fnv1a(FNV1A_START, s, (size_t)n) & (t->str_cap - 1);
    while (t->str_slots[i] >= 0) {
        const Tok* k = &t->tok[t->str_slots[i]];
        if (k->len == n && !memcmp(k->bytes, s, (size_t)n)) return t->str_slots[i];
        i = (i + 1) & (t->str_cap - 1);
    }
    return -1;
}

static void str_insert(Tokenizer* t, int id) {
    const Tok* k = &t->tok[id];
    if (str_lookup(t, k->bytes, k->len) >= 0) return; /* first id wins for duplicate strings */
    size_t i = fnv1a(FNV1A_START, k->bytes, (size_t)k->len) & (t->str_cap - 1);
    while (t->str_slots[i] >= 0) i = (i + 1) & (t->str_cap - 1);
    t->str_slots[i] = id;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static const PairSlot* pair_lookup(const Tokenizer* t, int a, int b) {
    uint64_t key = ((uint64_t)(a + 1) << 32) | (uint64_t)(b + 1);
    size_t i = mix64(key) & (t->pair_cap - 1);
    while (t->pairs[i].key) {
        if (t->pairs[i].key == key) return &t->pairs[i];
        i = (i + 1) & (t->pair_cap - 1);
    }
    return NULL;
}

static void pair_insert(Tokenizer* t, int a, int b, int rank, int merged) {
    if (pair_lookup(t, a, b)) return; /* keep the higher-priority rule */
    uint64_t key = ((uint64_t)(a + 1) << 32) | (uint64_t)(b + 1);
    size_t i = mix64(key) & (t->pair_cap - 1);
    while (t->pairs[i].key) i = (i + 1) & (t->pair_cap - 1);
    t->pairs[i] = (PairSlot){key, rank, merged};
}

static size_t pow2_at_least(size_t n) {
    size_t c = 1;
    while (c < n) c <<= 1;
    return c;
}

/* ---------------------------------------------------------------- construction */

static Tokenizer* tok_new(int V) {
    Tokenizer* t = callocCheck(1, sizeof(Tokenizer));
    t->V = V;
    t->tok = callocCheck((size_t)V, sizeof(Tok));
    t->str_cap = pow2_at_least((size_t)V * 2 + 16);
    t->str_slots = mallocCheck(sizeof(int) * t->str_cap);
    for (size_t i = 0; i < t->str_cap; i++) t->str_slots[i] = -1;
    t->eot = t->eos = t->bos = -1;
    return t;
}

/* One merge rule "A B" (byte-unicode alphabet) at priority rank. */
static void add_merge(Tokenizer* t, const char* s, size_t n, int rank, const int* u2b,
                      const char* src) {
    const char* sp = memchr(s, ' ', n);
    if (!sp) fatal("%s: merge rule %d ('%.*s') has no space", src, rank, (int)(n < 40 ? n : 40), s);
    Tok a = unicode_to_bytes(s, (size_t)(sp - s), u2b);
    Tok b = unicode_to_bytes(sp + 1, n - (size_t)(sp - s) - 1, u2b);
    char* ab = mallocCheck((size_t)(a.len + b.len) + 1);
    memcpy(ab, a.bytes, (size_t)a.len);
    memcpy(ab + a.len, b.bytes, (size_t)b.len);
    int ia = str_lookup(t, a.bytes, a.len), ib = str_lookup(t, b.bytes, b.len);
    int iab = str_lookup(t, ab, a.len + b.len);
    /* A rule whose parts or result are not tokens can never fire; skip it as reference
     * implementations do. */
    if (ia >= 0 && ib >= 0 && iab >= 0) pair_insert(t, ia, ib, rank, iab);
    free(a.bytes);
    free(b.bytes);
    free(ab);
}

static void finish(Tokenizer* t, const char* pre, const char* src) {
    /* Some vocabularies (SmolLM2's) lack tokens for a few bytes: control characters and bytes
     * that never occur in UTF-8. Such bytes are encoded as U+FFFD (tokenizer.h), whose bytes
     * (EF BF BD) every byte-level vocabulary that can encode UTF-8 text holds. */
    int have = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_tok[b] = str_lookup(t, &c, 1);
        have += t->byte_tok[b] >= 0;
    }
    if (have < 128)
        fatal("%s: only %d of 256 single-byte tokens exist; not a byte-level BPE vocabulary", src,
              have);
    if (have < 256 && (t->byte_tok[0xef] < 0 || t->byte_tok[0xbf] < 0 || t->byte_tok[0xbd] < 0))
        fatal("%s: %d byte tokens are missing, and so are those of U+FFFD to stand for them", src,
              256 - have);
    snprintf(t->pre, sizeof t->pre, "%s", pre);
    int eot = str_lookup(t, "<|endoftext|>", 13);
    if (eot >= 0) t->eot = eot;
    int err;
    PCRE2_SIZE off;
    t->re = pcre2_compile((PCRE2_SPTR)GPT2_PATTERN, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    t->re_digit = pcre2_compile((PCRE2_SPTR) "\\p{N}", PCRE2_ZERO_TERMINATED,
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
    if (!t->re || !t->re_digit)
        fatal("internal: pre-tokenizer regex failed to compile (error %d)", err);
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);
    pcre2_jit_compile(t->re_digit, PCRE2_JIT_COMPLETE);
}

/* ---------------------------------------------------------------- SentencePiece */

/* The GGUF token types (llama.cpp's numbering) */
enum {
    TOKTYPE_NORMAL = 1,
    TOKTYPE_UNKNOWN = 2,
    TOKTYPE_CONTROL = 3,
    TOKTYPE_USER = 4,
    TOKTYPE_UNUSED = 5,
    TOKTYPE_BYTE = 6
};

/* A numeric GGUF array of n elements of type want, or fatal naming the key. */
static const uint8_t* gguf_numbers(const GGUFFile* f, const char* path, const char* key,
                                   uint32_t want, uint64_t n) {
    const GGUFKV* kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_VAL_ARRAY || kv->arr_type != want || kv->arr_n != n)
        fatal("%s: metadata key '%s' is missing or malformed (%llu entries expected)", path, key,
              (unsigned long long)n);
    return kv->val + 12;
}

typedef struct {
    int len, id;
} LenId;

static int by_length_desc(const void* a, const void* b) {
    const LenId *x = a, *y = b;
    return x->len != y->len ? y->len - x->len : x->id - y->id;
}

/* A SentencePiece vocabulary from GGUF (tokenizer.ggml.model = "llama"): pieces, scores and
 * token types; byte fallback through the 256 byte pieces <0x00> .. <0xFF>. */
static Tokenizer* load_spm(const GGUFFile* f, const char* path) {
    const GGUFKV* toks = gguf_find(f, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_VAL_ARRAY || toks->arr_type != GGUF_VAL_STRING ||
        toks->arr_n < 256 || toks->arr_n > (1u << 24))
        fatal("%s: metadata key 'tokenizer.ggml.tokens' is missing or malformed", path);
    const int V = (int)toks->arr_n;
    const uint8_t* sc = gguf_numbers(f, path, "tokenizer.ggml.scores", GGUF_VAL_FLOAT32, V);
    const uint8_t* ty = gguf_numbers(f, path, "tokenizer.ggml.token_type", GGUF_VAL_INT32, V);
    uint64_t v = 0;
    if (!gguf_get_u64(f, "tokenizer.ggml.add_space_prefix", &v) && v)
        fatal(
            "%s: metadata key 'tokenizer.ggml.add_space_prefix' = true is not supported (the "
            "SentencePiece reader adds no space prefix)",
            path);
    Tokenizer* t = tok_new(V);
    t->spm = 1;
    t->score = mallocCheck(sizeof(float) * (size_t)V);
    t->out = callocCheck((size_t)V, sizeof(Tok));
    t->user = mallocCheck(sizeof(int) * (size_t)V);
    const uint8_t* pos = NULL;
    for (int b = 0; b < 256; b++) t->byte_tok[b] = -1;
    for (int i = 0; i < V; i++) {
        uint64_t len;
        const char* p = gguf_arr_str_next(f, toks, &pos, &len);
        if (len > INT_MAX) fatal("%s: token %d is too long", path, i);
        t->tok[i].bytes = mallocCheck(len + 1);
        memcpy(t->tok[i].bytes, p, len);
        t->tok[i].bytes[len] = 0;
        t->tok[i].len = (int)len;
        str_insert(t, i);
        memcpy(&t->score[i], sc + 4 * (size_t)i, 4);
        int32_t type;
        memcpy(&type, ty + 4 * (size_t)i, 4);
        /* what decoding writes: a byte piece its byte, a control piece nothing, a user piece
         * its text, a normal one its text with U+2581 as a space */
        Tok* o = &t->out[i];
        o->bytes = mallocCheck(len + 1);
        unsigned hex;
        if (type == TOKTYPE_BYTE && len == 6 && sscanf(p, "<0x%2X>", &hex) == 1) {
            o->bytes[0] = (char)hex, o->len = 1;
            t->byte_tok[hex] = i;
        } else if (type == TOKTYPE_CONTROL || type == TOKTYPE_UNKNOWN || type == TOKTYPE_UNUSED) {
            o->len = 0;
        } else {
            for (uint64_t k = 0; k < len; k++) {
                if (k + 2 < len && !memcmp(p + k, "\xe2\x96\x81", 3)) {
                    o->bytes[o->len++] = ' ';
                    k += 2;
                } else {
                    o->bytes[o->len++] = p[k];
                }
            }
            if (type == TOKTYPE_USER && len) t->user[t->n_user++] = i;
        }
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_tok[b] < 0)
            fatal("%s: the SentencePiece vocabulary has no byte piece <0x%02X> (byte fallback)",
                  path, b);
    /* longest first: a run of newlines is one piece, not many */
    LenId* li = mallocCheck(sizeof(LenId) * (size_t)(t->n_user + 1));
    for (int k = 0; k < t->n_user; k++) li[k] = (LenId){t->tok[t->user[k]].len, t->user[k]};
    qsort(li, (size_t)t->n_user, sizeof(LenId), by_length_desc);
    for (int k = 0; k < t->n_user; k++) t->user[k] = li[k].id;
    free(li);
    snprintf(t->pre, sizeof t->pre, "spm");
    if (gguf_get_u64(f, "tokenizer.ggml.eos_token_id", &v) == 0 && v < (uint64_t)V)
        t->eos = t->eot = (int)v;
    uint64_t add_bos = 0;
    gguf_get_u64(f, "tokenizer.ggml.add_bos_token", &add_bos);
    if (add_bos && gguf_get_u64(f, "tokenizer.ggml.bos_token_id", &v) == 0 && v < (uint64_t)V)
        t->bos = (int)v;
    return t;
}

static Tokenizer* load_gguf_tokenizer(const char* path) {
    GGUFFile f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err)) fatal("%s: %s", path, err);
    GGUFFile* held = gguf_hold(&f); /* closed by fatal_release below */
    uint64_t n;
    const char* model = gguf_get_str(&f, "tokenizer.ggml.model", &n);
    if (!model)
        fatal(
            "%s: the file carries no tokenizer (tokenizer.ggml.model is missing); pass --tokenizer",
            path);
    if (n == 5 && !memcmp(model, "llama", 5)) {
        Tokenizer* t = load_spm(&f, path);
        fatal_release(held);
        return t;
    }
    if (n != 4 || memcmp(model, "gpt2", 4))
        fatal(
            "%s: metadata key 'tokenizer.ggml.model' = '%.*s' is not supported (supported: gpt2 "
            "byte-level BPE, llama SentencePiece)",
            path, (int)n, model);
    uint64_t pn = 0;
    const char* pre = gguf_get_str(&f, "tokenizer.ggml.pre", &pn);
    char pres[32] = "gpt-2";
    if (pre) snprintf(pres, sizeof pres, "%.*s", (int)(pn < 31 ? pn : 31), pre);
    int split = 0;
    if (!strcmp(pres, "smollm") || !strcmp(pres, "starcoder") || !strcmp(pres, "refact") ||
        !strcmp(pres, "codeshell") || !strcmp(pres, "command-r"))
        split = 1;
    else if (strcmp(pres, "gpt-2") && strcmp(pres, "default") && strcmp(pres, "gpt2"))
        fatal("%s: pre-tokenizer '%s' is not supported (supported: gpt-2, smollm, starcoder)", path,
              pres);
    const GGUFKV* toks = gguf_find(&f, "tokenizer.ggml.tokens");
    const GGUFKV* merges = gguf_find(&f, "tokenizer.ggml.merges");
    if (!toks || toks->type != GGUF_VAL_ARRAY || toks->arr_type != GGUF_VAL_STRING ||
        toks->arr_n < 256 || toks->arr_n > (1u << 24))
        fatal("%s: tokenizer.ggml.tokens is missing or malformed", path);
    if (!merges || merges->type != GGUF_VAL_ARRAY || merges->arr_type != GGUF_VAL_STRING)
        fatal("%s: tokenizer.ggml.merges is missing or malformed", path);
    int b2u[256], u2b[512];
    byte_unicode_tables(b2u, u2b);
    Tokenizer* t = tok_new((int)toks->arr_n);
    const uint8_t* pos = NULL;
    for (int i = 0; i < t->V; i++) {
        uint64_t len;
        const char* s = gguf_arr_str_next(&f, toks, &pos, &len);
        t->tok[i] = unicode_to_bytes(s, len, u2b);
        str_insert(t, i);
    }
    t->pair_cap = pow2_at_least(merges->arr_n * 2 + 16);
    t->pairs = callocCheck(t->pair_cap, sizeof(PairSlot));
    pos = NULL;
    for (uint64_t r = 0; r < merges->arr_n; r++) {
        uint64_t len;
        const char* s = gguf_arr_str_next(&f, merges, &pos, &len);
        add_merge(t, s, len, (int)r, u2b, path);
    }
    finish(t, pres, path);
    t->split_digits = split;
    uint64_t id;
    if (gguf_get_u64(&f, "tokenizer.ggml.eos_token_id", &id) == 0 && id < (uint64_t)t->V) {
        t->eos = (int)id;
        if (t->eot < 0) t->eot = (int)id;
    }
    uint64_t add_bos = 0;
    gguf_get_u64(&f, "tokenizer.ggml.add_bos_token", &add_bos);
    if (add_bos && gguf_get_u64(&f, "tokenizer.ggml.bos_token_id", &id) == 0 && id < (uint64_t)t->V)
        t->bos = (int)id;
    fatal_release(held);
    return t;
}

static Tokenizer* load_dir_tokenizer(const char* dir) {
    char pe[4096], pm[4096];
    snprintf(pe, sizeof pe, "%s/encoder.json", dir);
    snprintf(pm, sizeof pm, "%s/vocab.bpe", dir);
    size_t ne, nm;
    char* enc = read_file_opt(pe, &ne);
    if (!enc)
        fatal("%s: cannot read the GPT-2 vocabulary (expected encoder.json and vocab.bpe in %s)",
              pe, dir);
    char* mer = read_file_opt(pm, &nm);
    if (!mer) fatal("%s: cannot read the GPT-2 merge rules", pm);
    cJSON* j = cJSON_ParseWithLength(enc, ne);
    if (!j || !cJSON_IsObject(j)) fatal("%s: not a JSON object", pe);
    int V = 0;
    for (cJSON* e = j->child; e; e = e->next) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 24))
            fatal("%s: entry '%s' has no valid id", pe, e->string);
        if ((int)e->valuedouble + 1 > V) V = (int)e->valuedouble + 1;
    }
    int b2u[256], u2b[512];
    byte_unicode_tables(b2u, u2b);
    Tokenizer* t = tok_new(V);
    for (cJSON* e = j->child; e; e = e->next) {
        int id = (int)e->valuedouble;
        free(t->tok[id].bytes);
        t->tok[id] = unicode_to_bytes(e->string, strlen(e->string), u2b);
    }
    for (int i = 0; i < V; i++) {
        if (!t->tok[i].bytes)
            t->tok[i] = (Tok){callocCheck(1, 1), 0}; /* ids absent from the file */
        else
            str_insert(t, i);
    }
    cJSON_Delete(j);
    free(enc);
    size_t lines = 0;
    for (size_t i = 0; i < nm; i++) lines += mer[i] == '\n';
    t->pair_cap = pow2_at_least(lines * 2 + 16);
    t->pairs = callocCheck(t->pair_cap, sizeof(PairSlot));
    int rank = 0;
    char* p = mer;
    char* end = mer + nm;
    while (p < end) {
        char* nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (len && p[len - 1] == '\r') len--;
        if (len && !(p == mer && !strncmp(p, "#version", 8))) add_merge(t, p, len, rank++, u2b, pm);
        p += (nl ? len + 1 + (p[len] == '\r') : len);
        if (!nl) break;
    }
    free(mer);
    finish(t, "gpt-2", dir);
    return t;
}

Tokenizer* tokenizer_load(const char* path) {
    struct stat st;
    if (stat(path, &st)) fatal("%s: tokenizer not found", path);
    return S_ISDIR(st.st_mode) ? load_dir_tokenizer(path) : load_gguf_tokenizer(path);
}

void tokenizer_free(Tokenizer* t) {
    if (!t) return;
    for (int i = 0; i < t->V; i++) free(t->tok[i].bytes);
    free(t->tok);
    free(t->str_slots);
    free(t->pairs);
    if (t->out)
        for (int i = 0; i < t->V; i++) free(t->out[i].bytes);
    free(t->out), free(t->score), free(t->user);
    pcre2_code_free(t->re);
    pcre2_code_free(t->re_digit);
    free(t);
}

int tokenizer_vocab_size(const Tokenizer* t) { return t->V; }
int tokenizer_eot(const Tokenizer* t) { return t->eot; }
int tokenizer_bos(const Tokenizer* t) { return t->bos; }
int tokenizer_eos(const Tokenizer* t) { return t->eos; }
const char* tokenizer_pretokenizer(const Tokenizer* t) { return t->pre; }

/* ---------------------------------------------------------------- encoding */

/* A candidate merge of adjacent tokens a (node i) and b (node j), by rank then position. */
typedef struct {
    int rank, i, j, a, b;
} Cand;

typedef struct {
    int* ids;
    size_t n, cap;
    /* bpe_piece's work space, grown to the longest piece: tokens and links of the piece's
     * nodes, and a binary heap of candidate merges */
    int *tok, *prev, *next;
    size_t node_cap;
    Cand* heap;
    size_t heap_n, heap_cap;
    size_t replaced; /* bytes without a token, encoded as U+FFFD */
} Out;

static void push(Out* o, int id) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 1024;
        o->ids = reallocCheck(o->ids, o->cap * sizeof(int));
    }
    o->ids[o->n++] = id;
}

static int cand_less(const Cand* x, const Cand* y) {
    return x->rank < y->rank || (x->rank == y->rank && x->i < y->i);
}

static void heap_push(Out* o, Cand c) {
    if (o->heap_n == o->heap_cap) {
        o->heap_cap = o->heap_cap ? 2 * o->heap_cap : 64;
        o->heap = reallocCheck(o->heap, o->heap_cap * sizeof(Cand));
    }
    size_t k = o->heap_n++;
    while (k && cand_less(&c, &o->heap[(k - 1) / 2])) {
        o->heap[k] = o->heap[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    o->heap[k] = c;
}

static Cand heap_pop(Out* o) {
    Cand top = o->heap[0], last = o->heap[--o->heap_n];
    size_t k = 0, n = o->heap_n;
    for (;;) {
        size_t c = 2 * k + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&o->heap[c + 1], &o->heap[c])) c++;
        if (!cand_less(&o->heap[c], &last)) break;
        o->heap[k] = o->heap[c];
        k = c;
    }
    if (n) o->heap[k] = last;
    return top;
}

/* The pair of nodes i and j = next[i] as a candidate, if the merge table has it. */
static void offer(const Tokenizer* t, Out* o, int i) {
    int j = i < 0 ? -1 : o->next[i];
    if (j < 0) return;
    const PairSlot* p = pair_lookup(t, o->tok[i], o->tok[j]);
    if (p) heap_push(o, (Cand){p->rank, i, j, o->tok[i], o->tok[j]});
}

/* BPE on one piece: start from byte tokens, repeatedly merge the adjacent pair with the best
 * (lowest) rank, leftmost first. The pieces form a linked list and the candidate pairs a heap;
 * a candidate is stale (skipped) once either node has been merged into another or changed, so
 * a piece of m bytes takes O(m log m), not O(m^2) (a 200 KB run of one letter is one piece). */
static void bpe_piece(const Tokenizer* t, const unsigned char* s, size_t n, Out* o) {
    if (n == 0) return;
    if (n > INT_MAX) fatal("a single text piece of %zu bytes is too long to tokenize", n);
    if (o->node_cap < n) {
        o->node_cap = n * 2;
        o->tok = reallocCheck(o->tok, o->node_cap * sizeof(int));
        o->prev = reallocCheck(o->prev, o->node_cap * sizeof(int));
        o->next = reallocCheck(o->next, o->node_cap * sizeof(int));
    }
    size_t missing = 0;
    for (size_t i = 0; i < n; i++) missing += t->byte_tok[s[i]] < 0;
    if (missing) { /* each such byte becomes the three bytes of U+FFFD */
        if (n + 2 * missing > INT_MAX) fatal("a text piece of %zu bytes is too long", n);
        if (o->node_cap < n + 2 * missing) {
            o->node_cap = n + 2 * missing;
            o->tok = reallocCheck(o->tok, o->node_cap * sizeof(int));
            o->prev = reallocCheck(o->prev, o->node_cap * sizeof(int));
            o->next = reallocCheck(o->next, o->node_cap * sizeof(int));
        }
        o->replaced += missing;
    }
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->byte_tok[s[i]] >= 0) {
            o->tok[m++] = t->byte_tok[s[i]];
        } else {
            o->tok[m++] = t->byte_tok[0xef];
            o->tok[m++] = t->byte_tok[0xbf];
            o->tok[m++] = t->byte_tok[0xbd];
        }
    }
    for (int i = 0; i < m; i++) o->prev[i] = i - 1, o->next[i] = i + 1 < m ? i + 1 : -1;
    o->heap_n = 0;
    for (int i = 0; i + 1 < m; i++) offer(t, o, i);
    while (o->heap_n) {
        Cand c = heap_pop(o);
        /* merged nodes are unlinked (prev = -2); a changed token makes the pair another one */
        if (o->prev[c.i] == -2 || o->prev[c.j] == -2 || o->next[c.i] != c.j || o->tok[c.i] != c.a ||
            o->tok[c.j] != c.b)
            continue;
        o->tok[c.i] = pair_lookup(t, c.a, c.b)->merged;
        o->next[c.i] = o->next[c.j];
        if (o->next[c.j] >= 0) o->prev[o->next[c.j]] = c.i;
        o->prev[c.j] = -2;
        offer(t, o, o->prev[c.i]);
        offer(t, o, c.i);
    }
    for (int i = 0; i >= 0 && m; i = o->next[i]) push(o, o->tok[i]);
}

/* Split s by the GPT-2 regex; bytes no match covers (invalid UTF-8) become pieces too. */
static void regex_pieces(const Tokenizer* t, const unsigned char* s, size_t n, Out* o,
                         pcre2_match_data* md) {
    size_t at = 0;
    while (at < n) {
        int rc = pcre2_match(t->re, s, n, at, 0, md, NULL);
        if (rc < 0) {
            bpe_piece(t, s + at, n - at, o);
            return;
        }
        PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > at) bpe_piece(t, s + at, ov[0] - at, o);
        if (ov[1] == ov[0]) { /* cannot happen with this pattern; guard against a loop */
            bpe_piece(t, s + ov[0], 1, o);
            at = ov[0] + 1;
            continue;
        }
        bpe_piece(t, s + ov[0], ov[1] - ov[0], o);
        at = ov[1];
    }
}

static atomic_size_t
    replaced_total; /* tokenizer_replaced_bytes (encode runs on many threads: serve) */

size_t tokenizer_replaced_bytes(void) { return atomic_load(&replaced_total); }

/* ---- SentencePiece encoding, as llama.cpp's "llama" tokenizer does it: the user-defined pieces
 * are cut out of the raw text first (longest first, each at every occurrence left to right);
 * in each stretch between them spaces become U+2581, the stretch is split into UTF-8
 * characters, and the adjacent pair whose concatenation is the piece of highest score (the
 * leftmost of equal scores) is merged until no pair forms a piece; a character that is no piece
 * is written as its bytes' byte pieces (<0x00> .. <0xFF>). */

typedef struct {
    float score;
    int left, right, size;
} Bigram;

typedef struct {
    const char* text;          /* the escaped stretch */
    int *at, *n, *prev, *next; /* symbols: byte offset, length (0: merged away), links */
    size_t cap;
    Bigram* heap;
    size_t heap_n, heap_cap;
} SpmWork;

static int bigram_before(const Bigram* x, const Bigram* y) { /* x pops first */
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void bigram_push(SpmWork* w, Bigram b) {
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? 2 * w->heap_cap : 64;
        w->heap = reallocCheck(w->heap, w->heap_cap * sizeof(Bigram));
    }
    size_t k = w->heap_n++;
    while (k && bigram_before(&b, &w->heap[(k - 1) / 2])) {
        w->heap[k] = w->heap[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    w->heap[k] = b;
}

static Bigram bigram_pop(SpmWork* w) {
    Bigram top = w->heap[0], last = w->heap[--w->heap_n];
    size_t k = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * k + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_before(&w->heap[c], &last)) break;
        w->heap[k] = w->heap[c];
        k = c;
    }
    if (n) w->heap[k] = last;
    return top;
}

static void spm_offer(const Tokenizer* t, SpmWork* w, int l, int r) {
    if (l < 0 || r < 0) return;
    const int size = w->n[l] + w->n[r];
    const int id = str_lookup(t, w->text + w->at[l], size);
    if (id >= 0) bigram_push(w, (Bigram){t->score[id], l, r, size});
}

/* One stretch of escaped text (spaces already U+2581) into ids. */
static void spm_stretch(const Tokenizer* t, SpmWork* w, const char* s, size_t n, Out* o) {
    if (!n) return;
    if (n > INT_MAX) fatal("a single text piece of %zu bytes is too long to tokenize", n);
    if (w->cap < n) {
        w->cap = n;
        w->at = reallocCheck(w->at, sizeof(int) * n);
        w->n = reallocCheck(w->n, sizeof(int) * n);
        w->prev = reallocCheck(w->prev, sizeof(int) * n);
        w->next = reallocCheck(w->next, sizeof(int) * n);
    }
    w->text = s;
    w->heap_n = 0;
    int m = 0;
    for (size_t at = 0; at < n;) { /* UTF-8 characters (a stray byte alone) */
        const unsigned char c = (unsigned char)s[at];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (len > n - at) len = n - at;
        w->at[m] = (int)at, w->n[m] = (int)len, w->prev[m] = m - 1;
        at += len;
        w->next[m] = at == n ? -1 : m + 1;
        m++;
    }
    for (int i = 1; i < m; i++) spm_offer(t, w, i - 1, i);
    while (w->heap_n) {
        const Bigram b = bigram_pop(w);
        if (!w->n[b.left] || !w->n[b.right] || w->n[b.left] + w->n[b.right] != b.size) continue;
        w->n[b.left] += w->n[b.right];
        w->n[b.right] = 0;
        w->next[b.left] = w->next[b.right];
        if (w->next[b.right] >= 0) w->prev[w->next[b.right]] = b.left;
        spm_offer(t, w, w->prev[b.left], b.left);
        spm_offer(t, w, b.left, w->next[b.left]);
    }
    for (int i = 0; i >= 0; i = w->next[i]) {
        const int id = str_lookup(t, s + w->at[i], w->n[i]);
        if (id >= 0) {
            push(o, id);
            continue;
        }
        for (int k = 0; k < w->n[i]; k++) push(o, t->byte_tok[(unsigned char)s[w->at[i] + k]]);
    }
}

typedef struct {
    size_t at, n;
    int id; /* a user-defined piece, or -1: raw text */
} Frag;

static void spm_encode(const Tokenizer* t, const char* text, size_t len, Out* o) {
    size_t nf = 1, cap = 16;
    Frag* fr = mallocCheck(sizeof(Frag) * cap);
    fr[0] = (Frag){0, len, -1};
    for (int u = 0; u < t->n_user; u++) { /* cut piece u out of every raw fragment */
        const Tok* p = &t->tok[t->user[u]];
        size_t nn = 0, ncap = nf + 16;
        Frag* nfr = mallocCheck(sizeof(Frag) * ncap);
        for (size_t k = 0; k < nf; k++) {
            Frag f = fr[k];
            while (f.id < 0 && f.n >= (size_t)p->len) {
                const char* hit = memmem(text + f.at, f.n, p->bytes, (size_t)p->len);
                if (!hit) break;
                const size_t h = (size_t)(hit - text);
                if (nn + 3 > ncap) nfr = reallocCheck(nfr, sizeof(Frag) * (ncap *= 2));
                if (h > f.at) nfr[nn++] = (Frag){f.at, h - f.at, -1};
                nfr[nn++] = (Frag){h, (size_t)p->len, t->user[u]};
                f.n -= h + (size_t)p->len - f.at;
                f.at = h + (size_t)p->len;
            }
            if (f.n || f.id >= 0) {
                if (nn + 1 > ncap) nfr = reallocCheck(nfr, sizeof(Frag) * (ncap *= 2));
                nfr[nn++] = f;
            }
        }
        free(fr);
        fr = nfr, nf = nn;
    }
    SpmWork w = {0};
    char* esc = NULL;
    size_t esc_cap = 0;
    for (size_t k = 0; k < nf; k++) {
        if (fr[k].id >= 0) {
            push(o, fr[k].id);
            continue;
        }
        if (esc_cap < 3 * fr[k].n) esc = reallocCheck(esc, esc_cap = 3 * fr[k].n);
        size_t m = 0;
        for (size_t i = 0; i < fr[k].n; i++) {
            if (text[fr[k].at + i] == ' ') {
                memcpy(esc + m, "\xe2\x96\x81", 3);
                m += 3;
            } else {
                esc[m++] = text[fr[k].at + i];
            }
        }
        spm_stretch(t, &w, esc, m, o);
    }
    free(esc), free(fr);
    free(w.at), free(w.n), free(w.prev), free(w.next), free(w.heap);
}

int* tokenizer_encode(const Tokenizer* t, const char* text, size_t len, size_t* n) {
    Out o = {0};
    if (t->spm) {
        spm_encode(t, text, len, &o);
        *n = o.n;
        if (!o.ids) o.ids = mallocCheck(sizeof(int));
        return o.ids;
    }
    pcre2_match_data* md = pcre2_match_data_create(4, NULL);
    const unsigned char* s = (const unsigned char*)text;
    if (!t->split_digits) {
        regex_pieces(t, s, len, &o, md);
    } else {
        /* Isolate every numeric character, then split the stretches between them. */
        pcre2_match_data* md2 = pcre2_match_data_create(4, NULL);
        size_t at = 0;
        while (at < len) {
            int rc = pcre2_match(t->re_digit, s, len, at, 0, md2, NULL);
            if (rc < 0) {
                regex_pieces(t, s + at, len - at, &o, md);
                break;
            }
            PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md2);
            if (ov[0] > at) regex_pieces(t, s + at, ov[0] - at, &o, md);
            bpe_piece(t, s + ov[0], ov[1] - ov[0], &o);
            at = ov[1];
        }
        pcre2_match_data_free(md2);
    }
    pcre2_match_data_free(md);
    if (o.replaced && !atomic_fetch_add(&replaced_total, o.replaced))
        fprintf(stderr,
                "focus: warning: %zu bytes of the text have no token in this vocabulary (not "
                "UTF-8, or rare control characters); encoded as U+FFFD\n",
                o.replaced);
    free(o.tok);
    free(o.prev);
    free(o.next);
    free(o.heap);
    *n = o.n;
    if (!o.ids) o.ids = mallocCheck(sizeof(int));
    return o.ids;
}

char* tokenizer_decode(const Tokenizer* t, const int* ids, size_t n, size_t* len) {
    const Tok* out = t->out ? t->out : t->tok; /* SentencePiece: the pieces' decoded bytes */
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->V)
            fatal("token id %d is outside the vocabulary (V=%d)", ids[i], t->V);
        total += (size_t)out[ids[i]].len;
    }
    char* s = mallocCheck(total + 1);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(s + at, out[ids[i]].bytes, (size_t)out[ids[i]].len);
        at += (size_t)out[ids[i]].len;
    }
    if (t->spm) {
        /* U+2581 written as byte pieces is a space too: the stretch's split into characters can
         * take its first byte into an invalid UTF-8 sequence before it (as llama.cpp's does),
         * and its bytes then go through byte fallback */
        size_t w = 0;
        for (size_t r = 0; r < at; r++) {
            if (r + 2 < at && !memcmp(s + r, "\xe2\x96\x81", 3)) {
                s[w++] = ' ';
                r += 2;
            } else {
                s[w++] = s[r];
            }
        }
        at = w;
    }
    s[at] = 0;
    if (len) *len = at;
    return s;
}

int tokenizer_find(const Tokenizer* t, const char* text) {
    return str_lookup(t, text, (int)strlen(text));
}
