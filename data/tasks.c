/* tasks.c: reading the zero-shot evaluation sets (see tasks.h). */
#define _GNU_SOURCE /* strdup */
#include "tasks.h"

#include <cjson/cJSON.h>
#include <string.h>

#include "../io/io.h"
#include "../kernels/common.h"

int task_kind(const char* name) {
    if (!strcmp(name, "lambada")) return TASK_LAMBADA;
    if (!strcmp(name, "arc_easy") || !strcmp(name, "arc_challenge")) return TASK_ARC;
    if (!strcmp(name, "piqa")) return TASK_PIQA;
    if (!strcmp(name, "hellaswag")) return TASK_HELLASWAG;
    return -1;
}

/* "prefix" + s + "suffix" as a new string */
static char* join3(const char* prefix, const char* s, const char* suffix) {
    size_t a = strlen(prefix), b = strlen(s), c = strlen(suffix);
    char* r = mallocCheck(a + b + c + 1);
    memcpy(r, prefix, a);
    memcpy(r + a, s, b);
    memcpy(r + a + b, suffix, c + 1);
    return r;
}

static TaskItem* add_item(TaskSet* ts, int nchoices) {
    ts->items = reallocCheck(ts->items, sizeof(TaskItem) * (size_t)(ts->n + 1));
    TaskItem* it = &ts->items[ts->n++];
    memset(it, 0, sizeof *it);
    it->choices = callocCheck((size_t)nchoices, sizeof(char*));
    it->nchoices = nchoices;
    return it;
}

/* A string member of a JSON object, or a fatal error naming the file and line. */
static const char* json_str(const cJSON* o, const char* key, const char* path, int line) {
    const cJSON* v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) fatal("%s: line %d: expected a string field \"%s\"", path, line, key);
    return v->valuestring;
}

static void lambada_item(TaskSet* ts, const cJSON* o, const char* path, int line) {
    const char* text = json_str(o, "text", path, line);
    const char* sp = strrchr(text, ' ');
    if (!sp || !sp[1] || sp == text)
        fatal("%s: line %d: a LAMBADA text needs a context and a last word", path, line);
    TaskItem* it = add_item(ts, 1);
    it->context = strndup(text, (size_t)(sp - text));
    it->choices[0] = strdup(sp); /* " " + the last word */
}

static void arc_item(TaskSet* ts, const cJSON* o, const char* path, int line) {
    const cJSON* q = cJSON_GetObjectItemCaseSensitive(o, "question");
    const cJSON* ch = cJSON_GetObjectItemCaseSensitive(q, "choices");
    const char* answer = json_str(o, "answerKey", path, line);
    int n = cJSON_GetArraySize(ch);
    if (!cJSON_IsArray(ch) || n < 2) fatal("%s: line %d: expected question.choices", path, line);
    TaskItem* it = add_item(ts, n);
    it->context = join3("Question: ", json_str(q, "stem", path, line), "\nAnswer:");
    it->gold = -1;
    for (int c = 0; c < n; c++) {
        const cJSON* e = cJSON_GetArrayItem(ch, c);
        it->choices[c] = join3(" ", json_str(e, "text", path, line), "");
        if (!strcmp(json_str(e, "label", path, line), answer)) it->gold = c;
    }
    if (it->gold < 0)
        fatal("%s: line %d: answerKey \"%s\" is not a choice label", path, line, answer);
}

static void piqa_item(TaskSet* ts, const cJSON* o, const char* path, int line) {
    TaskItem* it = add_item(ts, 2);
    it->context = join3("Question: ", json_str(o, "goal", path, line), "\nAnswer:");
    it->choices[0] = join3(" ", json_str(o, "sol1", path, line), "");
    it->choices[1] = join3(" ", json_str(o, "sol2", path, line), "");
    it->gold = -1; /* from the labels file */
}

/* One JSON object per line; empty lines are skipped. */
static void load_jsonl(TaskSet* ts, const char* path) {
    size_t len;
    char* text = read_file(path, &len);
    int line = 0;
    for (char *p = text, *next; p && *p; p = next) {
        line++;
        char* nl = strchr(p, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        if (!*p || (*p == '\r' && !p[1])) continue;
        cJSON* o = cJSON_Parse(p);
        if (!cJSON_IsObject(o)) fatal("%s: line %d: not a JSON object", path, line);
        if (ts->kind == TASK_LAMBADA) lambada_item(ts, o, path, line);
        if (ts->kind == TASK_ARC) arc_item(ts, o, path, line);
        if (ts->kind == TASK_PIQA) piqa_item(ts, o, path, line);
        cJSON_Delete(o);
    }
    free(text);
    if (!ts->n) fatal("%s: no examples", path);
}

/* PIQA's answers: valid.jsonl -> valid-labels.lst beside it, one 0/1 line per example. */
static void piqa_labels(TaskSet* ts, const char* path) {
    char lab[4096];
    const char* dot = strrchr(path, '.');
    snprintf(lab, sizeof lab, "%.*s-labels.lst", (int)(dot ? dot - path : (long)strlen(path)),
             path);
    size_t len;
    char* text = read_file_opt(lab, &len);
    if (!text) fatal("%s: PIQA needs its labels file %s", path, lab);
    int i = 0, line = 0;
    char* save = NULL;
    for (char* p = strtok_r(text, "\n", &save); p; p = strtok_r(NULL, "\n", &save)) {
        line++;
        if ((p[0] != '0' && p[0] != '1') || (p[1] && p[1] != '\r'))
            fatal("%s: line %d: expected 0 or 1", lab, line);
        if (i == ts->n) fatal("%s: more labels than the %d examples of %s", lab, ts->n, path);
        ts->items[i++].gold = p[0] - '0';
    }
    free(text);
    if (i != ts->n) fatal("%s: %d labels for %d examples in %s", lab, i, ts->n, path);
}

/* lm-evaluation-harness's HellaSwag preprocessing: strip, " [title]" -> ". ", other [tags]
 * removed, double spaces collapsed (one pass). */
static char* hellaswag_clean(const char* s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\r')) n--;
    char* out = mallocCheck(2 * n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (!strncmp(s + i, " [title]", 8)) {
            memcpy(out + o, ". ", 2), o += 2, i += 8;
        } else if (s[i] == '[' && memchr(s + i, ']', n - i)) {
            i = (size_t)((const char*)memchr(s + i, ']', n - i) - s) + 1;
        } else {
            out[o++] = s[i++];
        }
    }
    out[o] = 0;
    size_t w = 0; /* "  " -> " ", non-overlapping, like str.replace */
    for (size_t r = 0; r < o; r++, w++) {
        out[w] = out[r];
        if (out[r] == ' ' && r + 1 < o && out[r + 1] == ' ') r++;
    }
    out[w] = 0;
    return out;
}

/* 6-line records: context, gold index (0-3), four endings. */
static void load_hellaswag(TaskSet* ts, const char* path) {
    size_t len;
    char* text = read_file(path, &len);
    char* lines[6];
    int k = 0, line = 0;
    for (char *p = text, *next; p && *p; p = next) {
        line++;
        char* nl = strchr(p, '\n');
        next = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        lines[k++] = p;
        if (k < 6) continue;
        k = 0;
        char* end;
        long gold = strtol(lines[1], &end, 10);
        if (end == lines[1] || (*end && *end != '\r') || gold < 0 || gold > 3)
            fatal("%s: line %d: expected the gold ending's index (0-3)", path, line - 4);
        TaskItem* it = add_item(ts, 4);
        it->context = hellaswag_clean(lines[0]);
        it->gold = (int)gold;
        for (int c = 0; c < 4; c++) {
            char* e = hellaswag_clean(lines[2 + c]);
            it->choices[c] = join3(" ", e, "");
            free(e);
        }
    }
    if (k) fatal("%s: ends inside a record (6 lines per task, %d left over)", path, k);
    free(text);
}

void taskset_load(TaskSet* ts, const char* name, const char* const* paths, int npaths) {
    memset(ts, 0, sizeof *ts);
    int kind = task_kind(name);
    if (kind < 0)
        fatal("unknown task '%s' (lambada, arc_easy, arc_challenge, piqa, hellaswag)", name);
    snprintf(ts->name, sizeof ts->name, "%s", name);
    ts->kind = (TaskKind)kind;
    if (npaths < 1) fatal("task %s: no file given", name);
    if (kind != TASK_HELLASWAG && npaths != 1) fatal("task %s: expected one file", name);
    for (int i = 0; i < npaths; i++) {
        if (kind == TASK_HELLASWAG)
            load_hellaswag(ts, paths[i]);
        else
            load_jsonl(ts, paths[i]);
    }
    if (kind == TASK_PIQA) piqa_labels(ts, paths[0]);
    if (!ts->n) fatal("%s: no examples", paths[0]);
}

void taskset_free(TaskSet* ts) {
    for (int i = 0; i < ts->n; i++) {
        free(ts->items[i].context);
        for (int c = 0; c < ts->items[i].nchoices; c++) free(ts->items[i].choices[c]);
        free(ts->items[i].choices);
    }
    free(ts->items);
    memset(ts, 0, sizeof *ts);
}
