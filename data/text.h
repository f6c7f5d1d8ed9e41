/* text.h: reading text files and the cleaning applied by `focus prepare`. */
#ifndef FOCUS_TEXT_H
#define FOCUS_TEXT_H

#include <stddef.h>

/* In place: drop a UTF-8 byte-order mark, keep only the text between Project Gutenberg's
 * "*** START OF ..." and "*** END OF ..." lines when both are present, and turn CRLF into LF.
 * Returns the new length. */
size_t text_clean(char* s, size_t len);

#endif
