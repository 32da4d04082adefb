/* retention.h — which checkpoints keep_last / keep_best keep: one pure
 * function for the engine's local pruning (engine/ckpt.c) and the server's
 * local-and-remote retention (server/upload.c), so the two cannot disagree.
 *
 * The caller describes its checkpoints oldest first, each with a kind and
 * an eval loss, and deletes what comes back unkept; the function reads no
 * file, allocates nothing and cannot fail. */
#ifndef TY_RETENTION_H
#define TY_RETENTION_H

#include <stdbool.h>

typedef enum {
    TY_RET_GONE,      /* already deleted: never counted, never kept */
    TY_RET_PARTIAL,   /* a write that never got its manifest: kept only while
                         newer than the newest committed one (it may still be
                         in progress); never counted */
    TY_RET_STANDING,  /* exists but is not committed everywhere yet (local,
                         uploading, failed upload): counted by keep_last */
    TY_RET_COMMITTED, /* complete: counted by keep_last */
} ty_ret_kind;

typedef struct {
    ty_ret_kind kind;
    double loss; /* eval loss at the checkpoint's step; NAN when none */
} ty_ret_item;

/* Fills keep[0..n) for items in step order, oldest first:
 * - keep_last > 0: the keep_last newest counted checkpoints; 0 keeps all;
 * - keep_best > 0: also the keep_best lowest losses (ties: the older), and
 *   the newest counted one (not ranked yet); keep_best alone (keep_last 0)
 *   keeps only those;
 * - always the newest committed one, and partial writes newer than it. */
void ty_retention_select(const ty_ret_item *items, int n, int keep_last, int keep_best, bool *keep);

#endif
