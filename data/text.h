/* text.h: reading text files and the cleaning applied by `focus prepare`. */
#ifndef FOCUS_TEXT_H
#define FOCUS_TEXT_H

#include <stddef.h>

/* Whole file as a malloc'd NUL-terminated buffer; fatal with the path on error. */
char* read_file(const char* path, size_t* len);
/* The same, but NULL when the file cannot be opened or read (optional files). */
char* read_file_opt(const char* path, size_t* len);

/* In place: drop a UTF-8 byte-order mark, keep only the text between Project Gutenberg's
 * "*** START OF ..." and "*** END OF ..." lines when both are present, and turn CRLF into LF.
 * Returns the new length. */
size_t text_clean(char* s, size_t len);

#endif
