#include "common/serial.h"

#include <stdatomic.h>

uint32_t kvt_serial_next(void)
{
    static _Atomic uint32_t last;
    uint32_t n;
    do
        n = atomic_fetch_add(&last, 1) + 1;
    while (n == 0); /* wrapped after 2^32 opens */
    return n;
}
