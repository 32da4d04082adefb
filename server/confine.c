/* confine.c — what a job can reach besides its spec's paths: the data
 * directory's permissions and the environment an engine starts with.
 *
 * The data directory holds the database (token hashes, every spec) and
 * every job's files, so it is the server user's alone: 0700, the database
 * 0600 (db_open), tightened on every start for directories made before.
 *
 * Engines run code paths driven by user data; they get an allow-listed
 * environment, never the server's whole one: the server may hold cloud
 * credentials (AWS_*, AZURE_*, GOOGLE_*, GCS_*) for its uploads, and an
 * engine needs none of them — the server does every transfer. */
#include "server.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "tyutil.h"

int srv_data_dir_prepare(const srv_config *c, ty_err *err)
{
    if (chmod(c->data_dir, 0700) != 0)
        return ty_err_set(err, TY_EIO, "chmod 0700 %s: %s", c->data_dir, strerror(errno));
    /* The default roots live here; create them so a fresh server has
     * somewhere to put inputs and file:// checkpoints. */
    static const char *const sub[] = {"inputs", "stores"};
    for (size_t i = 0; i < sizeof sub / sizeof *sub; i++) {
        char p[PATH_MAX + 16];
        snprintf(p, sizeof p, "%s/%s", c->data_dir, sub[i]);
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return ty_err_set(err, TY_EIO, "mkdir %s: %s", p, strerror(errno));
    }
    return 0;
}

bool srv_engine_env_keep(const char *kv)
{
    /* Whole names, then prefixes. Locale, time zone and temp dir shape
     * what the engine prints and where libraries put scratch files; CUDA_,
     * NVIDIA_ and NCCL_ select and tune devices; OMP_ threads; the
     * sanitizer options are how the test suite runs an ASan engine. */
    static const char *const names[] = {"PATH",     "HOME", "USER",   "LOGNAME",        "LANG",
                                        "LANGUAGE", "TZ",   "TMPDIR", "LD_LIBRARY_PATH"};
    static const char *const prefixes[] = {"LC_",   "CUDA_",  "NVIDIA_", "NCCL_", "OMP_",
                                           "ASAN_", "UBSAN_", "LSAN_",   "TSAN_", "MSAN_"};
    const char *eq = strchr(kv, '=');
    if (!eq) return false;
    size_t n = (size_t)(eq - kv);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == n && !strncmp(kv, names[i], n)) return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(kv, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}
