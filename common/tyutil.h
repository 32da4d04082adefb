/* tyutil.h — small file, hashing and time helpers used by several modules.
 *
 * Everything here is plain POSIX + OpenSSL (+ jansson for reading a JSON
 * file); no module state. */
#ifndef TY_TYUTIL_H
#define TY_TYUTIL_H

#include <stddef.h>
#include <jansson.h>
#include <stdint.h>
#include "tyerr.h"

/* Milliseconds of CLOCK_REALTIME / CLOCK_MONOTONIC. */
int64_t ty_now_ms(void);
int64_t ty_mono_ms(void);

/* mkdir -p with mode 0755. */
int ty_mkdir_p(const char *path, ty_err *err);
/* rm -rf; a missing path is success. */
int ty_rm_rf(const char *path, ty_err *err);
/* Reads a whole (small) file; *out is NUL-terminated and owned by the caller.
 * Opens it with ty_open_input (tyopen.h): regular files only, inside the
 * process's roots when it has set some. */
int ty_read_file(const char *path, char **out, size_t *len, ty_err *err);
/* Reads and parses a whole JSON file into *out (the caller's reference).
 * A file that cannot be read gives ty_read_file's error; one that does not
 * parse gives bad_code with "<path>: not valid JSON (line N, column C: why)",
 * where why never quotes the file (see ty_json_error). */
int ty_read_json(const char *path, int bad_code, json_t **out, ty_err *err);
/* What went wrong in a failed jansson load, without the "near '...'" part
 * jansson adds: that quotes the input, and a file that is not JSON (a
 * credentials file, a database) must not leak its first word into an error
 * message. A static string. */
const char *ty_json_error(const json_error_t *je);
/* s itself when it is a short name (1-24 characters of letters, digits,
 * '_', '-', '.', '<', '>', '|'; a dtype, a type name, a special token like
 * "<unk>"), else "?": what a message may quote from a file it read. */
const char *ty_safe_word(const char *s);
/* Writes path.tmp, fsyncs, renames over path, fsyncs the directory. */
int ty_write_file_atomic(const char *path, const void *data, size_t len, ty_err *err);
/* fsync a directory (after a rename into it). */
int ty_fsync_dir(const char *dir, ty_err *err);

/* SHA-256 as 64 lowercase hex chars + NUL. */
void ty_sha256_hex(const void *data, size_t len, char hex[65]);
/* Streams a file through SHA-256; also returns its size. */
int ty_sha256_file(const char *path, char hex[65], uint64_t *bytes, ty_err *err);
/* Lowercase hex of n bytes into out (2n+1 chars). */
void ty_hex(const unsigned char *in, size_t n, char *out);

/* Constant-time comparison of two equal-length buffers. */
int ty_memeq_ct(const void *a, const void *b, size_t n);

/* Valid UTF-8 (no overlongs, no surrogates)? */
int ty_utf8_valid(const char *s, size_t len);

/* One line on stderr, "trainyard: " + the message + a newline: how the
 * trainyard binary (client and daemon) says what went wrong. */
void ty_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
