/* uri.c — root URIs and object keys: which service a URI names, its
 * bucket (or container, or directory) and key prefix, how a relative key
 * becomes a full object name, and the percent-encoding used in URLs and
 * signatures.
 *
 * Everything a caller can type goes through here first, so a bad URI or a
 * key that could climb out of its prefix ("..", "//") is refused before
 * any backend sees it. */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

#include "tyutil.h"

int store_uri_parse(const char *uri, store_scheme *scheme, char **bucket, char **prefix,
                    ty_err *err)
{
    *bucket = *prefix = NULL;
    if (!uri || !*uri) return ty_err_set(err, TY_EINVAL, "storage: empty URI");
    const char *sep = strstr(uri, "://");
    if (!sep)
        return ty_err_set(err, TY_EINVAL,
                          "storage: '%s' is not a URI (want file://, s3://, gs:// or az://)", uri);
    size_t schemelen = (size_t)(sep - uri);
    const char *rest = sep + 3;
    if (schemelen == 4 && !strncmp(uri, "file", 4)) {
        if (rest[0] != '/')
            return ty_err_set(err, TY_EINVAL, "storage: file URI needs an absolute path: '%s'",
                              uri);
        *scheme = STORE_FILE;
        *bucket = strdup(rest);
        *prefix = strdup("");
    } else {
        if (schemelen == 2 && !strncmp(uri, "s3", 2))
            *scheme = STORE_S3;
        else if (schemelen == 2 && !strncmp(uri, "gs", 2))
            *scheme = STORE_GS;
        else if (schemelen == 2 && !strncmp(uri, "az", 2))
            *scheme = STORE_AZ;
        else
            return ty_err_set(err, TY_EINVAL,
                              "storage: unsupported scheme in '%s' (want file, s3, gs or az)", uri);
        /* bucket[/prefix] */
        const char *slash = strchr(rest, '/');
        size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
        if (blen == 0)
            return ty_err_set(err, TY_EINVAL, "storage: '%s' names no bucket or container", uri);
        for (size_t i = 0; i < blen; i++) {
            char c = rest[i];
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
                  c == '_'))
                return ty_err_set(err, TY_EINVAL,
                                  "storage: bucket/container name in '%s' has invalid characters",
                                  uri);
        }
        const char *p = slash ? slash + 1 : "";
        size_t plen = strlen(p);
        while (plen && p[plen - 1] == '/')
            plen--;
        for (size_t i = 0; i + 1 < plen; i++)
            if (p[i] == '/' && p[i + 1] == '/')
                return ty_err_set(err, TY_EINVAL, "storage: empty path segment in '%s'", uri);
        *bucket = strndup(rest, blen);
        *prefix = malloc(plen + 2);
        if (*prefix) {
            memcpy(*prefix, p, plen);
            (*prefix)[plen] = plen ? '/' : '\0';
            (*prefix)[plen + 1] = '\0';
        }
    }
    if (!*bucket || !*prefix) {
        free(*bucket);
        free(*prefix);
        *bucket = *prefix = NULL;
        return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    }
    return 0;
}

int store_full_key(const store *s, const char *key, char **out, ty_err *err)
{
    *out = NULL;
    if (!key || !*key) return ty_err_set(err, TY_EINVAL, "storage: empty object key");
    if (key[0] == '/') return ty_err_set(err, TY_EINVAL, "storage: key '%s' must be relative", key);
    size_t n = strlen(key);
    if (n > 900) return ty_err_set(err, TY_EINVAL, "storage: key too long (%zu bytes)", n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 || key[i] == 0x7f || key[i] == '\\')
            return ty_err_set(err, TY_EINVAL, "storage: key has a control character or backslash");
    /* Check each segment. */
    const char *seg = key;
    for (;;) {
        const char *e = strchr(seg, '/');
        size_t l = e ? (size_t)(e - seg) : strlen(seg);
        if (l == 0 || (l == 1 && seg[0] == '.') || (l == 2 && seg[0] == '.' && seg[1] == '.'))
            return ty_err_set(err, TY_EINVAL, "storage: key '%s' has an empty, '.' or '..' segment",
                              key);
        if (!e) break;
        seg = e + 1;
    }
    if (!ty_utf8_valid(key, n))
        return ty_err_set(err, TY_EINVAL, "storage: key is not valid UTF-8");
    size_t pl = strlen(s->prefix);
    char *f = malloc(pl + n + 1);
    if (!f) return ty_err_set(err, TY_ENOMEM, "storage: out of memory");
    memcpy(f, s->prefix, pl);
    memcpy(f + pl, key, n + 1);
    *out = f;
    return 0;
}

const char *store_rel_key(const store *s, const char *full)
{
    size_t pl = strlen(s->prefix);
    if (strncmp(full, s->prefix, pl) != 0) return NULL;
    return full + pl;
}

char *store_urlencode(const char *in, int keep_slash)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(in);
    char *o = malloc(3 * n + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)in[i];
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
            *p++ = (char)c;
        } else {
            *p++ = '%';
            *p++ = hex[c >> 4];
            *p++ = hex[c & 15];
        }
    }
    *p = '\0';
    return o;
}
