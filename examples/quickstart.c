/*
 * The smallest embedding of kvtier: an engine's prompt cache with a cold tier on disk.
 * Build one entry (2 layers of plain KV), put it, flush it to disk, "restart", and take the
 * longest cached prefix of a longer prompt back from disk.
 *
 *   cc quickstart.c $(pkg-config --cflags --libs kvtier)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define LAYERS 2
#define HEADS 8
#define HEAD_DIM 128
#define TOKENS 1000

static int die(const char *what, int rc)
{
    fprintf(stderr, "%s: %s (%s)\n", what, kvt_strerror(rc), kvt_last_error());
    return 1;
}

/* One layer of KV for TOKENS tokens, as an engine would produce during prefill. */
static int make_layer(kvt_cache **out)
{
    struct kvt_cache_info kind = {.kind = KVT_KIND_KV};
    int64_t shape[4] = {1, HEADS, TOKENS, HEAD_DIM};
    struct kvt_tensor kv[2];
    int rc = kvt_cache_new(&kind, out);
    for (int i = 0; i < 2 && rc == 0; i++) {
        rc = kvt_tensor_zeros(&kv[i], KVT_BFLOAT16, 4, shape);
        if (rc == 0)
            memset(kvt_buf_data(kv[i].buf), 0x40 + i, kvt_tensor_nbytes(&kv[i]));
    }
    if (rc == 0)
        rc = kvt_cache_append(*out, kv, 2);
    kvt_tensor_release(&kv[0]);
    kvt_tensor_release(&kv[1]);
    return rc;
}

static int open_cache(const char *dir, kvt_pcache **pc)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = 1ull << 30;
    o.cold_dir = dir;
    o.cold.model_id = "example/model";
    o.cold.config_fingerprint = "example-fp-bf16";
    o.cold.tokenizer_hash = "example-tokenizer";
    o.cold.max_bytes = 4ull << 30;
    return kvt_pcache_open(&o, pc);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "quickstart-cache";
    int32_t prompt[TOKENS + 10];
    for (int i = 0; i < TOKENS + 10; i++)
        prompt[i] = 1000 + i;

    /* A server's first life: cache the prompt's KV and make it durable. */
    kvt_pcache *pc;
    int rc = open_cache(dir, &pc);
    if (rc)
        return die("open", rc);
    kvt_cache *layers[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        if ((rc = make_layer(&layers[l])) != 0)
            return die("build", rc);
    struct kvt_entry *e;
    if ((rc = kvt_entry_new(prompt, TOKENS, layers, LAYERS, "", &e)) != 0)
        return die("entry", rc);
    if ((rc = kvt_pcache_put(pc, e, NULL)) != 0)
        return die("put", rc);
    struct kvt_flush_report report;
    if ((rc = kvt_pcache_flush(pc, -1, &report)) != 0 || !report.durable)
        return die("flush", rc ? rc : KVT_E_STATE);
    kvt_pcache_close(pc);

    /* After a restart: a longer prompt finds its prefix on disk. */
    if ((rc = open_cache(dir, &pc)) != 0)
        return die("reopen", rc);
    struct kvt_take take;
    if ((rc = kvt_pcache_take(pc, prompt, TOKENS + 10, "", &take)) != 0)
        return die("take", rc);
    if (!take.entry) {
        fprintf(stderr, "miss\n");
        return 1;
    }
    printf("restored %zu of %d prompt tokens from %s\n", take.entry->n_tokens, TOKENS + 10,
           take.from_disk ? "disk" : "RAM");
    /* ... prefill the remaining tokens into take.entry->caches, then put it back: */
    rc = kvt_pcache_put(pc, take.entry, take.retain);
    kvt_pcache_close(pc);
    return rc ? die("put", rc) : 0;
}
