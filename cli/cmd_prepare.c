/* cmd_prepare.c: `focus prepare`, text files to token shards for training and evaluation. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../data/shard.h"
#include "../data/text.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"

static const char prepare_usage[] =
    "usage: focus prepare --tokenizer T --out DIR [--val-fraction f] [--raw] FILES...\n"
    "Tokenizes each file as one document and writes token shards DIR/train_000.bin (and\n"
    "DIR/val_000.bin with the last fraction f of the tokens). Documents are separated by the\n"
    "end-of-text token. Unless --raw, text is cleaned first: byte-order mark removed, Project\n"
    "Gutenberg header and licence dropped when present, CRLF turned into LF.\n";

int cmd_prepare(int argc, char** argv) {
    const char *tok = NULL, *out = NULL;
    double val_fraction = 0;
    int raw = 0;
    CliList files = {0};
    if (cli_parse("prepare", argc, argv, 1, prepare_usage,
                  "--tokenizer:s --out:s --val-fraction:x[0,0.5] --raw:f :*", &tok, &out,
                  &val_fraction, &raw, &files))
        return 0;
    if (val_fraction < 0 || val_fraction >= 1)
        fatal("prepare: --val-fraction must be in [0, 1), got %g", val_fraction);
    const int clean = !raw, nfiles = files.n;
    if (!tok || !out || !nfiles) fatal("prepare: needs --tokenizer, --out and at least one file");
    Tokenizer* t = tokenizer_load(tok);
    int eot = tokenizer_eot(t);
    if (eot < 0) fatal("%s: the tokenizer has no end-of-text token to separate documents", tok);
    mkdir(out, 0755);
    struct stat st;
    if (stat(out, &st) || !S_ISDIR(st.st_mode)) fatal("%s: cannot create the output folder", out);
    size_t n = 0, cap = 1 << 20;
    int* all = mallocCheck(sizeof(int) * cap);
    double t0 = now_seconds();
    size_t bytes = 0;
    for (int f = 0; f < nfiles; f++) {
        size_t len;
        char* text = read_file(files.v[f], &len);
        text_check(files.v[f], text, len);
        if (clean) len = text_clean(text, len);
        bytes += len;
        size_t k;
        int* ids = tokenizer_encode(t, text, len, &k);
        while (n + k + 1 > cap) all = reallocCheck(all, sizeof(int) * (cap *= 2));
        all[n++] = eot; /* every document starts after a separator */
        memcpy(all + n, ids, sizeof(int) * k);
        n += k;
        free(ids);
        free(text);
    }
    size_t nval = (size_t)(val_fraction * (double)n);
    char path[4096];
    snprintf(path, sizeof path, "%s/train_000.bin", out);
    shard_write(path, all, n - nval, tokenizer_vocab_size(t));
    printf("%s: %zu tokens\n", path, n - nval);
    if (nval) {
        snprintf(path, sizeof path, "%s/val_000.bin", out);
        shard_write(path, all + (n - nval), nval, tokenizer_vocab_size(t));
        printf("%s: %zu tokens\n", path, nval);
    }
    /* shards of an earlier prepare into the same folder would be read with these */
    char** old;
    int nold = shard_list(out, "", &old);
    for (int i = 0; i < nold; i++) {
        const char* base = strrchr(old[i], '/') ? strrchr(old[i], '/') + 1 : old[i];
        if (strcmp(base, "train_000.bin") && (nval == 0 || strcmp(base, "val_000.bin")) &&
            (!strncmp(base, "train_", 6) || !strncmp(base, "val_", 4))) {
            if (unlink(old[i]))
                fatal("%s: cannot remove a stale shard: %s", old[i], strerror(errno));
            printf("removed %s, a shard of an earlier prepare into this folder\n", old[i]);
        }
        free(old[i]);
    }
    free(old);
    printf("%d files, %zu bytes, %zu tokens in %.1f s\n", nfiles, bytes, n, now_seconds() - t0);
    free(all);
    free(files.v);
    tokenizer_free(t);
    return 0;
}
