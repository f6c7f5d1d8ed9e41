/* conns.h: the HTTP server's guard over its connections. libmicrohttpd closes a connection that
 * sends nothing for a while, but one that sends a header line a second (slowloris) is never
 * idle, and enough open connections keep everyone else out. The guard gives each request a
 * deadline for its headers and body, counted from the connection's start or its previous
 * request's end, and when the connections near their limit it closes the ones that have waited
 * longest without a complete request, so that a client that sends one gets in. It also keeps the
 * HTTP library's log to a few lines a minute. */
#ifndef FOCUS_SERVE_CONNS_H
#define FOCUS_SERVE_CONNS_H

#include <stdarg.h>

typedef struct ConnGuard ConnGuard;
typedef struct Conn Conn;

typedef enum {
    CONN_WAITING,   /* for a request's headers (a new connection, or one between requests) */
    CONN_BODY,      /* the headers came: for the body */
    CONN_ANSWERING, /* the request is complete: no deadline (a generation may take long) */
} ConnStage;

/* max_conns: the server's connection limit; deadline: seconds a request's headers and body may
 * take. Starts the guard's thread. */
ConnGuard* conn_guard_new(int max_conns, double deadline);
void conn_guard_free(ConnGuard* g);
/* A connection opened on socket fd (its record), or closed (the record freed). */
Conn* conn_open(ConnGuard* g, int fd);
void conn_close(ConnGuard* g, Conn* c);
void conn_stage(ConnGuard* g, Conn* c, ConnStage s);
/* Connections open now, and closed by the guard so far (for /metrics). */
void conn_counts(ConnGuard* g, int* open, long* closed);

/* The HTTP library's log lines (MHD_OPTION_EXTERNAL_LOGGER): at most a few per minute on
 * stderr, then one line saying how many were left out. */
void conn_log(void* cls, const char* fmt, va_list ap);

#endif
