/* ty_store.c — `ty-store`, a small command line over the storage module,
 * used by the storage tests (against emulators and fault proxies) and by
 * bench/storage. It only parses arguments and calls store_*; every
 * behaviour under test lives in the library.
 *
 *   ty-store put URI KEY FILE       ty-store get URI KEY FILE
 *   ty-store stat URI KEY           ty-store ls URI [PREFIX]
 *   ty-store rm URI KEY
 *   ty-store put-ckpt URI PREFIX DIR   ty-store get-ckpt URI PREFIX DIR
 *   ty-store rm-ckpt URI PREFIX
 *
 * Tuning from the environment: TY_STORE_PART_SIZE, TY_STORE_THRESHOLD,
 * TY_STORE_PARALLEL, TY_STORE_MAX_ATTEMPTS, TY_STORE_RETRY_BASE_MS.
 * Exit status: 0 ok, 2 not found, 3 auth, 4 corrupt, 1 anything else. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

static uint64_t env_u64(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: ty-store put|get URI KEY FILE | stat|rm URI KEY | ls URI [PREFIX]\n"
                    "       ty-store put-ckpt|get-ckpt URI PREFIX DIR | rm-ckpt URI PREFIX\n");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) return usage();
    const char *cmd = argv[1], *uri = argv[2];
    store_config cfg;
    store_config_init(&cfg);
    cfg.part_size = env_u64("TY_STORE_PART_SIZE");
    cfg.multipart_threshold = env_u64("TY_STORE_THRESHOLD");
    cfg.parallel = (int)env_u64("TY_STORE_PARALLEL");
    cfg.max_attempts = (int)env_u64("TY_STORE_MAX_ATTEMPTS");
    cfg.retry_base_ms = (int)env_u64("TY_STORE_RETRY_BASE_MS");
    cfg.stall_timeout_s = (long)env_u64("TY_STORE_STALL_S");
    ty_err err = {0};
    store *s = NULL;
    int rc = store_open(uri, &cfg, &s, &err);
    if (rc == 0) {
        if (!strcmp(cmd, "put") && argc == 5)
            rc = store_put_file(s, argv[3], argv[4], &err);
        else if (!strcmp(cmd, "get") && argc == 5)
            rc = store_get_file(s, argv[3], argv[4], &err);
        else if (!strcmp(cmd, "rm") && argc == 4)
            rc = store_delete(s, argv[3], &err);
        else if (!strcmp(cmd, "stat") && argc == 4) {
            store_object o;
            rc = store_stat(s, argv[3], &o, &err);
            if (rc == 0)
                printf("%s\t%llu\t%s\t%lld\n", o.key, (unsigned long long)o.size, o.etag,
                       (long long)o.mtime);
            store_object_clear(&o);
        } else if (!strcmp(cmd, "ls") && (argc == 3 || argc == 4)) {
            store_listing l;
            rc = store_list(s, argc == 4 ? argv[3] : "", &l, &err);
            for (size_t i = 0; rc == 0 && i < l.n; i++)
                printf("%s\t%llu\n", l.items[i].key, (unsigned long long)l.items[i].size);
            store_listing_free(&l);
        } else if (!strcmp(cmd, "put-ckpt") && argc == 5) {
            uint64_t bytes = 0;
            rc = store_put_checkpoint(s, argv[4], argv[3], &bytes, &err);
            if (rc == 0) printf("uploaded %llu bytes\n", (unsigned long long)bytes);
        } else if (!strcmp(cmd, "get-ckpt") && argc == 5)
            rc = store_get_checkpoint(s, argv[3], argv[4], &err);
        else if (!strcmp(cmd, "rm-ckpt") && argc == 4)
            rc = store_delete_checkpoint(s, argv[3], &err);
        else {
            store_close(s);
            return usage();
        }
    }
    store_close(s);
    if (rc == 0) return 0;
    fprintf(stderr, "ty-store: %s: %s\n", ty_err_name(rc), err.msg);
    return rc == TY_ENOENT ? 2 : rc == TY_EAUTH ? 3 : rc == TY_ECORRUPT ? 4 : 1;
}
