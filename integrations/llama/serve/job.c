/*
 * A request's generated text (serve.h): kept valid UTF-8 as token pieces arrive (a character
 * may span tokens; a random or confused model emits stray bytes), and held back while its
 * end could still turn into a stop string.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

struct job *job_new(void)
{
    struct job *j = calloc(1, sizeof(*j));
    if (j)
        j->refs = 1;
    return j;
}

void job_release(struct job *j)
{
    if (!j || --j->refs > 0)
        return;
    free(j->prompt);
    for (int i = 0; i < j->sp.n_stop; i++)
        free(j->sp.stop[i]);
    free(j->text);
    free(j->marks);
    free(j);
}

static void put(struct job *j, const unsigned char *b, size_t n)
{
    if (j->len + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap * 2 : 256;
        while (cap < j->len + n + 1)
            cap *= 2;
        char *t = realloc(j->text, cap);
        if (!t)
            return; /* the text is cut short; the counts stay right */
        j->text = t;
        j->cap = cap;
    }
    memcpy(j->text + j->len, b, n);
    j->len += n;
    j->text[j->len] = '\0';
}

static const unsigned char replacement[3] = {0xEF, 0xBF, 0xBD};

static int seq_len(unsigned char b)
{
    return b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
}

/* A complete sequence of seq_len() bytes: reject overlong forms, surrogates, > U+10FFFF. */
static bool seq_valid(const unsigned char *s, int n)
{
    if (n == 3 && ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0)))
        return false;
    if (n == 4 && ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90)))
        return false;
    return true;
}

static void flush_partial(struct job *j)
{
    if (j->n_utf8)
        put(j, replacement, 3);
    j->n_utf8 = 0;
}

void job_append(struct job *j, const char *piece, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)piece[i];
        if (j->n_utf8) {
            if ((b & 0xC0) == 0x80) {
                j->utf8[j->n_utf8++] = b;
                int need = seq_len(j->utf8[0]);
                if (j->n_utf8 == need) {
                    if (seq_valid(j->utf8, need))
                        put(j, j->utf8, (size_t)need);
                    else
                        put(j, replacement, 3);
                    j->n_utf8 = 0;
                }
                continue;
            }
            flush_partial(j); /* cut short: the byte starts anew */
        }
        if (b < 0x80)
            put(j, &b, 1);
        else if (seq_len(b))
            j->utf8[j->n_utf8++] = b;
        else
            put(j, replacement, 3);
    }
}

/* Length of the longest end of the text that is the start of a stop string. */
static size_t held_back(const struct job *j)
{
    size_t held = 0;
    for (int s = 0; s < j->sp.n_stop; s++) {
        size_t sl = strlen(j->sp.stop[s]);
        for (size_t k = sl - 1; k > held; k--)
            if (k <= j->len && memcmp(j->text + j->len - k, j->sp.stop[s], k) == 0) {
                held = k;
                break;
            }
    }
    return held;
}

static void set_released(struct job *j, size_t to)
{
    if (to == j->released)
        return;
    j->released = to;
    if (j->n_marks == j->cap_marks) {
        size_t cap = j->cap_marks ? 2 * j->cap_marks : 64;
        size_t *m = realloc(j->marks, cap * sizeof(*m));
        if (!m)
            return; /* the stream then sends more text per chunk */
        j->marks = m;
        j->cap_marks = cap;
    }
    j->marks[j->n_marks++] = to;
}

bool job_release_text(struct job *j, bool final)
{
    if (final)
        flush_partial(j);
    for (int s = 0; s < j->sp.n_stop && j->text; s++) {
        char *at = strstr(j->text, j->sp.stop[s]);
        if (at) {
            j->len = (size_t)(at - j->text);
            j->text[j->len] = '\0';
            set_released(j, j->len);
            return true;
        }
    }
    size_t keep = final ? 0 : held_back(j);
    if (j->len - keep > j->released)
        set_released(j, j->len - keep);
    return false;
}
