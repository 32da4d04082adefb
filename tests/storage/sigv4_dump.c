/* sigv4_dump.c — prints what storage/sigv4.c produces for requests read
 * from stdin, so test_sigv4_botocore.py can compare it with botocore's
 * signer for the same requests and a fixed clock. One process for all
 * cases keeps the test fast under ASan.
 *
 * Input: one JSON object per line
 *   {"method", "path", "amz_date", "region", "service", "payload", "ak", "sk",
 *    "query": [[name, value]...], "headers": [[name, value]...]}
 * where "path" is used as given, or "raw:/bucket/key" is encoded first the
 * way s3.c encodes object names. Output: one JSON object per line with
 * canonical_request, string_to_sign, signed_headers, query_string,
 * authorization and signature. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"
#include "store_int.h"

static size_t pairs(json_t *arr, sigv4_param *out, size_t cap)
{
    size_t n = 0, i;
    json_t *p;
    json_array_foreach(arr, i, p)
    {
        if (n == cap) break;
        out[n].name = json_string_value(json_array_get(p, 0));
        out[n].value = json_string_value(json_array_get(p, 1));
        if (out[n].name && out[n].value) n++;
    }
    return n;
}

int main(void)
{
    char *line = NULL;
    size_t cap = 0;
    int status = 0;
    while (getline(&line, &cap, stdin) > 0) {
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) {
            fprintf(stderr, "bad input line: %s\n", je.text);
            status = 2;
            break;
        }
        sigv4_param q[32], h[32];
        size_t nq = pairs(json_object_get(j, "query"), q, 32),
               nh = pairs(json_object_get(j, "headers"), h, 32);
        const char *p = json_string_value(json_object_get(j, "path"));
        char *path = !p ? NULL : !strncmp(p, "raw:", 4) ? store_urlencode(p + 4, 1) : strdup(p);
#define S(k) json_string_value(json_object_get(j, k))
        sigv4_input in = {.access_key = S("ak"),
                          .secret_key = S("sk"),
                          .region = S("region"),
                          .service = S("service"),
                          .method = S("method"),
                          .path = path,
                          .query = q,
                          .n_query = nq,
                          .headers = h,
                          .n_headers = nh,
                          .payload_hash = S("payload"),
                          .amz_date = S("amz_date")};
#undef S
        sigv4_output out;
        ty_err err = {0};
        if (store_sigv4_sign(&in, &out, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            status = 1;
        } else {
            json_t *o =
                json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "canonical_request",
                          out.canonical_request, "string_to_sign", out.string_to_sign,
                          "signed_headers", out.signed_headers, "query_string", out.query_string,
                          "authorization", out.authorization, "signature", out.signature);
            char *s = json_dumps(o, JSON_COMPACT);
            puts(s);
            free(s);
            json_decref(o);
            store_sigv4_output_free(&out);
        }
        free(path);
        json_decref(j);
    }
    free(line);
    return status;
}
