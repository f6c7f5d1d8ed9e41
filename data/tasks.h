/* tasks.h: zero-shot evaluation sets, read into one shape: a context and its candidate
 * continuations, scored by the log-likelihood a model gives each continuation after the context.
 *
 * The prompt formats follow lm-evaluation-harness (v0.4):
 *   lambada        context = text up to its last space, one continuation " " + last word; scored
 *                  by whether every continuation token is the model's greedy choice (acc) and by
 *                  the likelihood (perplexity over items)
 *   arc_easy,      "Question: {stem}\nAnswer:", continuations " {choice}"
 *   arc_challenge
 *   piqa           "Question: {goal}\nAnswer:", continuations " {sol1}", " {sol2}"
 *   hellaswag      "{activity_label}: {ctx}", continuations " {ending}" (the harness's
 *                  preprocessing: " [title]" -> ". ", other [tags] removed, double spaces
 *                  collapsed, stripped)
 * Files (the formats of ../shared/data/evals, data/README there): JSON Lines for lambada
 * ({"text"}), arc ({"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}) and piqa
 * ({"goal", "sol1", "sol2"} plus a labels file of 0/1 lines next to it: valid.jsonl ->
 * valid-labels.lst); hellaswag as 6-line text records (context, index of the gold ending, four
 * endings), one or several files read in order. Errors are fatal and name the file and line.
 * Tested by tests/test_data.c. */
#ifndef FOCUS_TASKS_H
#define FOCUS_TASKS_H

#include <stddef.h>

typedef enum { TASK_LAMBADA = 0, TASK_ARC = 1, TASK_PIQA = 2, TASK_HELLASWAG = 3 } TaskKind;

typedef struct {
    char* context;
    char** choices; /* continuations, each starting with the separating space */
    int nchoices;
    int gold; /* index of the correct continuation */
} TaskItem;

typedef struct {
    char name[32]; /* lambada, arc_easy, arc_challenge, piqa, hellaswag */
    TaskKind kind;
    TaskItem* items;
    int n;
} TaskSet;

/* Read the set `name` from the files in paths[0..npaths) (several only for hellaswag's parts).
 * kind is implied by the name: lambada, arc_easy, arc_challenge, piqa, hellaswag. */
void taskset_load(TaskSet* ts, const char* name, const char* const* paths, int npaths);
void taskset_free(TaskSet* ts);
/* The kind of a task name, or -1 for an unknown one. */
int task_kind(const char* name);

#endif
