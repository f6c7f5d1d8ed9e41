/* chat.c: ChatML and Gemma conversations to tokens (see chat.h). */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/common.h"

int chat_template_init(ChatTemplate* ct, const char* src, const char* name, char* why,
                       size_t whylen) {
    memset(ct, 0, sizeof(*ct));
    if (name) {
        if (!strcmp(name, "chatml"))
            ct->kind = CHAT_CHATML;
        else if (!strcmp(name, "gemma"))
            ct->kind = CHAT_GEMMA;
        else {
            snprintf(why, whylen, "--chat-template: unknown template '%s' (chatml, gemma)", name);
            return 0;
        }
    } else if (!src) {
        return 1; /* no template: completions only */
    } else if (strstr(src, "<|im_start|>")) {
        ct->kind = CHAT_CHATML;
    } else if (strstr(src, "<start_of_turn>")) {
        ct->kind = CHAT_GEMMA;
    } else {
        snprintf(why, whylen,
                 "the model's chat template is not one focus serve knows (ChatML, Gemma): start "
                 "with --chat-template chatml or gemma");
        return 0;
    }
    /* ChatML templates that open a conversation without a system message with their own
     * (SmolLM2: "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
     * ...<|im_end|>") */
    const char* open = "<|im_start|>system\n";
    const char* at =
        src && ct->kind == CHAT_CHATML && strstr(src, "!= 'system'") ? strstr(src, open) : NULL;
    if (at) {
        at += strlen(open);
        const char* end = strstr(at, "<|im_end|>");
        if (end && (size_t)(end - at) < sizeof ct->default_system && !memchr(at, '{', end - at))
            memcpy(ct->default_system, at, (size_t)(end - at));
    }
    return 1;
}

const char* chat_template_name(const ChatTemplate* ct) {
    return ct->kind == CHAT_CHATML ? "chatml" : ct->kind == CHAT_GEMMA ? "gemma" : "none";
}

typedef struct {
    int* ids;
    int n, cap;
} Ids;

static void put_ids(Ids* o, const int* ids, int n) {
    if (o->n + n > o->cap) {
        o->cap = 2 * (o->n + n) + 64;
        o->ids = reallocCheck(o->ids, sizeof(int) * (size_t)o->cap);
    }
    memcpy(o->ids + o->n, ids, sizeof(int) * (size_t)n);
    o->n += n;
}

static void put_text(Ids* o, const Tokenizer* t, const char* s) {
    size_t n;
    int* ids = tokenizer_encode(t, s, strlen(s), &n);
    put_ids(o, ids, (int)n);
    free(ids);
}

/* a special token by id where the vocabulary has it, else its text */
static void put_special(Ids* o, const Tokenizer* t, const char* s) {
    const int id = tokenizer_find(t, s);
    if (id >= 0)
        put_ids(o, &id, 1);
    else
        put_text(o, t, s);
}

static void turn(Ids* o, const Tokenizer* t, const ChatTemplate* ct, const char* role,
                 const char* pre, const char* content) {
    const int ml = ct->kind == CHAT_CHATML;
    put_special(o, t, ml ? "<|im_start|>" : "<start_of_turn>");
    char head[64];
    snprintf(head, sizeof head, "%s\n", role);
    if (pre) { /* Gemma's system message, before the first user message */
        char* both = mallocCheck(strlen(head) + strlen(pre) + strlen(content) + 3);
        sprintf(both, "%s%s\n\n%s", head, pre, content);
        put_text(o, t, both);
        free(both);
    } else {
        char* both = mallocCheck(strlen(head) + strlen(content) + 1);
        sprintf(both, "%s%s", head, content);
        put_text(o, t, both);
        free(both);
    }
    put_special(o, t, ml ? "<|im_end|>" : "<end_of_turn>");
    put_text(o, t, "\n");
}

int* chat_encode(const ChatTemplate* ct, const Tokenizer* t, const ChatMessage* msgs, int nmsg,
                 int bos, int* n, char* why, size_t whylen) {
    Ids o = {0};
    if (bos >= 0) put_ids(&o, &bos, 1);
    const char* sys = NULL; /* Gemma: the system message waiting for the first user turn */
    for (int i = 0; i < nmsg; i++) {
        const char* role = msgs[i].role;
        const int known = !strcmp(role, "system") || !strcmp(role, "user") ||
                          !strcmp(role, "assistant") || !strcmp(role, "developer");
        if (!known || strlen(role) > 32) {
            snprintf(why, whylen, "messages[%d].role: '%.40s' is not system, user or assistant", i,
                     role);
            free(o.ids);
            return NULL;
        }
        const int system = !strcmp(role, "system") || !strcmp(role, "developer");
        if (ct->kind == CHAT_CHATML) {
            if (i == 0 && !system && ct->default_system[0])
                turn(&o, t, ct, "system", NULL, ct->default_system);
            turn(&o, t, ct, system ? "system" : role, NULL, msgs[i].content);
        } else if (system) {
            sys = msgs[i].content;
        } else {
            turn(&o, t, ct, !strcmp(role, "assistant") ? "model" : "user",
                 !strcmp(role, "user") ? sys : NULL, msgs[i].content);
            if (!strcmp(role, "user")) sys = NULL;
        }
    }
    put_special(&o, t, ct->kind == CHAT_CHATML ? "<|im_start|>" : "<start_of_turn>");
    put_text(&o, t, ct->kind == CHAT_CHATML ? "assistant\n" : "model\n");
    *n = o.n;
    return o.ids;
}
