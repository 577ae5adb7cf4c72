/*
 * The writing process of the kill -9 crash test (tests/test_crash.c): opens a store and puts
 * synthetic entries (tests/progs/crash_entry.h) in a loop until it is killed. After each put
 * that returned success it appends the entry's id to an acknowledgement log with write +
 * fsync (O_APPEND), so the parent knows which entries the store promised to keep.
 *
 *   crash_writer DIR ACK_LOG FIRST_ID [TMP_GRACE_MS [fast|plain [share]]]
 *
 * "plain" installs the fault backend without faults, which makes saves take the plain path
 * (pwrite one call after the other) instead of the fast one (O_DIRECT, the asynchronous queue).
 *
 * TMP_GRACE_MS (default 0) is the store's tmp_grace_ms: 0 lets the writer's recovery reap
 * whatever a killed predecessor left at once, which is right only while no other writer is
 * live (a .tmp is unlocked between its creation and its lock, which the grace period covers).
 *
 * Entries alternate between trimmable kinds (kv, qkv, turboquant) and all six kinds, and
 * between two namespaces; every fifth put stores an earlier id again (same bytes), which
 * exercises the replacement of an identical record. "share" turns the store's share_prefixes
 * on and puts synth_shared_entry() entries instead: branches off three prompts. Exits 0 after
 * 100000 puts, 1 on any failure (the parent treats an exit before the kill as a failure).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io_fault.h"
#include "progs/crash_entry.h"

static int ack(int fd, uint32_t id)
{
    char line[32];
    int len = snprintf(line, sizeof(line), "%u\n", id);
    ssize_t w;
    do {
        w = write(fd, line, (size_t)len);
    } while (w < 0 && errno == EINTR);
    if (w != len)
        return -1;
    return fsync(fd) == 0 ? 0 : -1;
}

static int put_one(kvt_store *s, uint32_t id, bool share)
{
    struct kvt_entry *e;
    int rc = share ? synth_shared_entry(id, &e) : synth_id_entry(id, &e);
    if (rc) {
        fprintf(stderr, "crash_writer: entry %u: %s\n", id, kvt_strerror(rc));
        return rc;
    }
    rc = kvt_store_put(s, e, NULL, NULL);
    if (rc)
        fprintf(stderr, "crash_writer: put %u: %s\n", id, kvt_last_error());
    kvt_entry_free(e);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 7) {
        fprintf(stderr, "usage: crash_writer DIR ACK_LOG FIRST_ID [TMP_GRACE_MS [fast|plain "
                        "[share]]]\n");
        return 2;
    }
    bool share = argc == 7 && !strcmp(argv[6], "share");
    if (argc >= 6 && !strcmp(argv[5], "plain"))
        kvt_io_set(kvt_io_fault());
    uint32_t first = (uint32_t)strtoul(argv[3], NULL, 10);
    int fd = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(argv[2]);
        return 1;
    }
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = SYNTH_MODEL;
    o.config_fingerprint = SYNTH_FP;
    o.tokenizer_hash = SYNTH_TOK;
    o.tmp_grace_ms = argc >= 5 ? strtoll(argv[4], NULL, 10) : 0;
    o.share_prefixes = share;
    kvt_store *s;
    int rc = kvt_store_open(argv[1], &o, &s);
    if (rc) {
        fprintf(stderr, "crash_writer: open: %s\n", kvt_last_error());
        close(fd);
        return 1;
    }
    for (uint32_t k = 0; k < 100000 && rc == 0; k++) {
        uint32_t id = k % 5 == 4 && k >= 3 ? first + k - 3 : first + k;
        rc = put_one(s, id, share);
        if (rc == 0 && ack(fd, id) != 0) {
            perror("crash_writer: ack");
            rc = -1;
        }
    }
    kvt_store_close(s);
    close(fd);
    return rc == 0 ? 0 : 1;
}
