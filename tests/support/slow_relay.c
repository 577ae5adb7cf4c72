/* A TCP relay that can trickle (see slow_relay.h). */
#include "support/slow_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/redis_srv.h"

struct conn {
    struct slow_relay *p;
    int c, s;
    size_t to_client; /* bytes passed towards the client so far */
};

/* Move what @p from has to @p to (1 KiB, then a 0.3 s pause, when trickling); false at EOF. */
static bool pass_on(struct conn *k, int from, int to, int64_t *next_ms)
{
    char buf[65536];
    bool down = to == k->c;
    bool trickle = k->p->slow && (!down || k->to_client >= k->p->fast_bytes);
    ssize_t n = recv(from, buf, trickle ? 1024 : sizeof(buf), 0);
    if (n <= 0)
        return false;
    if (trickle)
        *next_ms = now_ms() + 300;
    if (down)
        k->to_client += (size_t)n;
    for (ssize_t at = 0, w; at < n; at += w)
        if ((w = send(to, buf + at, (size_t)(n - at), MSG_NOSIGNAL)) <= 0)
            return false;
    return true;
}

static void *relay(void *arg)
{
    struct conn *k = arg;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)k->p->to_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int64_t end = now_ms() + RELAY_LIFE_MS, next[2] = {0, 0};
    bool up = connect(k->s, (struct sockaddr *)&a, sizeof(a)) == 0;
    while (up && !k->p->stop && now_ms() < end) {
        int64_t t = now_ms();
        struct pollfd p[2] = {{k->c, t >= next[0] ? POLLIN : 0, 0},
                              {k->s, t >= next[1] ? POLLIN : 0, 0}};
        if (poll(p, 2, 20) <= 0)
            continue;
        if (p[0].revents)
            up = pass_on(k, k->c, k->s, &next[0]);
        if (up && p[1].revents)
            up = pass_on(k, k->s, k->c, &next[1]);
    }
    close(k->c);
    close(k->s);
    struct slow_relay *p = k->p;
    free(k);
    p->live--; /* the last touch of p: stop may return once every relay got here */
    return NULL;
}

static void *accept_main(void *arg)
{
    struct slow_relay *p = arg;
    for (;;) {
        int c = accept(p->lfd, NULL, NULL);
        if (c < 0)
            return NULL;
        struct conn *k = calloc(1, sizeof(*k));
        pthread_t t;
        if (k) {
            *k = (struct conn){p, c, socket(AF_INET, SOCK_STREAM, 0), 0};
            p->live++;
            if (pthread_create(&t, NULL, relay, k) == 0) {
                pthread_detach(t);
            } else {
                p->live--;
                close(k->c);
                close(k->s);
                free(k);
            }
        } else {
            close(c);
        }
    }
}

int slow_relay_start(struct slow_relay *p, int to_port, size_t fast_bytes)
{
    *p = (struct slow_relay){.to_port = to_port, .fast_bytes = fast_bytes};
    p->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof(a)) || listen(p->lfd, 16) ||
        getsockname(p->lfd, (struct sockaddr *)&a, &al))
        return -1;
    p->port = ntohs(a.sin_port);
    return pthread_create(&p->th, NULL, accept_main, p) == 0 ? 0 : -1;
}

void slow_relay_stop(struct slow_relay *p)
{
    p->stop = 1;
    shutdown(p->lfd, SHUT_RDWR);
    pthread_join(p->th, NULL);
    close(p->lfd);
    while (p->live > 0) /* each relay sees the flag within one poll */
        msleep(5);
}
