/* sigv4.h — AWS Signature Version 4 for S3 and the GCS XML API.
 *
 * A pure function of its inputs (no clock, no network), so tests can hold
 * it against botocore and AWS's published vectors with a fixed date. The
 * caller supplies the already-encoded path and receives the canonical query
 * string to put in its URL, so what is signed and what is sent agree. */
#ifndef TY_SIGV4_H
#define TY_SIGV4_H

#include <stddef.h>
#include <time.h>
#include "tyerr.h"

typedef struct sigv4_param {
    const char *name;
    const char *value;
} sigv4_param;

typedef struct sigv4_input {
    const char *access_key, *secret_key, *region, *service;
    const char *method;
    const char *path;         /* canonical URI, already percent-encoded */
    const sigv4_param *query; /* raw (unencoded) names and values */
    size_t n_query;
    const sigv4_param *headers; /* every header to sign, host and x-amz-date included */
    size_t n_headers;
    const char *payload_hash; /* hex SHA-256 of the body, or UNSIGNED-PAYLOAD */
    const char *amz_date;     /* YYYYMMDDTHHMMSSZ */
} sigv4_input;

typedef struct sigv4_output {
    char *canonical_request;
    char *string_to_sign;
    char *signed_headers;
    char *query_string;  /* canonical query, for the URL */
    char *authorization; /* full Authorization header value */
    char signature[65];
} sigv4_output;

int store_sigv4_sign(const sigv4_input *in, sigv4_output *out, ty_err *err);
void store_sigv4_output_free(sigv4_output *out);
/* YYYYMMDDTHHMMSSZ for t (UTC). */
void store_sigv4_amz_date(time_t t, char out[17]);

#endif
