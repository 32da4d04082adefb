/* tyutil.c — file, hashing and time helpers (see tyutil.h).
 *
 * Atomic writes go through a temporary file, fsync and rename so a crash
 * leaves either the old or the new contents, never a torn file. */
#include "tyutil.h"

#include "tyopen.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t ty_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ty_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ty_mkdir_p(const char *path, ty_err *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return ty_err_set(err, TY_EINVAL, "bad directory path");
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return ty_err_set(err, TY_EIO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return ty_err_set(err, TY_EIO, "mkdir %s: %s", buf, strerror(errno));
    return 0;
}

int ty_rm_rf(const char *path, ty_err *err)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return ty_err_set(err, TY_EIO, "stat %s: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return ty_err_set(err, TY_EIO, "opendir %s: %s", path, strerror(errno));
        struct dirent *e;
        int rc = 0;
        while (rc == 0 && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char child[4096];
            if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child) {
                rc = ty_err_set(err, TY_EINVAL, "path too long under %s", path);
                break;
            }
            rc = ty_rm_rf(child, err);
        }
        closedir(d);
        if (rc) return rc;
        if (rmdir(path) != 0) return ty_err_set(err, TY_EIO, "rmdir %s: %s", path, strerror(errno));
        return 0;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        return ty_err_set(err, TY_EIO, "unlink %s: %s", path, strerror(errno));
    return 0;
}

int ty_read_file(const char *path, char **out, size_t *len, ty_err *err)
{
    /* Through ty_open_input: regular files only, inside the roots when the
     * process has set some (the engine does). */
    FILE *f = ty_fopen_input(path, err);
    if (!f) return err ? err->code : TY_EIO;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return ty_err_set(err, TY_ENOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return ty_err_set(err, TY_EIO, "read %s failed", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int ty_fsync_dir(const char *dir, ty_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return ty_err_set(err, TY_EIO, "open dir %s: %s", dir, strerror(errno));
    fsync(fd);
    close(fd);
    return 0;
}

const char *ty_json_error(const json_error_t *je)
{
    /* jansson's own text ends in "near '<the text it read>'": from a file
     * that is not JSON (a key file, a database) that is its first word. The
     * error code says what went wrong without it. */
    switch (json_error_code(je)) {
    case json_error_out_of_memory:
        return "out of memory";
    case json_error_stack_overflow:
        return "nested too deeply";
    case json_error_cannot_open_file:
        return "cannot open the file";
    case json_error_invalid_utf8:
        return "invalid UTF-8";
    case json_error_premature_end_of_input:
        return "unexpected end of input";
    case json_error_end_of_input_expected:
        return "text after the JSON value";
    case json_error_invalid_syntax:
        return "syntax error";
    case json_error_invalid_format:
        return "invalid format";
    case json_error_wrong_type:
        return "wrong type";
    case json_error_null_character:
        return "NUL character in a string";
    case json_error_null_value:
        return "null value";
    case json_error_null_byte_in_key:
        return "NUL byte in an object key";
    case json_error_duplicate_key:
        return "duplicate object key";
    case json_error_numeric_overflow:
        return "number out of range";
    default:
        return "not valid JSON";
    }
}

const char *ty_safe_word(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 24) return "?";
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              strchr("_-.<>|", c)))
            return "?";
    }
    return s;
}

int ty_read_json(const char *path, int bad_code, json_t **out, ty_err *err)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    int rc = ty_read_file(path, &text, &len, err);
    if (rc) return rc;
    json_error_t je;
    *out = json_loadb(text, len, 0, &je);
    free(text);
    if (!*out)
        return ty_err_set(err, bad_code, "%s: not valid JSON (line %d, column %d: %s)", path,
                          je.line, je.column, ty_json_error(&je));
    return 0;
}

int ty_write_file_atomic(const char *path, const void *data, size_t len, ty_err *err)
{
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ty_err_set(err, TY_EINVAL, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return ty_err_set(err, TY_EIO, "create %s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return ty_err_set(err, TY_EIO, "write %s: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return ty_err_set(err, TY_EIO, "fsync %s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return ty_err_set(err, TY_EIO, "rename %s: %s", path, strerror(e));
    }
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        if (slash == dir)
            slash[1] = 0;
        else
            *slash = 0;
        return ty_fsync_dir(dir, err);
    }
    return ty_fsync_dir(".", err);
}

void ty_hex(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = 0;
}

void ty_sha256_hex(const void *data, size_t len, char hex[65])
{
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
    ty_hex(md, 32, hex);
}

int ty_sha256_file(const char *path, char hex[65], uint64_t *bytes, ty_err *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return ty_err_set(err, errno == ENOENT ? TY_ENOENT : TY_EIO, "open %s: %s", path,
                          strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) {
        close(fd);
        return ty_err_set(err, TY_ENOMEM, "out of memory");
    }
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    uint64_t total = 0;
    int rc = 0;
    if (!buf) rc = ty_err_set(err, TY_ENOMEM, "out of memory");
    while (rc == 0) {
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = ty_err_set(err, TY_EIO, "read %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        EVP_DigestUpdate(ctx, buf, (size_t)r);
        total += (uint64_t)r;
    }
    if (rc == 0) {
        unsigned char md[32];
        unsigned int mdlen = 0;
        EVP_DigestFinal_ex(ctx, md, &mdlen);
        ty_hex(md, 32, hex);
        if (bytes) *bytes = total;
    }
    free(buf);
    EVP_MD_CTX_free(ctx);
    close(fd);
    return rc;
}

int ty_memeq_ct(const void *a, const void *b, size_t n)
{
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

int ty_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else
            return 0;
        if (end - p <= n) return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
        if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
        p += n + 1;
    }
    return 1;
}

void ty_logf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("trainyard: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
