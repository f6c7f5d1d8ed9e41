/* conns.c: deadlines and room for the HTTP server's connections (see conns.h). */
#define _GNU_SOURCE
#include "conns.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "../kernels/common.h"

struct Conn {
    int fd;
    ConnStage stage;
    double since; /* when its stage began */
    int kicked;   /* shut down by the guard, not closed yet */
    Conn *prev, *next;
};

struct ConnGuard {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_t th;
    int stop, max, open;
    double deadline;
    long closed;
    Conn* head;
};

/* The connections kept free for clients that send a request: the guard closes waiting ones
 * when fewer are left. */
static int reserve(const ConnGuard* g) { return g->max / 8 > 4 ? g->max / 8 : 4; }

/* A connection that has waited at least this long without a complete request may be closed to
 * make room (one whose headers are on their way is not). */
#define ROOM_AFTER 0.5

static void kick(ConnGuard* g, Conn* c) {
    shutdown(c->fd, SHUT_RDWR); /* its thread's next read ends; libmicrohttpd closes it */
    c->kicked = 1;
    g->closed++;
}

static void* guard_main(void* arg) {
    ConnGuard* g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g->wake, &g->mu, &until);
        const double now = now_seconds();
        int live = 0;
        for (Conn* c = g->head; c; c = c->next) {
            if (c->kicked) continue;
            if (c->stage != CONN_ANSWERING && now - c->since > g->deadline)
                kick(g, c); /* its headers or body too slow (or idle past the deadline) */
            else
                live++;
        }
        /* room: into the reserve, the oldest waiting connections go until half the limit is
         * free (the library stops accepting at its limit, and the connections behind in the
         * listen queue, a client with a request among them, come in as room is made; the list
         * is newest first, so its tail is the oldest) */
        if (live > g->max - reserve(g)) {
            Conn* tail = g->head;
            while (tail && tail->next) tail = tail->next;
            for (Conn* c = tail; c && live > g->max / 2; c = c->prev)
                if (!c->kicked && c->stage == CONN_WAITING && now - c->since >= ROOM_AFTER)
                    kick(g, c), live--;
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

ConnGuard* conn_guard_new(int max_conns, double deadline) {
    ConnGuard* g = callocCheck(1, sizeof(ConnGuard));
    g->max = max_conns, g->deadline = deadline;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->th, NULL, guard_main, g)) fatal("serve: cannot start a thread");
    return g;
}

void conn_guard_free(ConnGuard* g) {
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->th, NULL);
    while (g->head) {
        Conn* c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->wake);
    free(g);
}

Conn* conn_open(ConnGuard* g, int fd) {
    Conn* c = callocCheck(1, sizeof(Conn));
    c->fd = fd, c->stage = CONN_WAITING, c->since = now_seconds();
    pthread_mutex_lock(&g->mu);
    c->next = g->head;
    if (g->head) g->head->prev = c;
    g->head = c;
    g->open++;
    pthread_mutex_unlock(&g->mu);
    return c;
}

void conn_close(ConnGuard* g, Conn* c) {
    /* (libmicrohttpd calls this before it closes the socket: the guard never shuts down a
     * number the system has given to another connection) */
    pthread_mutex_lock(&g->mu);
    if (c->prev) c->prev->next = c->next;
    if (c->next) c->next->prev = c->prev;
    if (g->head == c) g->head = c->next;
    g->open--;
    pthread_mutex_unlock(&g->mu);
    free(c);
}

void conn_stage(ConnGuard* g, Conn* c, ConnStage s) {
    pthread_mutex_lock(&g->mu);
    c->stage = s;
    c->since = now_seconds();
    pthread_mutex_unlock(&g->mu);
}

void conn_counts(ConnGuard* g, int* open, long* closed) {
    pthread_mutex_lock(&g->mu);
    *open = g->open;
    *closed = g->closed;
    pthread_mutex_unlock(&g->mu);
}

/* ------------------------------------------------------------------ the library's log */

enum { LOG_LINES = 5 };              /* a window's lines at most */
static const double LOG_WINDOW = 60; /* seconds */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static double log_start;
static int log_lines;
static long log_dropped;

void conn_log(void* cls, const char* fmt, va_list ap) {
    (void)cls;
    pthread_mutex_lock(&log_mu);
    const double now = now_seconds();
    if (now - log_start >= LOG_WINDOW) {
        if (log_dropped)
            fprintf(stderr, "focus serve: %ld more messages of the HTTP library left out\n",
                    log_dropped);
        log_start = now, log_lines = 0, log_dropped = 0;
    }
    if (log_lines < LOG_LINES) {
        log_lines++;
        fputs("focus serve: http: ", stderr);
        vfprintf(stderr, fmt, ap);
        if (log_lines == LOG_LINES)
            fprintf(stderr,
                    "focus serve: (more such lines in the next %.0f s are counted, not "
                    "printed)\n",
                    LOG_WINDOW);
    } else {
        log_dropped++;
    }
    pthread_mutex_unlock(&log_mu);
}
