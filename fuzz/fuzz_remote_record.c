/*
 * Fuzz target: the remote tier's index records (src/remote/rrec.c), which come from a Redis
 * server and are untrusted. Every input is decoded under a 1 GiB entry limit; an accepted
 * record must respect that limit and its own chunk arithmetic, and encoding it again must
 * give back exactly the input bytes.
 */
#include "fuzz.h"

#include <stdlib.h>
#include <string.h>

#include "remote/remote_parts.h"

#define LIMIT ((uint64_t)1 << 30)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvt_rrec r;
    if (kvt_rrec_decode(data, size, LIMIT, &r) < 0)
        return 0;
    if (r.bytes == 0 || r.bytes > LIMIT || r.n_chunks != (r.bytes + r.chunk - 1) / r.chunk)
        fuzz_fail("accepted record breaks its limits");
    size_t len = 0;
    uint8_t *again = kvt_rrec_encode(&r, &len);
    if (!again || len != size || memcmp(again, data, size) != 0)
        fuzz_fail("record does not encode back to its bytes");
    free(again);
    free(r.ns);
    free(r.tokens);
    return 0;
}
