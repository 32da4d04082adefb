/* test_retention.c — ty_retention_select, the one keep_last / keep_best
 * choice of the engine and the server. Checkpoints are written as one
 * letter each, oldest first (g gone, p partial, s standing, c committed),
 * and the kept ones come back as 'K' and '.'. */
#include <math.h>
#include <string.h>

#include "retention.h"
#include "tyassert.h"

static void pick(const char *kinds, int keep_last, int keep_best, const double *loss,
                 const char *want)
{
    int n = (int)strlen(kinds);
    ty_ret_item it[16] = {0};
    bool keep[16] = {0};
    for (int i = 0; i < n; i++) {
        it[i].kind = (ty_ret_kind)(strchr("gpsc", kinds[i]) - "gpsc");
        it[i].loss = loss ? loss[i] : NAN;
        keep[i] = i % 2; /* garbage in: every entry must be written */
    }
    ty_retention_select(it, n, keep_last, keep_best, keep);
    char got[17];
    for (int i = 0; i < n; i++)
        got[i] = keep[i] ? 'K' : '.';
    got[n] = 0;
    CHECK(!strcmp(got, want), "%s (last %d, best %d): kept %s, want %s", kinds, keep_last,
          keep_best, got, want);
}

int main(void)
{
    /* keep_last alone. */
    pick("ccccc", 2, 0, NULL, "...KK");
    pick("ccccc", 0, 0, NULL, "KKKKK");
    pick("ccccc", 9, 0, NULL, "KKKKK");
    pick("ccgcc", 3, 0, NULL, ".K.KK"); /* gone ones neither count nor stay */
    pick("", 2, 1, NULL, "");
    /* The newest committed stays when newer ones are not committed yet. */
    pick("ccsss", 2, 0, NULL, ".K.KK");
    pick("sss", 1, 0, NULL, "..K");
    /* Partial writes (the engine's directories without a manifest): gone
     * when older than the newest committed, kept while newer; never counted. */
    pick("cpcpc", 1, 0, NULL, "....K");
    pick("ccp", 1, 0, NULL, ".KK");
    pick("pp", 1, 0, NULL, "KK");
    pick("cpc", 0, 0, NULL, "K.K");
    /* keep_best: the lowest losses as well, and the newest (not ranked yet). */
    double loss[] = {3.0, 1.0, 2.0, 0.5, NAN};
    pick("cccss", 0, 2, loss, ".KKKK"); /* 1.0, 0.5, the newest, the newest committed */
    pick("cccss", 1, 1, loss, "..KKK"); /* 0.5, the newest, the newest committed */
    pick("ccccc", 0, 1, loss, "...KK");
    pick("ccccc", 1, 2, loss, ".K.KK");
    /* Ties go to the older; a gone row's loss does not rank. */
    double tie[] = {1.0, 1.0, 1.0, 5.0};
    pick("cccc", 1, 2, tie, "KK.K");
    double gone[] = {0.1, 1.0, 2.0, 3.0};
    pick("gccc", 1, 1, gone, ".K.K");
    /* keep_best counts only ranked ones: without any loss, only the newest. */
    pick("cccc", 0, 3, NULL, "...K");
    return ty_summary("retention");
}
