/* sigv4_dump.c — prints what storage/sigv4.c produces for one request, as
 * JSON, so test_sigv4_botocore.py can compare it with botocore's signer
 * for the same request and a fixed clock.
 *
 * PATH is used as given, or "raw:/bucket/key" is encoded first the way
 * s3.c encodes object names.
 *
 * usage: storage-sigv4-dump METHOD PATH AMZDATE REGION SERVICE PAYLOAD_HASH
 *            AKID SECRET [q NAME VALUE]... [h NAME VALUE]... */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"
#include "store_int.h"

int main(int argc, char **argv)
{
    if (argc < 9) {
        fprintf(stderr, "usage: %s METHOD PATH AMZDATE REGION SERVICE HASH AKID SECRET [q N V]... [h N V]...\n",
                argv[0]);
        return 2;
    }
    if ((argc - 9) % 3) {
        fprintf(stderr, "query and header arguments come in threes\n");
        return 2;
    }
    sigv4_param q[32], h[32];
    size_t nq = 0, nh = 0;
    for (int i = 9; i + 2 < argc; i += 3) {
        sigv4_param p = {argv[i + 1], argv[i + 2]};
        if (!strcmp(argv[i], "q") && nq < 32) q[nq++] = p;
        else if (!strcmp(argv[i], "h") && nh < 32) h[nh++] = p;
        else {
            fprintf(stderr, "bad argument '%s'\n", argv[i]);
            return 2;
        }
    }
    char *path = !strncmp(argv[2], "raw:", 4) ? store_urlencode(argv[2] + 4, 1) : strdup(argv[2]);
    sigv4_input in = {.access_key = argv[7], .secret_key = argv[8], .region = argv[4], .service = argv[5],
                      .method = argv[1], .path = path, .query = q, .n_query = nq, .headers = h,
                      .n_headers = nh, .payload_hash = argv[6], .amz_date = argv[3]};
    sigv4_output out;
    ty_err err = {0};
    if (sigv4_sign(&in, &out, &err) != 0) {
        free(path);
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "canonical_request", out.canonical_request,
                          "string_to_sign", out.string_to_sign, "signed_headers", out.signed_headers,
                          "query_string", out.query_string, "authorization", out.authorization, "signature",
                          out.signature);
    char *s = json_dumps(j, JSON_COMPACT);
    puts(s);
    free(s);
    json_decref(j);
    sigv4_output_free(&out);
    free(path);
    return 0;
}
