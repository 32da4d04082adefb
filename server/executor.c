/* executor.c — picks the executor --executor names and closes it. What
 * the backends share (the engine's environment, the wording of an exit
 * status) is exec_env.c's, below them. */
#include "executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int exec_open(srv *s, executor **out, ty_err *err)
{
    executor *e = calloc(1, sizeof *e);
    if (!e) return ty_err_set(err, TY_ENOMEM, "out of memory");
    int rc =
        !strcmp(s->cfg.executor, "slurm") ? exec_slurm_open(s, e, err) : exec_local_open(s, e, err);
    if (rc) {
        free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void exec_close(executor *e)
{
    if (!e) return;
    e->ops->close(e);
    free(e);
}
