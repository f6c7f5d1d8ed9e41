/* tokenizer.h: byte-level BPE as GPT-2 and SmolLM2 use it, and SentencePiece as Gemma uses it.
 *
 * Text is split into pieces by the pre-tokenizer regex (PCRE2, Unicode categories), each piece's
 * bytes become single-byte tokens, and the merge rules are applied in priority order. SmolLM2's
 * pre-tokenizer ("smollm" in GGUF) first isolates every digit, then applies the GPT-2 regex.
 * Sources: a GGUF file's tokenizer.ggml.* metadata, or a directory with encoder.json and
 * vocab.bpe (GPT-2).
 * SentencePiece (GGUF tokenizer.ggml.model "llama": Gemma 3): pieces with scores, merged by score
 * as llama.cpp's tokenizer does (tokenizer.c, spm_encode), user-defined pieces (runs of newlines
 * and spaces, HTML tags) cut out of the text first, byte fallback for characters that are no
 * piece, no space prefix; control pieces (<bos>, <start_of_turn>) decode to nothing.
 * Tested by tests/test_tokenizer.c against ids from reference tokenizers (Hugging Face's for
 * GPT-2 and SmolLM2, llama.cpp's llama-tokenize for Gemma 3). */
#ifndef FOCUS_TOKENIZER_H
#define FOCUS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* Load from a GGUF file or a directory holding encoder.json and vocab.bpe; fatal on error. */
Tokenizer* tokenizer_load(const char* path);
void tokenizer_free(Tokenizer* t);

/* Encode len bytes of text (any bytes; invalid UTF-8 is kept byte for byte). Returns a malloc'd
 * array of *n ids. Special-token text is encoded as ordinary text. With a vocabulary that holds
 * all 256 byte tokens (GPT-2's) decode(encode(x)) = x for every byte string x. A byte the
 * vocabulary has no token for (SmolLM2 lacks 21: 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1,
 * 0xf1, 0xf2, 0xf5-0xff) is encoded as U+FFFD, the replacement character a UTF-8 reader shows
 * for a byte it cannot decode; Hugging Face's tokenizer drops it without a word instead. The
 * first call that replaces bytes prints a one-line warning on stderr with their count. */
int* tokenizer_encode(const Tokenizer* t, const char* text, size_t len, size_t* n);
/* The bytes encode replaced by U+FFFD so far (in this process). */
size_t tokenizer_replaced_bytes(void);
/* Decode ids to a malloc'd, NUL-terminated byte string of *len bytes. */
char* tokenizer_decode(const Tokenizer* t, const int* ids, size_t n, size_t* len);

int tokenizer_vocab_size(const Tokenizer* t);
/* The document separator written between documents in token shards: <|endoftext|> if the
 * vocabulary has it, else the end-of-sequence token. */
int tokenizer_eot(const Tokenizer* t);
/* The model's end-of-sequence id (an instruct model's end of turn), or -1. */
int tokenizer_eos(const Tokenizer* t);
/* Beginning-of-sequence id, or -1 if the model does not use one. */
int tokenizer_bos(const Tokenizer* t);
const char* tokenizer_pretokenizer(const Tokenizer* t);
/* The id of the token whose text is exactly `text` (a special token such as <|im_start|>), or
 * -1 when the vocabulary has none. */
int tokenizer_find(const Tokenizer* t, const char* text);

#endif
