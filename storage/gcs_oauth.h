/* gcs_oauth.h — service-account JWT → OAuth2 access token for the GCS JSON
 * API (internal to storage/; exposed so the tests can check the JWT). */
#ifndef TY_GCS_OAUTH_H
#define TY_GCS_OAUTH_H

#include <curl/curl.h>
#include <stdint.h>
#include "tyerr.h"

typedef struct gcs_oauth gcs_oauth;
struct store;

/* Reads a service-account key file (type, client_email, private_key,
 * token_uri). token_uri_override may be NULL. */
int store_gcs_oauth_load(const char *json_path, const char *token_uri_override, gcs_oauth **out,
                         ty_err *err);
void store_gcs_oauth_free(gcs_oauth *o);
/* The signed assertion for time `now` (caller frees). */
char *store_gcs_oauth_jwt(gcs_oauth *o, int64_t now, ty_err *err);
/* Appends "Authorization: Bearer ..." to *h, fetching or refreshing the
 * token first when needed (force_refresh after a 401). Thread-safe. */
int store_gcs_oauth_header(struct store *s, gcs_oauth *o, int force_refresh, struct curl_slist **h,
                           ty_err *err);

#endif
