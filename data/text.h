/* text.h: reading text files and the cleaning applied by `focus prepare`. */
#ifndef FOCUS_TEXT_H
#define FOCUS_TEXT_H

#include <stddef.h>

/* In place: drop a UTF-8 byte-order mark, keep only the text between Project Gutenberg's
 * "*** START OF ..." and "*** END OF ..." lines when both are present, and turn CRLF into LF.
 * Returns the new length. */
size_t text_clean(char* s, size_t len);

/* Fatal naming path unless s[0..len) can be text: a NUL byte means a binary file (a token shard
 * with a damaged header, a model), which would otherwise be tokenized as text without a word. */
void text_check(const char* path, const char* s, size_t len);

#endif
