/* exec_env.c — what the executor backends share (executor.h): the
 * engine's environment and the wording of an exit status. Below the
 * backends and the executor choice (executor.c), so neither depends on
 * the other through it. */
#include "executor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

void exec_describe_status(int st, char *out, size_t cap)
{
    if (WIFEXITED(st))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(out, cap, "ended (status %d)", st);
}

static bool env_named(const char *kv, const char *name_eq)
{
    return !strncmp(kv, name_eq, strlen(name_eq));
}

char **exec_env_new(srv *s, const char *const *extra)
{
    size_t ne = 0, nx = 0;
    while (environ[ne])
        ne++;
    while (extra && extra[nx])
        nx++;
    char **envp = calloc(ne + nx + 2, sizeof *envp);
    if (!envp) return NULL;
    size_t k = 0;
    static const char *const ours[] = {
        "TY_RANK=",   "TY_WORLD_SIZE=",     "TY_LOCAL_RANK=",     "CUDA_VISIBLE_DEVICES=",
        "TY_JOB_ID=", "CUDA_DEVICE_ORDER=", "TY_SUPERVISOR_PID=", "TY_ALLOWED_ROOTS="};
    bool ok = true;
    for (size_t i = 0; i < ne && ok; i++) {
        bool skip = !srv_engine_env_keep(environ[i]);
        for (size_t j = 0; j < sizeof ours / sizeof *ours; j++)
            skip |= env_named(environ[i], ours[j]);
        for (size_t j = 0; j < nx && !skip; j++) {
            const char *eq = strchr(extra[j], '=');
            size_t n = eq ? (size_t)(eq - extra[j]) + 1 : 0;
            skip |= n && !strncmp(environ[i], extra[j], n);
        }
        if (!skip) ok = (envp[k++] = strdup(environ[i])) != NULL;
    }
    /* The engine re-checks every input it opens against these: the roots
     * plus the cache remote inputs are downloaded into. */
    if (ok && asprintf(&envp[k++], "TY_ALLOWED_ROOTS=%s:%s/cache", s->cfg.allowed_roots,
                       s->cfg.data_dir) < 0) {
        envp[--k] = NULL;
        ok = false;
    }
    for (size_t j = 0; j < nx && ok; j++)
        ok = (envp[k++] = strdup(extra[j])) != NULL;
    if (!ok) {
        exec_env_free(envp);
        return NULL;
    }
    return envp;
}

void exec_env_free(char **env)
{
    if (!env) return;
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}
