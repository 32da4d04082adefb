/* gate_head.c — the request-head check of the gate (gate.h): RFC 9112
 * syntax and the size limits, on the raw bytes of a connection, before
 * libmicrohttpd parses anything. Pure functions over a buffer: unit-tested
 * (tests/server_unit/test_gate.c) and fuzzed (tests/fuzz/fuzz_request.c).
 * A head is checked whole each time more of it arrives; heads are small
 * (16 KiB at most), so the rescans cost less than keeping parse state. */
#include "gate.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- the head check ------------------------------------------------------------------- */

static int reject(gate_verdict *v, unsigned status, const char *code, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int reject(gate_verdict *v, unsigned status, const char *code, const char *field,
                  const char *fmt, ...)
{
    v->status = status;
    v->code = code;
    v->field = field;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    return GATE_REJECT;
}

/* RFC 9110 token characters (method, field names). */
static bool is_tchar(unsigned char c)
{
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

bool gate_has_ctl(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return true;
    return false;
}

static bool name_is(const char *h, size_t n, const char *want)
{
    return strlen(want) == n && !strncasecmp(h, want, n);
}

/* The request line: METHOD SP /target SP HTTP/1.x CRLF. */
static int check_request_line(const char *buf, size_t ll, const gate_limits *lim, bool *http11,
                              gate_verdict *v)
{
    if (ll < 2 || buf[ll - 2] != '\r')
        return reject(v, 400, "bad_request", NULL, "request lines must end with CRLF");
    const char *end = buf + ll - 2;
    const char *sp1 = memchr(buf, ' ', (size_t)(end - buf));
    if (!sp1 || sp1 == buf) return reject(v, 400, "bad_request", NULL, "malformed request line");
    for (const char *p = buf; p < sp1; p++)
        if (!is_tchar((unsigned char)*p))
            return reject(v, 400, "bad_request", NULL, "malformed request method");
    const char *t = sp1 + 1;
    const char *sp2 = memchr(t, ' ', (size_t)(end - t));
    if (!sp2 || sp2 == t) return reject(v, 400, "bad_request", NULL, "malformed request line");
    if (*t != '/')
        return reject(v, 400, "bad_request", NULL, "the request target must be a path ('/...')");
    int params = 0;
    bool in_query = false;
    for (const char *p = t; p < sp2; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f)
            return reject(v, 400, "bad_request", NULL,
                          "the request target holds a byte that must be percent-encoded");
        /* Each parameter takes libmicrohttpd connection memory (a request
         * with a thousand stalls there without an answer). */
        if ((*p == '?' && !in_query) || (in_query && *p == '&')) params++;
        in_query = in_query || *p == '?';
    }
    if (params > lim->max_params)
        return reject(v, 414, "too_large", NULL, "more than %d query parameters", lim->max_params);
    const char *ver = sp2 + 1;
    if (end - ver != 8 || memcmp(ver, "HTTP/", 5) || !isdigit((unsigned char)ver[5]) ||
        ver[6] != '.' || !isdigit((unsigned char)ver[7]))
        return reject(v, 400, "bad_request", NULL, "malformed HTTP version");
    if (ver[5] != '1' || ver[7] > '1')
        return reject(v, 505, "version_not_supported", NULL,
                      "HTTP/%c.%c is not supported (HTTP/1.0 and HTTP/1.1 are)", ver[5], ver[7]);
    *http11 = ver[7] == '1';
    return GATE_OK;
}

typedef struct head_facts {
    int content_length_n, host_n, transfer_encoding_n, cookies;
    unsigned long long content_length;
} head_facts;

/* One field line (without CRLF): name ":" OWS value OWS. */
static int check_field(const char *h, size_t n, head_facts *f, gate_verdict *v)
{
    if (*h == ' ' || *h == '\t')
        return reject(v, 400, "bad_request", NULL, "obsolete line folding is not accepted");
    const char *colon = memchr(h, ':', n);
    if (!colon || colon == h)
        return reject(v, 400, "bad_request", NULL, "a header line has no field name");
    size_t nl = (size_t)(colon - h);
    for (size_t i = 0; i < nl; i++)
        if (!is_tchar((unsigned char)h[i]))
            return reject(v, 400, "bad_request", NULL, "malformed header field name");
    const char *val = colon + 1, *ve = h + n;
    while (val < ve && (*val == ' ' || *val == '\t'))
        val++;
    while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    for (const char *p = val; p < ve; p++)
        if (((unsigned char)*p < 0x20 && *p != '\t') || *p == 0x7f)
            return reject(v, 400, "bad_request", NULL, "header %.*s holds a control byte",
                          (int)(nl > 64 ? 64 : nl), h);
    size_t vl = (size_t)(ve - val);
    if (name_is(h, nl, "Content-Length")) {
        if (++f->content_length_n > 1)
            return reject(v, 400, "bad_request", "Content-Length",
                          "more than one Content-Length header");
        /* libmicrohttpd does not strip trailing whitespace from this value
         * and would answer "19 " with its own HTML 400: refuse it here, in
         * JSON (found by fuzz.request). */
        if (vl == 0 || ve != h + n)
            return reject(v, 400, "bad_request", "Content-Length",
                          "Content-Length must be a decimal byte count");
        unsigned long long x = 0;
        for (size_t i = 0; i < vl; i++) {
            if (!isdigit((unsigned char)val[i]))
                return reject(v, 400, "bad_request", "Content-Length",
                              "Content-Length must be a decimal byte count");
            /* Saturate: anything this large is over every limit. */
            x = x > (1ULL << 60) ? x : x * 10 + (unsigned)(val[i] - '0');
        }
        f->content_length = x;
    } else if (name_is(h, nl, "Host")) {
        f->host_n++;
    } else if (name_is(h, nl, "Cookie")) {
        /* libmicrohttpd keeps each cookie in the connection's memory: too
         * many exhaust it and it answers with HTML itself. */
        f->cookies++;
        for (const char *p = val; p < ve; p++)
            f->cookies += *p == ';';
    } else if (name_is(h, nl, "Transfer-Encoding")) {
        f->transfer_encoding_n++;
    }
    return GATE_OK;
}

int gate_check_head(const char *buf, size_t n, const gate_limits *lim, gate_verdict *v)
{
    /* The request line, rejected early when it cannot be HTTP (a TLS
     * hello on the plain port, binary noise) instead of waiting it out. */
    const char *nl = memchr(buf, '\n', n);
    size_t scan = nl ? (size_t)(nl - buf) : n;
    for (size_t i = 0; i < scan; i++) {
        unsigned char c = (unsigned char)buf[i];
        /* CR may end the line, or the bytes so far (LF still to come). */
        if (c == '\r' && i + 1 == scan) break;
        if (c < 0x20 || c == 0x7f)
            return reject(v, 400, "bad_request", NULL,
                          "the request line holds a control byte (not an HTTP/1.x request?)");
    }
    if (!nl) {
        if (n > lim->max_line)
            return reject(v, 414, "too_large", NULL, "request line over %zu bytes", lim->max_line);
        return GATE_MORE;
    }
    size_t ll = (size_t)(nl - buf) + 1;
    if (ll > lim->max_line)
        return reject(v, 414, "too_large", NULL, "request line over %zu bytes", lim->max_line);
    bool http11 = false;
    if (check_request_line(buf, ll, lim, &http11, v)) return GATE_REJECT;

    head_facts f = {0};
    int fields = 0;
    for (size_t off = ll;;) {
        const char *e = memchr(buf + off, '\n', n - off);
        size_t len = e ? (size_t)(e - (buf + off)) + 1 : n - off;
        if (off + len > lim->max_head)
            return reject(v, 431, "too_large", NULL, "request head over %zu bytes", lim->max_head);
        if (!e) return GATE_MORE;
        if (len < 2 || buf[off + len - 2] != '\r')
            return reject(v, 400, "bad_request", NULL, "header lines must end with CRLF");
        if (len == 2) break; /* the blank line: end of the head */
        if (++fields > lim->max_fields)
            return reject(v, 431, "too_large", NULL, "more than %d header fields", lim->max_fields);
        if (check_field(buf + off, len - 2, &f, v)) return GATE_REJECT;
        off += len;
    }
    if (f.cookies > lim->max_cookies)
        return reject(v, 431, "too_large", "Cookie", "more than %d cookies", lim->max_cookies);
    if (f.transfer_encoding_n && f.content_length_n)
        return reject(v, 400, "bad_request", "Transfer-Encoding",
                      "Content-Length and Transfer-Encoding together");
    if (f.transfer_encoding_n)
        return reject(v, 411, "length_required", "Transfer-Encoding",
                      "send the body with a Content-Length (Transfer-Encoding is not accepted)");
    if (f.host_n > 1 || (http11 && f.host_n != 1))
        return reject(v, 400, "bad_request", "Host", "an HTTP/1.1 request needs exactly one Host");
    if (f.content_length_n && f.content_length > lim->max_body)
        return reject(v, 413, "too_large", NULL, "request body over the %zu-byte limit",
                      lim->max_body);
    return GATE_OK;
}

void gate_head_extent(const char *buf, size_t n, size_t *head_len, unsigned long long *body_len)
{
    *head_len = n;
    *body_len = 0;
    const char *end = memmem(buf, n, "\r\n\r\n", 4);
    if (!end) return;
    *head_len = (size_t)(end - buf) + 4;
    /* The head was accepted: one Content-Length at most, plain digits. */
    for (const char *p = memchr(buf, '\n', *head_len); p && p < end;
         p = memchr(p, '\n', (size_t)(end - p))) {
        p++;
        if ((size_t)(end - p) > 15 && !strncasecmp(p, "Content-Length:", 15)) {
            const char *v = p + 15;
            while (*v == ' ' || *v == '\t')
                v++;
            unsigned long long x = 0;
            for (; isdigit((unsigned char)*v); v++)
                x = x > (1ULL << 60) ? x : x * 10 + (unsigned)(*v - '0');
            *body_len = x;
        }
    }
}
