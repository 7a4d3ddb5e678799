/*
 * streamgen: the paced token engine and the load generator of the slow-stream benchmark
 * (bench/streams.py, docs/performance.md "Many slow streams").
 *
 *   streamgen serve PORT
 *       An engine that streams tokens at a steady rate. GET /api/tags and /v1/models list
 *       llama3:latest; POST /api/chat streams Ollama NDJSON, any other POST streams OpenAI SSE.
 *       The request body's "bench_rate":R and "bench_events":E give the rate (events per second;
 *       0 = all at once) and the number of token events; every token event is its own HTTP chunk
 *       and carries "t":<CLOCK_MONOTONIC ns at send>; "bench_batch":K (burst only, 1-64, default
 *       1) writes a burst K events per send. Streams are paced from their own arrival
 *       time, one timerfd for all of them. HTTP/1.1: chunked and keep-alive; HTTP/1.0: closed.
 *
 *   streamgen load PORT PATH STREAMS RATE EVENTS RAMP_S WARM_S WINDOW_S TIMEOUT_S
 *       Opens STREAMS streaming requests, spread evenly over RAMP_S seconds, and reads them all
 *       with epoll. Every "t": stamp received inside the window [RAMP_S + WARM_S, + WINDOW_S]
 *       gives one latency sample (receive time minus send time, both CLOCK_MONOTONIC on this
 *       machine). Prints one JSON line: streams, completed, errors, samples and the latency
 *       percentiles in microseconds.
 *
 *   streamgen relay PORT PATH CONNS EVENTS SECONDS [BATCH]
 *       CONNS keep-alive connections, each requesting burst streams (rate 0, "bench_batch":BATCH)
 *       of EVENTS events back to back for SECONDS; prints the token events received before the
 *       deadline (partial responses included), responses, errors and the elapsed seconds as one
 *       JSON line. A connection the server closes between two responses is reopened (nginx
 *       closes one after keepalive_requests); that is not an error.
 *
 * One process, one thread, epoll, no allocation on the hot path: the point is that neither the
 * engine nor the client is the limit (a direct run shows their ceiling). Built by bench/streams.py
 * with `cc -O2 -o streamgen streamgen.c`; not part of the package.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_EVENTS 512
#define IN_CAP 8192
#define BUCKETS 2000000 /* 1 us buckets up to 2 s */
#define SLOW_BUCKETS 600000 /* then 1 ms buckets up to 602 s (a saturated proxy queues) */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void nonblock(int fd) {
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) die("fcntl");
}

static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ------------------------------------------------------------------ engine */

typedef struct conn {
    int fd;
    unsigned gen;      /* bumped when the slot is reused, so stale heap entries are skipped */
    int streaming;     /* a paced stream is in progress */
    int ndjson;
    int chunked;       /* HTTP/1.1: chunked + keep-alive; else close-delimited */
    uint64_t period;   /* ns between events; 0 = burst */
    long events, sent;
    long batch;        /* burst: events per send (default 1: one send per event) */
    int usage;         /* real SSE: the request asked for stream_options.include_usage */
    char model[80];    /* real mode: the request's "model", echoed in every chunk */
    char in[IN_CAP];
    size_t in_len;
    char *out;         /* bytes the socket did not take yet */
    size_t out_len, out_off, out_cap;
    struct conn *next_free;
} conn;

static conn *free_list;

typedef struct {
    uint64_t due;
    conn *c;
    unsigned gen;
} slot;

static slot *heap;
static size_t heap_len, heap_cap;
static int epfd, tfd;

static void heap_push(uint64_t due, conn *c) {
    if (heap_len == heap_cap) {
        heap_cap = heap_cap ? heap_cap * 2 : 4096;
        heap = realloc(heap, heap_cap * sizeof(slot));
        if (!heap) die("realloc");
    }
    size_t i = heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (heap[p].due <= due) break;
        heap[i] = heap[p];
        i = p;
    }
    heap[i] = (slot){due, c, c->gen};
}

static slot heap_pop(void) {
    slot top = heap[0], last = heap[--heap_len];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        uint64_t md = last.due;
        if (l < heap_len && heap[l].due < md) { m = l; md = heap[l].due; }
        if (r < heap_len && heap[r].due < md) m = r;
        if (m == i) break;
        heap[i] = heap[m];
        i = m;
    }
    if (heap_len) heap[i] = last;
    return top;
}

static void arm_timer(void) {
    struct itimerspec its = {0};
    if (heap_len) {
        uint64_t due = heap[0].due;
        if (due == 0) due = 1;
        its.it_value.tv_sec = (time_t)(due / 1000000000ull);
        its.it_value.tv_nsec = (long)(due % 1000000000ull);
    }
    if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
}

static void close_conn(conn *c) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->gen++;
    c->streaming = 0;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = c->out_cap = 0;
    c->in_len = 0;
    c->next_free = free_list; /* kept, not freed: stale heap entries still point here */
    free_list = c;
}

/* Send now what the socket takes; keep the rest and wait for EPOLLOUT. 0 = connection gone. */
static int send_bytes(conn *c, const char *data, size_t len) {
    if (c->out_len == c->out_off) {
        ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) return 0;
            n = 0;
        }
        data += n;
        len -= (size_t)n;
        if (!len) return 1;
        c->out_len = c->out_off = 0;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
        epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    }
    if (c->out_len + len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + len) cap *= 2;
        c->out = realloc(c->out, cap);
        if (!c->out) die("realloc");
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
    return 1;
}

static size_t frame(conn *c, char *buf, const char *payload, size_t n) {
    if (!c->chunked) {
        memcpy(buf, payload, n);
        return n;
    }
    int h = sprintf(buf, "%zx\r\n", n);
    memcpy(buf + h, payload, n);
    memcpy(buf + h + n, "\r\n", 2);
    return (size_t)h + n + 2;
}

/* serve ... real EVENTS BATCH: realistic chunks (the engine's real payloads, model echoed) and,
 * for a request that does not say (a translated one: the bench_* fields are dropped), bursts of
 * EVENTS events BATCH per send. */
static int real_mode;
static long real_events = 1000, real_batch = 1;

/* RFC 3339 UTC with nanoseconds, as Ollama's created_at. */
static int created_at(char *out) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    return (int)n + sprintf(out + n, ".%09ldZ", ts.tv_nsec);
}

static size_t token_event(conn *c, char *buf) {
    char payload[512];
    int n;
    if (real_mode && c->ndjson) {
        char stamp[48];
        created_at(stamp);
        n = sprintf(payload,
                    "{\"model\":\"%s\",\"created_at\":\"%s\",\"message\":{\"role\":\"assistant\","
                    "\"content\":\"tok%ld \"},\"done\":false}\n",
                    c->model, stamp, c->sent);
    } else if (real_mode)
        n = sprintf(payload,
                    "data: {\"id\":\"chatcmpl-241\",\"object\":\"chat.completion.chunk\","
                    "\"created\":1796085388,\"model\":\"%s\",\"choices\":[{\"index\":0,"
                    "\"delta\":{\"content\":\"tok%ld \"},\"finish_reason\":null}]}\n\n",
                    c->model, c->sent);
    else if (c->ndjson)
        n = sprintf(payload,
                    "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\",\"content\":\"tok%ld \"},"
                    "\"done\":false,\"t\":%llu}\n",
                    c->sent, (unsigned long long)now_ns());
    else
        n = sprintf(payload,
                    "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                    "\"delta\":{\"content\":\"tok%ld \"}}],\"t\":%llu}\n\n",
                    c->sent, (unsigned long long)now_ns());
    return frame(c, buf, payload, (size_t)n);
}

static size_t final_event(conn *c, char *buf) {
    char payload[1024];
    const char *end = payload;
    size_t n;
    if (real_mode && c->ndjson) {
        char stamp[48];
        created_at(stamp);
        sprintf(payload,
                "{\"model\":\"%s\",\"created_at\":\"%s\",\"message\":{\"role\":\"assistant\","
                "\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"total_duration\":1000,"
                "\"load_duration\":10,\"prompt_eval_count\":9,\"prompt_eval_duration\":100,"
                "\"eval_count\":%ld,\"eval_duration\":800}\n",
                c->model, stamp, c->sent);
    } else if (real_mode) {
        int k = sprintf(payload,
                        "data: {\"id\":\"chatcmpl-241\",\"object\":\"chat.completion.chunk\","
                        "\"created\":1796085388,\"model\":\"%s\",\"choices\":[{\"index\":0,"
                        "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
                        c->model);
        if (c->usage)
            k += sprintf(payload + k,
                         "data: {\"id\":\"chatcmpl-241\",\"object\":\"chat.completion.chunk\","
                         "\"created\":1796085388,\"model\":\"%s\",\"choices\":[],\"usage\":"
                         "{\"prompt_tokens\":9,\"completion_tokens\":%ld,\"total_tokens\":%ld}}\n\n",
                         c->model, c->sent, c->sent + 9);
        strcpy(payload + k, "data: [DONE]\n\n");
    } else {
        end = c->ndjson ? "{\"model\":\"llama3\",\"message\":{\"role\":\"assistant\","
                          "\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\"}\n"
                        : "data: [DONE]\n\n";
    }
    n = frame(c, buf, end, strlen(end));
    if (c->chunked) {
        memcpy(buf + n, "0\r\n\r\n", 5);
        n += 5;
    }
    return n;
}

static int finish_stream(conn *c) {
    char buf[1200];
    c->streaming = 0;
    if (!send_bytes(c, buf, final_event(c, buf))) return 0;
    if (!c->chunked && c->out_len == c->out_off) return 0; /* close-delimited: done */
    return 1;
}

/* One due event of a paced stream; 0 = connection gone. */
static int tick(conn *c) {
    char buf[1200];
    if (!send_bytes(c, buf, token_event(c, buf))) return 0;
    if (++c->sent >= c->events) return finish_stream(c);
    return 1;
}

static void respond_fixed(conn *c, const char *type, const char *body) {
    char buf[1024];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %zu\r\n\r\n%s", type,
                     strlen(body), body);
    send_bytes(c, buf, (size_t)n);
}

static long body_number(const char *body, size_t len, const char *key, long fallback) {
    char *at = memmem(body, len, key, strlen(key));
    return at ? strtol(at + strlen(key), NULL, 10) : fallback;
}

/* The request's "model" string (compact or with one space), at most 79 bytes; "llama3" if none. */
static void body_model(conn *c, const char *body, size_t len) {
    strcpy(c->model, "llama3");
    char *at = memmem(body, len, "\"model\":", 8);
    if (!at) return;
    at += 8;
    while (at < body + len && *at == ' ') at++;
    if (at >= body + len || *at != '"') return;
    at++;
    char *q = memchr(at, '"', (size_t)(body + len - at));
    if (!q || q - at >= (long)sizeof c->model) return;
    memcpy(c->model, at, (size_t)(q - at));
    c->model[q - at] = 0;
}

/* Handle every complete request in c->in; 0 = close the connection. */
static int serve_requests(conn *c) {
    while (!c->streaming) {
        char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
        if (!end) return c->in_len < IN_CAP;
        size_t head = (size_t)(end - c->in) + 4;
        long length = 0;
        char *cl = memmem(c->in, head, "ontent-Length:", 14);
        if (!cl) cl = memmem(c->in, head, "ontent-length:", 14);
        if (cl) length = strtol(cl + 14, NULL, 10);
        if (head + (size_t)length > IN_CAP) return 0;
        if (c->in_len < head + (size_t)length) return 1;
        char *body = c->in + head;
        c->chunked = memmem(c->in, head, "HTTP/1.1\r\n", 10) != NULL;
        if (strncmp(c->in, "GET ", 4) == 0) {
            if (strncmp(c->in + 4, "/api/tags", 9) == 0)
                respond_fixed(c, "application/json",
                              "{\"models\":[{\"name\":\"llama3:latest\",\"model\":\"llama3:latest\"}]}");
            else if (strncmp(c->in + 4, "/v1/models", 10) == 0)
                respond_fixed(c, "application/json",
                              "{\"object\":\"list\",\"data\":[{\"id\":\"llama3:latest\","
                              "\"object\":\"model\"}]}");
            else if (strncmp(c->in + 4, "/api/ps", 7) == 0)
                respond_fixed(c, "application/json", "{\"models\":[]}");
            else
                respond_fixed(c, "application/json", "{\"version\":\"0\"}");
        } else {
            c->ndjson = strncmp(c->in, "POST /api/chat ", 15) == 0;
            long rate = body_number(body, (size_t)length, "\"bench_rate\":", real_mode ? 0 : 20);
            c->events = body_number(body, (size_t)length, "\"bench_events\":",
                                    real_mode ? real_events : 100);
            c->batch = body_number(body, (size_t)length, "\"bench_batch\":",
                                   real_mode ? real_batch : 1);
            c->usage = memmem(body, (size_t)length, "\"include_usage\":true", 20) != NULL;
            body_model(c, body, (size_t)length);
            if (c->batch > 64) c->batch = 64;
            c->period = rate > 0 ? 1000000000ull / (uint64_t)rate : 0;
            c->sent = 0;
            c->streaming = 1;
            char buf[256];
            int n = sprintf(buf, "HTTP/1.1 200 OK\r\ncontent-type: %s\r\n%s\r\n",
                            c->ndjson ? "application/x-ndjson" : "text/event-stream",
                            c->chunked ? "transfer-encoding: chunked\r\n" : "connection: close\r\n");
            if (!send_bytes(c, buf, (size_t)n)) return 0;
            if (c->period) {
                if (!tick(c)) return 0;
                if (c->streaming) heap_push(now_ns() + c->period, c);
            } else if (c->batch <= 1) {
                while (c->streaming)
                    if (!tick(c)) return 0;
            } else {
                /* A burst written `batch` events per send (each still its own HTTP chunk). */
                static char burst[64 * 512 + 1200];
                size_t used = 0;
                int alive = 1;
                while (c->streaming && alive) {
                    used += token_event(c, burst + used);
                    if (++c->sent >= c->events) {
                        c->streaming = 0;
                        used += final_event(c, burst + used);
                    }
                    if (!c->streaming || c->sent % c->batch == 0) {
                        alive = send_bytes(c, burst, used);
                        used = 0;
                    }
                }
                if (!alive) return 0;
                if (!c->chunked && c->out_len == c->out_off) return 0; /* close-delimited: done */
            }
        }
        memmove(c->in, c->in + head + length, c->in_len - head - (size_t)length);
        c->in_len -= head + (size_t)length;
        if (!c->chunked && !c->streaming && c->out_len == c->out_off) return 0;
    }
    return 1;
}

static int flush_out(conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
        c->out_off += (size_t)n;
    }
    c->out_len = c->out_off = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
    return c->chunked || c->streaming; /* close-delimited answer fully sent: close */
}

__attribute__((noreturn)) static void serve(int port) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0) die("bind");
    if (listen(lfd, 4096) < 0) die("listen");
    nonblock(lfd);
    epfd = epoll_create1(0);
    tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &lfd};
    epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &ev);
    ev.data.ptr = &tfd;
    epoll_ctl(epfd, EPOLL_CTL_ADD, tfd, &ev);
    struct epoll_event events[MAX_EVENTS];
    for (;;) {
        int n = epoll_wait(epfd, events, MAX_EVENTS, -1);
        if (n < 0 && errno == EINTR) continue;
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &lfd) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn *c = free_list;
                    if (c) {
                        free_list = c->next_free;
                    } else if (!(c = calloc(1, sizeof(conn)))) {
                        die("calloc");
                    }
                    c->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &cev);
                }
            } else if (p == &tfd) {
                uint64_t expirations;
                if (read(tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) die("read");
            } else {
                conn *c = p;
                int keep = 1;
                if (events[i].events & EPOLLOUT) keep = flush_out(c);
                if (keep && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
                    ssize_t got = recv(c->fd, c->in + c->in_len, IN_CAP - c->in_len, 0);
                    if (got <= 0) {
                        keep = got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
                    } else {
                        c->in_len += (size_t)got;
                        keep = serve_requests(c);
                    }
                }
                if (!keep) close_conn(c);
            }
        }
        /* Every paced event that is due, in due order; then re-arm for the next one. */
        uint64_t now = now_ns();
        while (heap_len && heap[0].due <= now) {
            slot s = heap_pop();
            conn *c = s.c;
            if (!c || c->gen != s.gen || c->fd < 0 || !c->streaming) continue;
            if (!tick(c)) {
                close_conn(c);
                continue;
            }
            if (c->streaming) heap_push(s.due + c->period, c);
            else if (!c->chunked && c->out_len == c->out_off) close_conn(c);
        }
        arm_timer();
    }
}

/* ------------------------------------------------------------------ client */

enum { C_IDLE, C_OPEN, C_DONE, C_FAILED };

typedef struct {
    int fd, state, status_seen;
    char carry[64];
    size_t carry_len;
    int ended;    /* relay: the stream's end marker was seen in this response */
    char tail[8]; /* relay: the last bytes received, to see the terminating chunk */
    size_t tail_len;
} client;

static uint32_t *hist, *slow_hist;
static uint64_t samples, over, max_us, sum_us;

static void record(uint64_t latency_ns) {
    uint64_t us = latency_ns / 1000;
    if (us > max_us) max_us = us;
    sum_us += us;
    samples++;
    if (us < BUCKETS) {
        hist[us]++;
    } else {
        over++;
        uint64_t ms = (us - BUCKETS) / 1000;
        slow_hist[ms < SLOW_BUCKETS ? ms : SLOW_BUCKETS - 1]++;
    }
}

static uint64_t percentile(double q) {
    uint64_t rank = (uint64_t)(q * (double)samples), seen = 0;
    for (uint64_t i = 0; i < BUCKETS; i++) {
        seen += hist[i];
        if (seen > rank) return i;
    }
    for (uint64_t i = 0; i < SLOW_BUCKETS; i++) {
        seen += slow_hist[i];
        if (seen > rank) return BUCKETS + i * 1000;
    }
    return max_us;
}

/* relay with a MODEL: count "content":"tok markers, not "t": stamps (an Anthropic Messages
 * stream, relay to /v1/messages: "text":"tok markers, ended by message_stop) */
static int count_content, messages_stream;
#define CONTENT_MARK (messages_stream ? "\"text\":\"tok" : "\"content\":\"tok")

/* Scan received bytes for "t":<ns> stamps and the stream's end; 1 = end seen. */
static int scan(client *k, const char *data, size_t len, uint64_t recv_ns, uint64_t lo,
                uint64_t hi, int ndjson) {
    char buf[64 + 65536];
    size_t n = k->carry_len;
    memcpy(buf, k->carry, n);
    memcpy(buf + n, data, len);
    n += len;
    int ended = 0;
    const char *end_mark = ndjson ? "\"done\":true" : messages_stream ? "message_stop" : "[DONE]";
    if (memmem(buf, n, end_mark, strlen(end_mark))) ended = 1;
    size_t keep_from = n > 12 ? n - 12 : 0; /* a marker cut by the read end */
    char *at = buf;
    if (count_content) {
        size_t mark = strlen(CONTENT_MARK);
        /* the carry (at most mark - 1 bytes past what was counted) cannot hold a whole mark */
        while ((at = memmem(at, (size_t)(buf + n - at), CONTENT_MARK, mark)) != NULL) {
            if (recv_ns >= lo && recv_ns < hi) record(0);
            at += mark;
        }
        keep_from = n > mark - 1 ? n - (mark - 1) : 0;
        k->carry_len = n - keep_from;
        memcpy(k->carry, buf + keep_from, k->carry_len);
        return ended;
    }
    while ((at = memmem(at, (size_t)(buf + n - at), "\"t\":", 4)) != NULL) {
        char *digits = at + 4, *q = digits;
        uint64_t value = 0;
        while (q < buf + n && *q >= '0' && *q <= '9') value = value * 10 + (uint64_t)(*q++ - '0');
        if (q == buf + n) { /* the number may go on in the next read */
            keep_from = (size_t)(at - buf);
            break;
        }
        if (q > digits && recv_ns >= lo && recv_ns < hi && recv_ns >= value) record(recv_ns - value);
        at = q;
    }
    k->carry_len = n - keep_from;
    if (k->carry_len > sizeof k->carry) k->carry_len = 0;
    memcpy(k->carry, buf + keep_from, k->carry_len);
    return ended;
}

/* The streaming POST both clients send: RATE events/s (0 = burst, BATCH events per engine write). */
static int stream_request(char *out, size_t cap, const char *path, long rate, long events,
                          long batch, const char *model) {
    char body[512];
    int blen = snprintf(body, sizeof body,
                        "{\"model\":\"%s\",\"stream\":true,\"bench_rate\":%ld,\"bench_events\":%ld,"
                        "\"bench_batch\":%ld,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
                        model, rate, events, batch);
    return snprintf(out, cap,
                    "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\n\r\n%s",
                    path, blen, body);
}

static int load(int argc, char **argv) {
    if (argc < 11) {
        fprintf(stderr, "usage: streamgen load PORT PATH STREAMS RATE EVENTS RAMP WARM WINDOW TIMEOUT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    const char *path = argv[3];
    int streams = atoi(argv[4]);
    long rate = atol(argv[5]), events_each = atol(argv[6]);
    double ramp = atof(argv[7]), warm = atof(argv[8]), window = atof(argv[9]),
           timeout = atof(argv[10]);
    int ndjson = strcmp(path, "/api/chat") == 0;
    hist = calloc(BUCKETS, sizeof(uint32_t));
    slow_hist = calloc(SLOW_BUCKETS, sizeof(uint32_t));
    client *clients = calloc((size_t)streams, sizeof(client));
    if (!hist || !slow_hist || !clients) die("calloc");
    char request[1024];
    int rlen = stream_request(request, sizeof request, path, rate, events_each, 1, "llama3");
    epfd = epoll_create1(0);
    uint64_t start = now_ns();
    uint64_t lo = start + (uint64_t)((ramp + warm) * 1e9), hi = lo + (uint64_t)(window * 1e9);
    uint64_t give_up = start + (uint64_t)(timeout * 1e9);
    int opened = 0, finished = 0, errors = 0, completed = 0;
    struct epoll_event events[MAX_EVENTS];
    static char data[65536];
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    while (finished < streams && now_ns() < give_up) {
        uint64_t now = now_ns();
        /* Open the streams that are due by now (evenly over the ramp). */
        while (opened < streams &&
               (ramp <= 0 || now >= start + (uint64_t)(ramp * 1e9 * opened / streams))) {
            client *k = &clients[opened++];
            k->fd = socket(AF_INET, SOCK_STREAM, 0);
            setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            if (connect(k->fd, (struct sockaddr *)&addr, sizeof addr) < 0 ||
                send(k->fd, request, (size_t)rlen, MSG_NOSIGNAL) != rlen) {
                k->state = C_FAILED;
                errors++;
                finished++;
                close(k->fd);
                continue;
            }
            nonblock(k->fd);
            k->state = C_OPEN;
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = k};
            epoll_ctl(epfd, EPOLL_CTL_ADD, k->fd, &ev);
        }
        int wait_ms = opened < streams ? 1 : 100;
        int n = epoll_wait(epfd, events, MAX_EVENTS, wait_ms);
        for (int i = 0; i < n; i++) {
            client *k = events[i].data.ptr;
            ssize_t got = recv(k->fd, data, sizeof data, 0);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            uint64_t t = now_ns();
            int ended = 0;
            if (got > 0) {
                const char *p = data;
                size_t len = (size_t)got;
                if (!k->status_seen) {
                    k->status_seen = 1;
                    if (len < 12 || memcmp(p + 9, "200", 3) != 0) got = -1;
                }
                if (got > 0) ended = scan(k, p, len, t, lo, hi, ndjson);
            }
            if (got <= 0 || ended) {
                if (ended) completed++;
                else errors++;
                k->state = ended ? C_DONE : C_FAILED;
                epoll_ctl(epfd, EPOLL_CTL_DEL, k->fd, NULL);
                close(k->fd);
                finished++;
            }
        }
    }
    int unfinished = streams - finished;
    printf("{\"streams\":%d,\"completed\":%d,\"errors\":%d,\"unfinished\":%d,\"samples\":%llu,"
           "\"over_2s\":%llu,\"p50_us\":%llu,\"p90_us\":%llu,\"p99_us\":%llu,\"p999_us\":%llu,"
           "\"max_us\":%llu,\"mean_us\":%.1f,\"window_s\":%.1f}\n",
           streams, completed, errors, unfinished, (unsigned long long)samples,
           (unsigned long long)over, (unsigned long long)percentile(0.50),
           (unsigned long long)percentile(0.90), (unsigned long long)percentile(0.99),
           (unsigned long long)percentile(0.999), (unsigned long long)max_us,
           samples ? (double)sum_us / (double)samples : 0.0, window);
    return 0;
}

/* ------------------------------------------------------------------ relay */

static void keep_tail(client *k, const char *data, size_t len) {
    char t[16];
    size_t n = k->tail_len, take = len > 8 ? 8 : len;
    memcpy(t, k->tail, n);
    memcpy(t + n, data + len - take, take);
    n += take;
    if (n > 8) {
        memmove(t, t + n - 8, 8);
        n = 8;
    }
    memcpy(k->tail, t, n);
    k->tail_len = n;
}

/* A fresh connection with the request sent; 0 = could not connect. */
static int relay_open(client *k, const struct sockaddr_in *addr, const char *request, int rlen) {
    int one = 1;
    k->fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(k->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(k->fd, (const struct sockaddr *)addr, sizeof *addr) < 0 ||
        send(k->fd, request, (size_t)rlen, MSG_NOSIGNAL) != rlen) {
        close(k->fd);
        k->fd = -1;
        return 0;
    }
    nonblock(k->fd);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = k};
    epoll_ctl(epfd, EPOLL_CTL_ADD, k->fd, &ev);
    return 1;
}

static void relay_reset(client *k) {
    k->status_seen = k->ended = 0;
    k->carry_len = k->tail_len = 0;
}

/*
 * streamgen relay PORT PATH CONNS EVENTS SECONDS [BATCH]: CONNS keep-alive connections, each
 * asking for burst streams (rate 0) of EVENTS events, BATCH per send, back to back for SECONDS.
 * Counts every token event received before the deadline (partial responses included), so
 * events / seconds is the relay rate and the proxy's CPU over the run divided by events is its
 * cost per chunk.
 */
static int relay(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: streamgen relay PORT PATH CONNS EVENTS SECONDS [BATCH]\n");
        return 2;
    }
    int port = atoi(argv[2]);
    const char *path = argv[3];
    int conns = atoi(argv[4]);
    long events_each = atol(argv[5]);
    double seconds = atof(argv[6]);
    long batch = argc > 7 ? atol(argv[7]) : 1;
    /* MODEL given: ask for it, and count token events by their content (real chunks carry no
     * "t": stamps, and a translated stream has none either) */
    const char *model = argc > 8 ? argv[8] : "llama3";
    count_content = argc > 8;
    messages_stream = strcmp(path, "/v1/messages") == 0;
    int ndjson = strcmp(path, "/api/chat") == 0;
    hist = calloc(BUCKETS, sizeof(uint32_t));
    slow_hist = calloc(SLOW_BUCKETS, sizeof(uint32_t));
    client *clients = calloc((size_t)conns, sizeof(client));
    if (!hist || !slow_hist || !clients) die("calloc");
    char request[1024];
    int rlen = stream_request(request, sizeof request, path, 0, events_each, batch, model);
    epfd = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    uint64_t start = now_ns(), deadline = start + (uint64_t)(seconds * 1e9);
    long responses = 0, errors = 0, reconnects = 0;
    for (int i = 0; i < conns; i++)
        if (!relay_open(&clients[i], &addr, request, rlen)) errors++;
    struct epoll_event events[MAX_EVENTS];
    static char data[65536];
    uint64_t now;
    while ((now = now_ns()) < deadline) {
        int wait_ms = (int)((deadline - now) / 1000000) + 1;
        int n = epoll_wait(epfd, events, MAX_EVENTS, wait_ms < 50 ? wait_ms : 50);
        for (int i = 0; i < n; i++) {
            client *k = events[i].data.ptr;
            ssize_t got = recv(k->fd, data, sizeof data, 0);
            if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
            uint64_t t = now_ns();
            int done = 0, failed = 0, closed = 0;
            if (got > 0) {
                if (!k->status_seen) {
                    k->status_seen = 1;
                    if (got < 12 || memcmp(data + 9, "200", 3) != 0) failed = 1;
                }
                if (!failed) {
                    if (scan(k, data, (size_t)got, t, start, deadline, ndjson)) k->ended = 1;
                    keep_tail(k, data, (size_t)got);
                    done = k->ended && k->tail_len >= 5 &&
                           memcmp(k->tail + k->tail_len - 5, "0\r\n\r\n", 5) == 0;
                }
            } else if (got == 0 && k->ended) {
                done = 2; /* close-delimited answer */
            } else if (!k->status_seen) {
                closed = 1; /* a keep-alive close between responses (nginx: keepalive_requests) */
            } else {
                failed = 1;
            }
            if (done) responses++;
            if (failed) errors++;
            if (done == 1) {
                relay_reset(k);
                if (send(k->fd, request, (size_t)rlen, MSG_NOSIGNAL) != rlen) done = 2, errors++;
            }
            if (done == 2 || failed || closed) {
                epoll_ctl(epfd, EPOLL_CTL_DEL, k->fd, NULL);
                close(k->fd);
                relay_reset(k);
                reconnects++;
                if (now_ns() < deadline && !relay_open(k, &addr, request, rlen)) errors++;
            }
        }
    }
    double elapsed = (double)(now_ns() - start) / 1e9;
    printf("{\"conns\":%d,\"events\":%llu,\"responses\":%ld,\"errors\":%ld,\"reconnects\":%ld,"
           "\"seconds\":%.3f}\n",
           conns, (unsigned long long)samples, responses, errors, reconnects, elapsed);
    return 0;
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    if (argc >= 3 && strcmp(argv[1], "serve") == 0) {
        if (argc >= 6 && strcmp(argv[3], "real") == 0) {
            real_mode = 1;
            real_events = atol(argv[4]);
            real_batch = atol(argv[5]);
            if (real_batch < 1) real_batch = 1;
            if (real_batch > 64) real_batch = 64;
        }
        serve(atoi(argv[2]));
    }
    if (argc >= 2 && strcmp(argv[1], "load") == 0) return load(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "relay") == 0) return relay(argc, argv);
    fprintf(stderr, "usage: streamgen serve PORT | streamgen load PORT PATH STREAMS RATE EVENTS "
                    "RAMP WARM WINDOW TIMEOUT | streamgen relay PORT PATH CONNS EVENTS SECONDS "
                    "[BATCH]\n");
    return 2;
}
