/* test_data.c: token shards and text cleaning.
 * - A shard written and read back gives the same ids; 2-byte ids for vocabularies up to 65536,
 *   4-byte above; the header records vocabulary size and count.
 * - Truncated shards, a wrong magic, a count that disagrees with the file size and ids outside the
 *   vocabulary are refused (checked in child processes, since refusals exit).
 * - text_clean drops the byte-order mark and the Project Gutenberg header and licence, and turns
 *   CRLF into LF. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/io.h"
#include "../data/shard.h"
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
    return tu_finish("test_data");
}
