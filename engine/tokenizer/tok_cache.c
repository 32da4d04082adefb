/* tok_cache.c — the word -> ids cache in front of BPE (see tok_internal.h).
 *
 * 64 shards, each an open-addressing table of up to 2048 words with their
 * key bytes and ids in one arena. A thread locks only the shard its word
 * hashes to, so concurrent encoders rarely wait on each other; a full
 * shard is cleared in O(1) and refilled by whatever text comes next. */
#include "tok_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SHARDS 64
#define SLOTS 4096       /* per shard, power of two */
#define MAX_ENTRIES 2048 /* keeps the load factor at or under 1/2 */
#define ARENA_BYTES (256 * 1024)

typedef struct cache_slot {
    uint64_t hash; /* 0: empty */
    uint32_t off;  /* arena offset of key bytes, then the ids */
    uint16_t klen, nids;
} cache_slot;

typedef struct cache_shard {
    pthread_mutex_t mu;
    uint32_t n;
    cache_slot slot[SLOTS];
    size_t arena_len;
    char arena[ARENA_BYTES];
} cache_shard;

struct tok_cache {
    cache_shard *shard[SHARDS];
};

static uint64_t word_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 29;
    return h ? h : 1;
}

tok_cache *tok_cache_new(void)
{
    tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    for (int i = 0; i < SHARDS; i++) {
        c->shard[i] = calloc(1, sizeof *c->shard[i]);
        if (!c->shard[i] || pthread_mutex_init(&c->shard[i]->mu, NULL)) {
            free(c->shard[i]);
            c->shard[i] = NULL;
            tok_cache_free(c);
            return NULL;
        }
    }
    return c;
}

void tok_cache_free(tok_cache *c)
{
    if (!c) return;
    for (int i = 0; i < SHARDS; i++) {
        if (!c->shard[i]) continue;
        pthread_mutex_destroy(&c->shard[i]->mu);
        free(c->shard[i]);
    }
    free(c);
}

/* Slot holding word, or the empty slot where it would go. */
static cache_slot *find(cache_shard *s, uint64_t h, const char *w, size_t len)
{
    uint32_t i = (uint32_t)(h >> 6) & (SLOTS - 1);
    for (;;) {
        cache_slot *e = &s->slot[i];
        if (e->hash == 0) return e;
        if (e->hash == h && e->klen == len && !memcmp(s->arena + e->off, w, len)) return e;
        i = (i + 1) & (SLOTS - 1);
    }
}

int tok_cache_get(tok_cache *c, const char *w, size_t len, tok_ids *out)
{
    if (!c || len > TOK_CACHE_MAX_WORD) return 0;
    uint64_t h = word_hash(w, len);
    cache_shard *s = c->shard[h & (SHARDS - 1)];
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    cache_slot *e = find(s, h, w, len);
    if (e->hash) {
        rc = 1;
        const char *ids = s->arena + e->off + ((e->klen + 3u) & ~3u);
        for (uint16_t k = 0; k < e->nids && rc == 1; k++) {
            int32_t id;
            memcpy(&id, ids + 4u * k, 4);
            if (tok_ids_push(out, id)) rc = TY_ENOMEM;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void tok_cache_put(tok_cache *c, const char *w, size_t len, const int32_t *ids, size_t n)
{
    if (!c || len > TOK_CACHE_MAX_WORD || n > 0xFFFF) return;
    uint64_t h = word_hash(w, len);
    cache_shard *s = c->shard[h & (SHARDS - 1)];
    size_t need = ((len + 3u) & ~(size_t)3u) + 4u * n;
    pthread_mutex_lock(&s->mu);
    if (s->n >= MAX_ENTRIES || s->arena_len + need > ARENA_BYTES) {
        memset(s->slot, 0, sizeof s->slot);
        s->n = 0;
        s->arena_len = 0;
    }
    cache_slot *e = find(s, h, w, len);
    if (!e->hash) {
        e->hash = h;
        e->off = (uint32_t)s->arena_len;
        e->klen = (uint16_t)len;
        e->nids = (uint16_t)n;
        memcpy(s->arena + s->arena_len, w, len);
        memcpy(s->arena + s->arena_len + ((len + 3u) & ~(size_t)3u), ids, 4u * n);
        s->arena_len += need;
        s->n++;
    }
    pthread_mutex_unlock(&s->mu);
}
