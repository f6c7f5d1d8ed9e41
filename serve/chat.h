/* chat.h: the chat templates `focus serve` knows, recognised from a GGUF file's
 * tokenizer.chat_template (a Jinja program we do not run) or named with --chat-template:
 * ChatML (SmolLM2-Instruct, Qwen: <|im_start|>role\ncontent<|im_end|>\n, with the default system
 * message the template adds when a conversation has none) and Gemma (<start_of_turn>user ...
 * <end_of_turn>, the system message folded into the first user turn). Messages become tokens
 * directly: the template's special tokens by id, the contents through the tokenizer as ordinary
 * text, so a message that contains "<|im_end|>" cannot end its turn. */
#ifndef FOCUS_SERVE_CHAT_H
#define FOCUS_SERVE_CHAT_H

#include <stddef.h>

#include "../data/tokenizer.h"

typedef enum { CHAT_NONE = 0, CHAT_CHATML, CHAT_GEMMA } ChatKind;

typedef struct {
    ChatKind kind;
    char default_system[1024]; /* ChatML: the system message when a conversation has none */
} ChatTemplate;

typedef struct {
    const char* role;
    const char* content;
} ChatMessage;

/* From --chat-template `name` (chatml, gemma; NULL: recognise `src`, the file's template, which
 * may be NULL: no chat then). Returns 0 with a reason in why for a template not recognised or
 * an unknown name. */
int chat_template_init(ChatTemplate* ct, const char* src, const char* name, char* why,
                       size_t whylen);
const char* chat_template_name(const ChatTemplate* ct);
/* The prompt of the conversation, ending with the assistant's turn opened (malloc'd, *n ids;
 * bos >= 0 first). Returns NULL with a reason for a role the template has no place for. */
int* chat_encode(const ChatTemplate* ct, const Tokenizer* t, const ChatMessage* msgs, int nmsg,
                 int bos, int* n, char* why, size_t whylen);

#endif
