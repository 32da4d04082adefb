/* storage.h — the storage module's interface: one small API over file://,
 * s3://, gs:// and az:// URIs.
 *
 * A store is opened on a root URI (`s3://bucket/some/prefix`); every other
 * call names objects by a key relative to that root ("step-000200/model.bin"),
 * so the server can open one store per configured destination and keep it
 * for its lifetime. Transfers stream between local files and the remote
 * service (never a whole object in memory), retry per request or per part
 * with exponential backoff, and check content hashes so a corrupted transfer
 * is reported instead of stored. A store may be used from several threads at
 * once (the server's upload workers); each call is independent.
 *
 * Credentials come from a store_config the caller fills (from its config
 * file) or from the standard environment variables; they are never logged
 * and never appear in a ty_err message. See docs/storage.md. */
#ifndef TY_STORAGE_H
#define TY_STORAGE_H

#include <stddef.h>
#include <stdint.h>
#include "tyerr.h"

typedef struct store store;

/* Every field is optional. Strings are copied by store_open, so the config
 * may be freed right after. A NULL string falls back to the environment
 * variable named beside it when `use_env` is set (store_config_init sets it). */
typedef struct store_config {
    int use_env;

    /* s3:// */
    const char *aws_access_key_id;     /* AWS_ACCESS_KEY_ID */
    const char *aws_secret_access_key; /* AWS_SECRET_ACCESS_KEY */
    const char *aws_session_token;     /* AWS_SESSION_TOKEN */
    const char *aws_region;            /* AWS_REGION, AWS_DEFAULT_REGION; else us-east-1 */
    const char *s3_endpoint;           /* AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; else AWS */

    /* gs:// — HMAC keys select the XML API; otherwise a service account
     * key selects the JSON API with OAuth2. */
    const char *gcs_hmac_access_id;   /* GCS_HMAC_ACCESS_ID */
    const char *gcs_hmac_secret;      /* GCS_HMAC_SECRET */
    const char *gcs_credentials_file; /* GOOGLE_APPLICATION_CREDENTIALS */
    const char *gcs_xml_endpoint;     /* GCS_ENDPOINT_URL; else https://storage.googleapis.com */
    const char *gcs_json_endpoint; /* STORAGE_EMULATOR_HOST; else https://storage.googleapis.com */

    /* az:// */
    const char *azure_connection_string; /* AZURE_STORAGE_CONNECTION_STRING */
    const char *azure_account;           /* AZURE_STORAGE_ACCOUNT */
    const char *azure_key;               /* AZURE_STORAGE_KEY (base64) */
    const char *azure_sas_token;         /* AZURE_STORAGE_SAS_TOKEN */
    const char *azure_endpoint;          /* AZURE_STORAGE_BLOB_ENDPOINT; else
                                            https://ACCOUNT.blob.core.windows.net */

    /* file:// — colon-separated directories a file:// store must lie in
     * (checked at open and before every put, symlinks resolved); NULL =
     * anywhere (the library on its own), "" = file:// refused. */
    const char *file_roots;

    /* Transfer tuning; 0 picks the default. */
    uint64_t multipart_threshold; /* bytes; default 64 MiB (S3, Azure blocks, GCS chunks) */
    uint64_t part_size;           /* bytes; default 16 MiB */
    int parallel;                 /* concurrent parts per file; default 4 */
    int max_attempts;             /* per request or part; default 6 */
    int retry_base_ms;            /* first backoff; default 200 ms, doubling, with jitter */
    int retry_max_ms;             /* backoff cap; default 10 s */
    long connect_timeout_s;       /* default 10 */
    long stall_timeout_s;   /* abort a transfer slower than 1 KiB/s for this long; default 30 */
    long request_timeout_s; /* whole-request limit (each attempt); default 0 = none. The
                               server's store probe sets it so a submit never hangs. */
} store_config;

/* Defaults, with use_env = 1. */
void store_config_init(store_config *cfg);

/* Opens a store on a root URI: file:///abs/dir, s3://bucket[/prefix],
 * gs://bucket[/prefix], az://container[/prefix] (the account comes from
 * the config). cfg may be NULL (defaults + environment). Checks that
 * credentials exist, but does not contact the service. */
int store_open(const char *uri, const store_config *cfg, store **out, ty_err *err);
void store_close(store *s);

/* Stops every transfer running on this store, from any thread: requests
 * in flight are aborted, no retry starts, and those calls (and any later
 * transfer on this store) return TY_ESTATE. To cancel one job's upload
 * without touching others, give that upload its own store: store_open is
 * cheap and does not contact the service. */
void store_cancel(store *s);

/* The root URI the store was opened on (no credentials in it). */
const char *store_uri(const store *s);

/* Uploads a local file to key. The object appears whole or not at all
 * (single PUT, or multipart/block list committed at the end). */
int store_put_file(store *s, const char *key, const char *local_path, ty_err *err);
/* Downloads key into local_path (written to local_path.part, verified, then
 * renamed). TY_ENOENT if the object does not exist. */
int store_get_file(store *s, const char *key, const char *local_path, ty_err *err);

typedef struct store_object {
    char *key; /* relative to the store root */
    uint64_t size;
    char etag[80]; /* as the service reports it, quotes removed; may be empty */
    int64_t mtime; /* seconds since the epoch; 0 if unknown */
} store_object;

/* Metadata of one object; TY_ENOENT if missing. out->key is owned by the
 * caller: free it with store_object_clear. */
int store_stat(store *s, const char *key, store_object *out, ty_err *err);
void store_object_clear(store_object *o);

typedef struct store_listing {
    store_object *items;
    size_t n, cap;
} store_listing;

/* Every object whose key starts with prefix ("" for all), sorted by key.
 * Free with store_listing_free. */
int store_list(store *s, const char *prefix, store_listing *out, ty_err *err);
void store_listing_free(store_listing *l);

/* Deletes one object. A missing object returns TY_ENOENT where the service
 * says so (file, GCS, Azure; S3 answers 204 either way, so 0); callers that
 * only want it gone (retention) treat TY_ENOENT as done. */
int store_delete(store *s, const char *key, ty_err *err);

/* Writes a small object with a unique name (".trainyard-probe-<16 hex>")
 * under the store's root, then deletes it: the calls the upload queue and
 * retention will make, with the same credentials. key_out (may be NULL)
 * receives the object's name. On failure err->msg says which of the two
 * steps failed and the service's reason; the caller adds the store URI. */
int store_probe(store *s, char *key_out, size_t key_cap, ty_err *err);

/* Uploads every regular file under local_dir (subdirectories included) to
 * remote_prefix/<relative path>, in name order, checking each landed with
 * its size. No manifest and no commit marker: the caller records the
 * outcome. TY_ENOENT if the directory is missing or holds no file;
 * symlinks and other special files are refused (TY_EINVAL). */
int store_put_dir(store *s, const char *local_dir, const char *remote_prefix, uint64_t *bytes_out,
                  int *files_out, ty_err *err);

/* --- checkpoints (DESIGN §6) -------------------------------------------
 * A checkpoint is a local directory with MANIFEST.json listing its files
 * with byte counts and sha256. */

/* Verifies the local files against the manifest, uploads every file to
 * remote_prefix/<path>, checks each landed with the right size, then uploads
 * MANIFEST.json last: a remote checkpoint without its manifest does not
 * exist. On failure nothing is committed (the manifest is not written) and
 * the partial files may be left for retention to clean up. *bytes_out (may
 * be NULL) receives the bytes uploaded. */
int store_put_checkpoint(store *s, const char *local_dir, const char *remote_prefix,
                         uint64_t *bytes_out, ty_err *err);

/* Downloads remote_prefix/MANIFEST.json, then every file it names into
 * local_dir, verifying size and sha256 of each; writes MANIFEST.json last
 * into local_dir. TY_ENOENT if there is no manifest (nothing committed),
 * TY_ECORRUPT if a file does not match. */
int store_get_checkpoint(store *s, const char *remote_prefix, const char *local_dir, ty_err *err);

/* Deletes every object under remote_prefix/, the manifest first so a
 * half-deleted checkpoint is never seen as committed. Missing objects count
 * as deleted; returns 0 if nothing is left. */
int store_delete_checkpoint(store *s, const char *remote_prefix, ty_err *err);

#endif
