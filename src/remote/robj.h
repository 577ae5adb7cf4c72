/*
 * Shared prefix objects of the remote tier (SHARING.md "The remote tier"): their wire form in
 * index records (rrec.c), their keys (rkeys.c), what the index scripts report about them
 * (rindex.c, rindex_objs.c), their upload (remote_share_put.c) and their restore
 * (remote_share_get.c).
 */
#ifndef KVT_REMOTE_ROBJ_H
#define KVT_REMOTE_ROBJ_H

#include "remote/remote_parts.h"

#define KVT_ROBJ_NAME 66  /* "<id>.<gen>": the hash tag of an object's keys */
#define KVT_ROBJ_FIELD 50 /* "<nsHash>:<id>": its field in the index hashes */

void kvt_robj_encode(const struct kvt_robj *o, uint8_t *p);
/** Decode an untrusted entry of exactly KVT_ROBJ_WIRE bytes. 0 or KVT_E_CORRUPT. */
int kvt_robj_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_robj *o);
/** The object's keys as an entry of namespace @p ns (@p name holds its tag). */
struct kvt_rentry kvt_robj_entry(const struct kvt_robj *o, const char *ns,
                                 char name[KVT_ROBJ_NAME]);
/** Its field in the index hashes. */
void kvt_robj_field(const char *ns, const char *id, char out[KVT_ROBJ_FIELD]);

/** Bytes of a record's object list (0 without objects), and its encoding. */
size_t kvt_robjs_wire(const struct kvt_rrec *r);
void kvt_robjs_encode(const struct kvt_rrec *r, uint8_t *p);
/** Decode the object list at @p p into o->objs (freed by the caller on failure too), its
 * namespace hash into @p nsh, its length into *@p used. 0 or < 0. */
int kvt_robjs_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *o,
                     char nsh[17], size_t *used);

/** An object an index script freed (no record needs it): its keys are to be deleted. */
struct kvt_rdead {
    struct kvt_robj o;
    char *ns;
};

/** What an index script removed, freed or refused. */
struct kvt_rout {
    struct kvt_rrec *gone; /* records removed (to make room, or the one unpublished) */
    size_t n_gone;
    struct kvt_rdead *dead; /* objects no record needs any more */
    size_t n_dead;
    struct kvt_robj *clash; /* a publish refused: the object now listed (bytes 0: none) */
    size_t n_clash;
    bool refused;
};

void kvt_rout_free(struct kvt_rout *o);
struct redisReply;
/** Decode an index script's reply {version or -1 (refused), strings...} into @p out (NULL: not
 * wanted) and free the reply. 0 or < 0 (then *@p out is empty). */
int kvt_rout_take(struct redisReply *r, uint64_t max_rec, struct kvt_rout *out);

/**
 * kvt_rindex_admit() reporting into @p out (may be NULL). A record with objects is refused
 * (out->refused, nothing changed) when one of them is listed with another generation, or is
 * not listed and was not written by this upload (its generation is not the record's uuid).
 */
int kvt_rindex_admit_ex(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r,
                        uint64_t need, uint64_t cap, uint64_t max_rec, struct kvt_rout *out);
/** Remove the record @p uuid; the objects it freed go to @p out (may be NULL). */
int kvt_rindex_unpublish_ex(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid,
                            uint64_t max_rec, struct kvt_rout *out);
/** Unlist object @p o of namespace @p ns when it is still that generation (its bytes failed):
 * records that need it become misses. *@p unlisted says whether it was. 0 or < 0. */
int kvt_rindex_condemn(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *ns,
                       const struct kvt_robj *o, bool *unlisted);
/** The objects listed under ids @p ids of namespace @p ns: have[i] says whether out[i] is. */
int kvt_rindex_objs(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *ns,
                    char (*ids)[33], size_t n, uint64_t max_bytes, struct kvt_robj *out,
                    bool *have);

#endif
