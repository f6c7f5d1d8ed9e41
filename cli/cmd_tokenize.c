/* cmd_tokenize.c: `focus tokenize`, text to token ids and back. */
#include <stdio.h>
#include <string.h>

#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"

static const char tokenize_usage[] =
    "usage: focus tokenize --tokenizer <model.gguf | tokenizer dir> [--decode] FILE\n"
    "Prints the token ids of FILE space-separated on one line; with --decode, FILE holds\n"
    "ids (space-separated) and the text is printed. FILE - reads standard input.\n";

int cmd_tokenize(int argc, char** argv) {
    const char* tok = NULL;
    const char* file = NULL;
    int decode = 0;
    if (cli_parse("tokenize", argc, argv, 1, tokenize_usage, "--tokenizer:s --decode:f :s", &tok,
                  &decode, &file))
        return 0;
    if (!tok || !file) fatal("tokenize: needs --tokenizer and a FILE (see focus tokenize --help)");
    Tokenizer* t = tokenizer_load(tok);
    size_t len;
    const int from_stdin = !strcmp(file, "-");
    char* text = from_stdin ? read_stdin(&len) : read_file(file, &len);
    if (from_stdin) file = "standard input";
    fatal_defer(free, text);
    if (!decode) {
        size_t n;
        int* ids = tokenizer_encode(t, text, len, &n);
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        free(ids);
    } else {
        size_t n = 0, cap = 1024;
        int* ids = mallocCheck(sizeof(int) * cap);
        fatal_defer(free, ids);
        char* p = text;
        while (*p) {
            char* end;
            long v = strtol(p, &end, 10);
            if (end == p) {
                if (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') {
                    p++;
                    continue;
                }
                fatal("%s: expected token ids, found '%c' at byte %zu", file, *p,
                      (size_t)(p - text));
            }
            if (v < 0 || v >= tokenizer_vocab_size(t))
                fatal("%s: token id %ld is outside the vocabulary (V=%d)", file, v,
                      tokenizer_vocab_size(t));
            if (n == cap) {
                fatal_forget(ids);
                ids = reallocCheck(ids, sizeof(int) * (cap *= 2));
                fatal_defer(free, ids);
            }
            ids[n++] = (int)v;
            p = end;
        }
        size_t out_len;
        char* s = tokenizer_decode(t, ids, n, &out_len);
        fwrite(s, 1, out_len, stdout);
        free(s);
        fatal_release(ids);
    }
    fatal_release(text);
    tokenizer_free(t);
    return 0;
}
