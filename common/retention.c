/* retention.c — the keep_last / keep_best choice (see retention.h).
 *
 * keep_best ranks without sorting or allocating: k passes, each taking the
 * lowest (loss, index) pair above the previous pass's pick. n and k are the
 * checkpoints of one job, so O(k·n) is nothing next to deleting one. */
#include "retention.h"

#include <math.h>

static bool counted(ty_ret_kind k)
{
    return k == TY_RET_STANDING || k == TY_RET_COMMITTED;
}

/* Is (a, i) ranked before (b, j)? Lower loss first, the older on ties. */
static bool ranks_before(double a, int i, double b, int j)
{
    return a < b || (a == b && i < j);
}

void ty_retention_select(const ty_ret_item *it, int n, int keep_last, int keep_best, bool *keep)
{
    int newest_counted = -1, newest_committed = -1, standing = 0;
    for (int i = n - 1; i >= 0; i--) {
        keep[i] = false;
        if (!counted(it[i].kind)) continue;
        if (newest_counted < 0) newest_counted = i;
        if (newest_committed < 0 && it[i].kind == TY_RET_COMMITTED) newest_committed = i;
        /* keep_best alone keeps only what it ranks (below). */
        if (!(keep_best > 0 && keep_last <= 0)) keep[i] = keep_last <= 0 || standing < keep_last;
        standing++;
    }
    int prev = -1;
    for (int k = 0; k < keep_best; k++) {
        int pick = -1;
        for (int i = 0; i < n; i++) {
            if (!counted(it[i].kind) || isnan(it[i].loss)) continue;
            if (prev >= 0 && !ranks_before(it[prev].loss, prev, it[i].loss, i)) continue;
            if (pick < 0 || ranks_before(it[i].loss, i, it[pick].loss, pick)) pick = i;
        }
        if (pick < 0) break;
        keep[pick] = true;
        prev = pick;
    }
    if (keep_best > 0 && newest_counted >= 0) keep[newest_counted] = true;
    if (newest_committed >= 0) keep[newest_committed] = true;
    for (int i = 0; i < n; i++)
        if (it[i].kind == TY_RET_PARTIAL) keep[i] = i > newest_committed;
}
