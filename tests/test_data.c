/* test_data.c: token shards and text cleaning.
 * - A shard written and read back gives the same ids; 2-byte ids for vocabularies up to 65536,
 *   4-byte above; the header records vocabulary size and count.
 * - Truncated shards, a wrong magic, a count that disagrees with the file size and ids outside the
 *   vocabulary are refused (checked in child processes, since refusals exit).
 * - text_clean drops the byte-order mark and the Project Gutenberg header and licence, and turns
 *   CRLF into LF.
 * - Zero-shot task files (data/tasks.h) of each format read into the harness's prompts and
 *   continuations; malformed files (a missing field, an answer that is no label, a short
 *   HellaSwag record, a PIQA labels file of the wrong length) are refused. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/io.h"
#include "../data/shard.h"
#include "../data/tasks.h"
#include "../data/text.h"
#include "testutil.h"

static int refused(const char* path) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        size_t n;
        int V;
        free(shard_read(path, &n, &V));
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 1;
}

/* taskset_load of one file (of a task that needs one) in a child: 1 if it exits with 1. */
static int task_refused(const char* name, const char* path) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(3);
        TaskSet ts;
        taskset_load(&ts, name, &path, 1);
        taskset_free(&ts);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 1;
}

static void write_text(const char* path, const char* s) {
    FILE* f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

/* Write text to a file called name and read it as `task`. */
static void load_one(TaskSet* ts, const char* task, const char* name, const char* text) {
    const char* p = tu_path(name);
    write_text(p, text);
    taskset_load(ts, task, &p, 1);
}

static void check_tasks(void) {
    TaskSet ts;
    load_one(
        &ts, "arc_easy", "arc.jsonl",
        "{\"id\": \"x\", \"question\": {\"stem\": \"Why?\", \"choices\": [{\"text\": \"a\", "
        "\"label\": \"A\"}, {\"text\": \"b c\", \"label\": \"B\"}]}, \"answerKey\": \"B\"}\n\n");
    CHECK(ts.n == 1 && !strcmp(ts.items[0].context, "Question: Why?\nAnswer:") &&
              ts.items[0].nchoices == 2 && !strcmp(ts.items[0].choices[1], " b c") &&
              ts.items[0].gold == 1,
          "ARC item read wrong");
    taskset_free(&ts);
    load_one(&ts, "lambada", "lambada.jsonl", "{\"text\": \"He said \\\"hi\\\" to the dog\"}\n");
    CHECK(ts.n == 1 && !strcmp(ts.items[0].context, "He said \"hi\" to the") &&
              !strcmp(ts.items[0].choices[0], " dog"),
          "LAMBADA item read wrong: '%s' / '%s'", ts.items[0].context, ts.items[0].choices[0]);
    taskset_free(&ts);
    write_text(tu_path("valid-labels.lst"), "1\n");
    load_one(&ts, "piqa", "valid.jsonl",
             "{\"goal\": \"g\", \"sol1\": \"one\", \"sol2\": \"two\"}\n");
    CHECK(ts.n == 1 && ts.items[0].gold == 1 && !strcmp(ts.items[0].choices[0], " one"),
          "PIQA item read wrong");
    taskset_free(&ts);
    load_one(&ts, "hellaswag", "hs.txt",
             "Roof: A man [title] climbs  up. he\n2\ne0\ne1 [step] x\ne2\ne3\n");
    CHECK(ts.n == 1 && !strcmp(ts.items[0].context, "Roof: A man. climbs up. he") &&
              !strcmp(ts.items[0].choices[1], " e1 x") && ts.items[0].gold == 2,
          "HellaSwag item read wrong: '%s' / '%s'", ts.items[0].context, ts.items[0].choices[1]);
    taskset_free(&ts);
    /* malformed files: a missing field, an answer that is no label, a short HellaSwag record, a
     * labels file longer than the examples, a line that is not JSON */
    static const struct {
        const char *task, *file, *text;
    } bad[] = {
        {"arc_easy", "bad.jsonl", "{\"question\": {\"stem\": \"s\"}, \"answerKey\": \"A\"}\n"},
        {"arc_challenge", "bad2.jsonl",
         "{\"question\": {\"stem\": \"s\", \"choices\": [{\"text\": \"a\", \"label\": \"A\"}, "
         "{\"text\": \"b\", \"label\": \"B\"}]}, \"answerKey\": \"C\"}\n"},
        {"hellaswag", "bad.txt", "ctx\n1\ne0\ne1\n"},
        {"piqa", "valid-labels.lst", "1\n0\n"}, /* valid.jsonl holds one example */
        {"lambada", "notjson.jsonl", "text = 1\n"},
    };
    int refusals = 0;
    for (int i = 0; i < 5; i++) {
        write_text(tu_path(bad[i].file), bad[i].text);
        const char* f = !strcmp(bad[i].task, "piqa") ? "valid.jsonl" : bad[i].file;
        refusals += task_refused(bad[i].task, tu_path(f));
    }
    CHECK(refusals == 5, "malformed task files: %d of 5 refused", refusals);
    printf(
        "  tasks: ARC, LAMBADA, PIQA, HellaSwag read into harness prompts; %d bad files refused\n",
        refusals);
}

static void write_bytes(const char* path, const void* b, size_t n) {
    FILE* f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

int main(void) {
    enum { N = 5000 };
    int ids[N];
    Rng rng;
    rng_seed(&rng, 1);
    for (int vsize = 0; vsize < 2; vsize++) {
        int V = vsize ? 100000 : 50257;
        for (int i = 0; i < N; i++) ids[i] = (int)(rng_u64(&rng) % (uint64_t)V);
        shard_write(tu_path("t_shard.bin"), ids, N, V);
        size_t n;
        int V2;
        int* back = shard_read(tu_path("t_shard.bin"), &n, &V2);
        CHECK(n == N && V2 == V && !memcmp(back, ids, sizeof ids), "round trip with V=%d", V);
        FILE* f = fopen(tu_path("t_shard.bin"), "rb");
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        CHECK(size == SHARD_HEADER_BYTES + (long)N * (vsize ? 4 : 2), "shard size %ld for V=%d",
              size, V);
        free(back);
    }
    CHECK(shard_is_shard(tu_path("t_shard.bin")), "magic not recognised");
    size_t len;
    char* raw = read_file(tu_path("t_shard.bin"), &len);
    int bad = 0, cases = 0;
    for (size_t cut = 0; cut < len; cut += len / 9 + 1) {
        write_bytes(tu_path("t_bad.bin"), raw, cut);
        bad += refused(tu_path("t_bad.bin"));
        cases++;
    }
    CHECK(bad == cases, "truncated shards: %d of %d refused", bad, cases);
    raw[0] = 'X';
    write_bytes(tu_path("t_bad.bin"), raw, len);
    CHECK(refused(tu_path("t_bad.bin")), "wrong magic accepted");
    raw[0] = 'F';
    uint64_t more = N + 1;
    memcpy(raw + 24, &more, 8);
    write_bytes(tu_path("t_bad.bin"), raw, len);
    CHECK(refused(tu_path("t_bad.bin")), "count larger than the file accepted");
    more = N;
    memcpy(raw + 24, &more, 8);
    uint32_t big = 0xffffffu;
    memcpy(raw + SHARD_HEADER_BYTES, &big, 4);
    write_bytes(tu_path("t_bad.bin"), raw, len);
    CHECK(refused(tu_path("t_bad.bin")), "id outside the vocabulary accepted");
    printf(
        "  shards: round trips exact; %d truncations, wrong magic, bad count and bad id refused\n",
        cases);
    free(raw);

    char text[] =
        "\xEF\xBB\xBFThe Project Gutenberg eBook\r\n*** START OF THE PROJECT GUTENBERG EBOOK X "
        "***\r\n"
        "Call me Ishmael.\r\nSome years ago.\r\n*** END OF THE PROJECT GUTENBERG EBOOK X "
        "***\r\nLicence.\r\n";
    size_t n = text_clean(text, strlen(text));
    CHECK(n == strlen("Call me Ishmael.\nSome years ago.\n") &&
              !strcmp(text, "Call me Ishmael.\nSome years ago.\n"),
          "text_clean gave '%s'", text);
    char plain[] = "no markers\r\nhere";
    text_clean(plain, strlen(plain));
    CHECK(!strcmp(plain, "no markers\nhere"), "text_clean without markers gave '%s'", plain);
    check_tasks();
    return tu_finish("test_data");
}
