/*
 * A TCP relay to a local server for the remote suites: once slow, each connection passes
 * 1 KiB every 0.3 s each way (after its first fast_bytes towards the client, when set), and
 * every connection closes RELAY_LIFE_MS after it opened, so that a client without a deadline
 * still returns.
 */
#ifndef KVT_TEST_SLOW_RELAY_H
#define KVT_TEST_SLOW_RELAY_H

#include <pthread.h>
#include <stddef.h>

#define RELAY_LIFE_MS 8000

struct slow_relay {
    int lfd, port, to_port;
    size_t fast_bytes;      /* towards the client, passed at full speed before the trickle */
    _Atomic int slow, stop; /* read by the relay threads */
    _Atomic int live;       /* relay threads still running: stop waits for none */
    pthread_t th;
};

/** Listen on 127.0.0.1 (a free port, in ->port) for connections relayed to @p to_port.
 * 0 or -1. */
int slow_relay_start(struct slow_relay *p, int to_port, size_t fast_bytes);
void slow_relay_stop(struct slow_relay *p);

#endif
