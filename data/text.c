/* text.c: file reading and text cleaning (see text.h). */
#define _GNU_SOURCE
#include "text.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "../kernels/common.h"

/* Start of the line after the first line that begins with one of the markers, or NULL. */
static char* find_marker_line(char* s, const char* const* marks, int after) {
    for (char* line = s; line && *line;) {
        for (int i = 0; marks[i]; i++) {
            if (!strncmp(line, marks[i], strlen(marks[i]))) {
                if (!after) return line;
                char* nl = strchr(line, '\n');
                return nl ? nl + 1 : line + strlen(line);
            }
        }
        char* nl = strchr(line, '\n');
        line = nl ? nl + 1 : NULL;
    }
    return NULL;
}

void text_check(const char* path, const char* s, size_t len) {
    const char* z = memchr(s, 0, len);
    if (z)
        fatal(
            "%s: not text (a NUL byte at offset %zu) and not a token shard (no FOCUSTOK "
            "header); a binary file?",
            path, (size_t)(z - s));
}

size_t text_clean(char* s, size_t len) {
    if (len >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) {
        memmove(s, s + 3, len - 3 + 1);
        len -= 3;
    }
    static const char* const start[] = {
        "*** START OF THE PROJECT GUTENBERG", "*** START OF THIS PROJECT GUTENBERG",
        "***START OF THE PROJECT GUTENBERG", "***START OF THIS PROJECT GUTENBERG", NULL};
    static const char* const end[] = {
        "*** END OF THE PROJECT GUTENBERG", "*** END OF THIS PROJECT GUTENBERG",
        "***END OF THE PROJECT GUTENBERG", "***END OF THIS PROJECT GUTENBERG", NULL};
    char* a = find_marker_line(s, start, 1);
    char* b = a ? find_marker_line(a, end, 0) : NULL;
    if (a && b) {
        *b = 0;
        len = (size_t)(b - a);
        memmove(s, a, len + 1);
    }
    size_t w = 0;
    for (size_t r = 0; r < len; r++) {
        if (s[r] == '\r' && r + 1 < len && s[r + 1] == '\n') continue;
        s[w++] = s[r];
    }
    s[w] = 0;
    return w;
}
