/* fuzz_manifest.c — checkpoint manifests (MANIFEST.json) as both readers see
 * them: the engine's ckpt_verify (engine/ckpt.c), before a resume, and the
 * storage layer's manifest_load (storage/checkpoint.c) through
 * store_put_checkpoint (upload: files checked against the manifest) and
 * store_get_checkpoint (download: the manifest names the files to write).
 *
 * The fixture, made once, is a checkpoint directory with three real files
 * and a file:// store holding the same files under "get/"; each input
 * becomes the local MANIFEST.json and the remote get/MANIFEST.json. The
 * seeds list the real sizes and sums, so mutations start from a manifest
 * that verifies. A download that succeeds must have written every file it
 * names inside its directory: a manifest path must never escape it. Work
 * happens on /dev/shm when there is one (fsyncs are cheap there); the
 * fixture is removed at exit. */
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt.h"
#include "fuzz_util.h"
#include "storage.h"
#include "tyutil.h"

static char base[PATH_MAX], ck[PATH_MAX + 16], dl[PATH_MAX + 16], storeroot[PATH_MAX + 16];
static store *st;

/* The files of the fixture checkpoint; the seeds' sums are of these bytes. */
static const struct {
    const char *name, *text;
} files[] = {
    {"model.safetensors", "not really tensors, but 39 bytes long.\n"},
    {"trainer_state.json", "{\"step\": 20, \"eval_loss\": 1.25}\n"},
    {"optimizer.bin", "adam-moments"},
};

static void put(const char *dir, const char *name, const char *text, size_t n)
{
    char p[PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    FUZZ_ASSERT(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", p);
}

static void cleanup(void)
{
    if (st) store_close(st);
    st = NULL;
    if (base[0]) ty_rm_rf(base, NULL);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    struct stat sb;
    const char *tmp =
        stat("/dev/shm", &sb) == 0 && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(base, sizeof base, "%s/ty-fuzz-manifest-XXXXXX", tmp);
    FUZZ_ASSERT(mkdtemp(base), "mkdtemp %s", base);
    atexit(cleanup);
    snprintf(ck, sizeof ck, "%s/step-000020", base);
    snprintf(dl, sizeof dl, "%s/dl", base);
    snprintf(storeroot, sizeof storeroot, "%s/store", base);
    char getdir[PATH_MAX * 2];
    snprintf(getdir, sizeof getdir, "%s/get", storeroot);
    ty_err err = {0};
    FUZZ_ASSERT(ty_mkdir_p(ck, &err) == 0 && ty_mkdir_p(getdir, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        size_t n = strlen(files[i].text);
        put(ck, files[i].name, files[i].text, n);
        put(getdir, files[i].name, files[i].text, n);
    }
    char uri[PATH_MAX * 2];
    snprintf(uri, sizeof uri, "file://%s", storeroot);
    store_config cfg;
    store_config_init(&cfg);
    cfg.use_env = 0;
    FUZZ_ASSERT(store_open(uri, &cfg, &st, &err) == 0, "store_open %s: %s", uri, err.msg);
    return 0;
}

/* Every file a successful download names lies inside dl. */
static void check_inside(const char *manifest_path)
{
    json_error_t je;
    json_t *m = json_load_file(manifest_path, 0, &je);
    FUZZ_ASSERT(m, "the downloaded manifest does not parse: %s", je.text);
    char real_dl[PATH_MAX];
    FUZZ_ASSERT(realpath(dl, real_dl), "realpath %s", dl);
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        char p[PATH_MAX * 2], real[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dl, json_string_value(json_object_get(f, "path")));
        FUZZ_ASSERT(realpath(p, real), "downloaded file %s is missing", p);
        size_t n = strlen(real_dl);
        FUZZ_ASSERT(!strncmp(real, real_dl, n) && real[n] == '/', "%s escapes %s", real, real_dl);
    }
    json_decref(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char getdir[PATH_MAX * 2], p[PATH_MAX * 2];
    snprintf(getdir, sizeof getdir, "%s/get", storeroot);
    put(ck, "MANIFEST.json", (const char *)data, size);
    put(getdir, "MANIFEST.json", (const char *)data, size);

    int64_t step = -1;
    ty_err err = {0};
    if (ckpt_verify(ck, &step, &err)) FUZZ_ASSERT(err.msg[0], "a rejected manifest has no message");

    ty_err uerr = {0};
    uint64_t bytes = 0;
    if (store_put_checkpoint(st, ck, "up", &bytes, &uerr))
        FUZZ_ASSERT(uerr.msg[0], "a refused upload has no message");

    ty_err gerr = {0};
    if (store_get_checkpoint(st, "get", dl, &gerr) == 0) {
        snprintf(p, sizeof p, "%s/MANIFEST.json", dl);
        check_inside(p);
    } else {
        FUZZ_ASSERT(gerr.msg[0], "a refused download has no message");
    }

    /* Back to the fixture: nothing uploaded or downloaded survives. */
    snprintf(p, sizeof p, "%s/up", storeroot);
    ty_rm_rf(p, NULL);
    ty_rm_rf(dl, NULL);
    return 0;
}
