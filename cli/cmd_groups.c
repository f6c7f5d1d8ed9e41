/* cmd_groups.c: `focus groups`, what the learned groups are.
 * Runs the model with its router (causal routing) over some text and reports, per layer and
 * group: the share of tokens whose most likely group it is, the most frequent tokens, and the
 * share of token classes (punctuation, digits, words led by a space, word pieces, whitespace).
 * Writes DIR/groups.txt and DIR/groups.svg (a share heatmap and the class mix of each group). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../checkpoints/load.h"
#include "../data/tokenizer.h"
#include "../io/io.h"
#include "cli.h"
#include "commands.h"
#include "../eval/evaluate.h"

enum { CLS_SPACE_WORD, CLS_PIECE, CLS_PUNCT, CLS_DIGIT, CLS_SPACE, CLS_OTHER, NCLS };
static const char* CLS_NAMES[NCLS] = {"space+word", "word piece", "punctuation",
                                      "digits",     "whitespace", "other"};
static const char* CLS_COLORS[NCLS] = {"#4e79a7", "#a0cbe8", "#f28e2b",
                                       "#59a14f", "#bab0ac", "#e15759"};

static int token_class(const char* s, size_t n) {
    if (n == 0) return CLS_OTHER;
    int alpha = 0, digit = 0, punct = 0, space = 0, high = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80)
            high++;
        else if (isalpha(c))
            alpha++;
        else if (isdigit(c))
            digit++;
        else if (isspace(c))
            space++;
        else
            punct++;
    }
    if (space == (int)n) return CLS_SPACE;
    if (digit && !alpha && !punct && !high) return CLS_DIGIT;
    if (punct && !alpha && !digit && !high) return CLS_PUNCT;
    if ((alpha || high) && s[0] == ' ') return CLS_SPACE_WORD;
    if (alpha && !punct && !space) return CLS_PIECE;
    return CLS_OTHER;
}

static void svg_escape(FILE* f, const char* s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if ((unsigned char)*s >= 0x20 || *s == '\t')
            fputc(*s, f);
    }
}

/* Printable form of a token for the report: newlines and tabs escaped. */
static void printable(char* out, size_t cap, const char* s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n && o + 3 < cap; i++) {
        if (s[i] == '\n')
            out[o++] = '\\', out[o++] = 'n';
        else if (s[i] == '\t')
            out[o++] = '\\', out[o++] = 't';
        else if (s[i] == '"')
            out[o++] = '\'';
        else
            out[o++] = s[i];
    }
    out[o] = 0;
}

static const char groups_usage[] =
    "usage: focus groups --model M --router router.h5 --data DATA [--tokenizer T] [--ctx 1024]\n"
    "                    [--tokens 16384] [--top 12] [--out DIR]\n"
    "Per layer and group: share of tokens, most frequent tokens, token classes; written to\n"
    "DIR/groups.txt and DIR/groups.svg (default DIR: groups/ in the router's folder, beside the\n"
    "run it came from). For a router with a query projection: the groups its tokens join as\n"
    "keys (a query picks its own by the projection).\n";

int cmd_groups(int argc, char** argv) {
    const char *model = NULL, *router = NULL, *data = NULL, *tok = NULL, *out = NULL;
    int ctx = 1024, max_tokens = 16384, top = 12;
    if (cli_parse("groups", argc, argv, 1, groups_usage,
                  "--model:s --router:s --data:s --tokenizer:s --ctx:i[2,1048576] "
                  "--tokens:i[1,2147483647] "
                  "--top:i[1,100000] --out:s",
                  &model, &router, &data, &tok, &ctx, &max_tokens, &top, &out))
        return 0;
    if (!model || !router || !data) fatal("groups: needs --model, --router and --data");
    char beside[4096];
    if (!out) { /* RUN_DIR/groups for RUN_DIR/router.h5 */
        const char* slash = strrchr(router, '/');
        snprintf(beside, sizeof beside, "%.*s%sgroups", slash ? (int)(slash - router) : 0, router,
                 slash ? "/" : "");
        out = beside;
    }
    Model m;
    /* the loader's method for the router: soft, or hard for a router with a query projection
     * (no soft gate); either way the keys' groups are those of causal routing */
    cli_open_model(&m, NULL,
                   &(ModelRequest){.model = model, .router = router, .routing = "causal"});
    if (!attn_uses_router(m.fc.attn))
        fatal("groups: %s is a block selector (focus fit-blocks); groups reads a token router",
              router);
    Tokenizer* t = tokenizer_load(tok ? tok : model);
    size_t n;
    int* ids = load_tokens(data, "val_", tok ? tok : model, 1, &n);
    if (max_tokens > 0 && n > (size_t)max_tokens) n = (size_t)max_tokens;
    const int L = m.cfg.L, K = m.fc.K, V = m.cfg.V;
    /* counts[l][k][v] */
    uint32_t* counts = callocCheck((size_t)L * K * V, sizeof(uint32_t));
    double* cls = callocCheck((size_t)L * K * NCLS, sizeof(double));
    double* share = callocCheck((size_t)L * K, sizeof(double));
    int* tclass = mallocCheck(sizeof(int) * V);
    for (int v = 0; v < V; v++) {
        size_t len;
        char* s = tokenizer_decode(t, &v, 1, &len);
        tclass[v] = token_class(s, len);
        free(s);
    }
    size_t total = 0;
    for (size_t st = 0; st < n; st += (size_t)ctx) {
        int T = (int)((n - st) < (size_t)ctx ? n - st : (size_t)ctx);
        if (T < 2) break;
        model_forward(&m, ids + st, NULL, 1, T, 0);
        for (int l = 0; l < L; l++) {
            const real* G = model_groups(&m, l);
            for (int i = 0; i < T; i++) {
                int g = 0;
                for (int k = 1; k < K; k++) g = G[(size_t)i * K + k] > G[(size_t)i * K + g] ? k : g;
                int v = ids[st + (size_t)i];
                counts[((size_t)l * K + g) * V + v]++;
                cls[((size_t)l * K + g) * NCLS + tclass[v]]++;
                share[(size_t)l * K + g]++;
            }
        }
        total += (size_t)T;
    }
    mkdir(out, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/groups.txt", out);
    FILE* f = fopen(path, "w");
    if (!f) fatal("%s: cannot write", path);
    fprintf(f, "focus groups: %zu tokens of %s, router %s, K=%d, causal routing\n", total, data,
            router, K);
    if (m.router.wq)
        fprintf(f,
                "the groups the tokens join as keys; a query picks its own by the router's query "
                "projection\n");
    fprintf(f, "share = fraction of tokens whose most likely group this is (ideal 1/K = %.3f)\n\n",
            1.0 / K);
    for (int l = 0; l < L; l++) {
        fprintf(f, "layer %d\n", l);
        for (int k = 0; k < K; k++) {
            size_t at = (size_t)l * K + k;
            double cnt = share[at];
            fprintf(f, "  group %d  share %.3f  |", k, cnt / total);
            for (int c = 0; c < NCLS; c++)
                fprintf(f, " %s %.2f", CLS_NAMES[c], cnt ? cls[at * NCLS + c] / cnt : 0);
            fprintf(f, "\n    top:");
            uint32_t* cv = counts + at * V;
            for (int r = 0; r < top; r++) {
                int best = -1;
                for (int v = 0; v < V; v++)
                    if (cv[v] && (best < 0 || cv[v] > cv[best])) best = v;
                if (best < 0) break;
                size_t len;
                char* s = tokenizer_decode(t, &best, 1, &len);
                char pr[64];
                printable(pr, sizeof pr, s, len);
                fprintf(f, " \"%s\"(%u)", pr, cv[best]);
                free(s);
                cv[best] = 0; /* consumed; counts are not needed afterwards */
            }
            fprintf(f, "\n");
        }
    }
    fclose_checked(f, path);
    printf("wrote %s\n", path);
    /* SVG: left, share heatmap (layers x groups); right, class mix per group for every layer. */
    snprintf(path, sizeof path, "%s/groups.svg", out);
    f = fopen(path, "w");
    if (!f) fatal("%s: cannot write", path);
    int cw = 36, ch = 16, x0 = 70, y0 = 60, bw = 300;
    int width = x0 + K * cw + 80 + bw + 140, height = y0 + L * ch * (K > 0 ? 1 : 1) + 60;
    int bar_h = L * ch / K > 14 ? 14 : (L * ch / K < 6 ? 6 : L * ch / K);
    (void)bar_h;
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n",
            width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f,
            "<text x=\"10\" y=\"20\" font-size=\"14\">Focus groups: share of tokens per layer and "
            "group (K=%d, %zu tokens); "
            "class mix of each group, averaged over layers</text>\n",
            K, total);
    double maxs = 0;
    for (int i = 0; i < L * K; i++) maxs = fmax(maxs, share[i] / total);
    for (int k = 0; k < K; k++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">g%d</text>\n",
                x0 + k * cw + cw / 2, y0 - 6, k);
    for (int l = 0; l < L; l++) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">layer %d</text>\n", x0 - 6,
                y0 + l * ch + ch - 4, l);
        for (int k = 0; k < K; k++) {
            double s = share[(size_t)l * K + k] / total;
            int shade = (int)(255 - 200 * (maxs > 0 ? s / maxs : 0));
            fprintf(f,
                    "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"rgb(%d,%d,255)\" "
                    "stroke=\"white\"><title>layer %d group %d: %.3f</title></rect>\n",
                    x0 + k * cw, y0 + l * ch, cw, ch, shade, shade, l, k, s);
            fprintf(f,
                    "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"9\">%.2f</text>\n",
                    x0 + k * cw + cw / 2, y0 + l * ch + ch - 4, s);
        }
    }
    int bx = x0 + K * cw + 80;
    for (int k = 0; k < K; k++) {
        double tot = 0, c[NCLS] = {0};
        for (int l = 0; l < L; l++)
            for (int q = 0; q < NCLS; q++)
                c[q] += cls[((size_t)l * K + k) * NCLS + q],
                    tot += cls[((size_t)l * K + k) * NCLS + q];
        int y = y0 + k * 28;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">group %d</text>\n", bx - 6, y + 14,
                k);
        double x = bx;
        for (int q = 0; q < NCLS; q++) {
            double wq = tot ? bw * c[q] / tot : 0;
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"20\" fill=\"%s\"><title>%s "
                    "%.2f</title></rect>\n",
                    x, y, wq, CLS_COLORS[q], CLS_NAMES[q], tot ? c[q] / tot : 0);
            x += wq;
        }
    }
    for (int q = 0; q < NCLS; q++) {
        int y = y0 + K * 28 + 20 + q * 16;
        fprintf(f,
                "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" "
                "y=\"%d\">",
                bx, y, CLS_COLORS[q], bx + 18, y + 10);
        svg_escape(f, CLS_NAMES[q]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    fclose_checked(f, path);
    printf("wrote %s\n", path);
    free(counts), free(cls), free(share), free(tclass), free(ids);
    tokenizer_free(t);
    model_free(&m);
    return 0;
}
