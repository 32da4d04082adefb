/* test_gate.c — gate_check_head, the request-head check in front of
 * libmicrohttpd: each refusal with its status and code, incomplete heads
 * asking for more (at every prefix of a good head), and the limits at and
 * one past their edge; gate_head_extent, where a pipelined request's
 * successor starts. The socket side is tests/server/test_hardening.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tyassert.h"
#include "gate.h"

static const gate_limits LIM = {.max_line = 64,
                                .max_head = 256,
                                .max_fields = 4,
                                .max_params = 3,
                                .max_cookies = 2,
                                .max_body = 100};

static int verdict(const char *head, gate_verdict *v)
{
    memset(v, 0, sizeof *v);
    return gate_check_head(head, strlen(head), &LIM, v);
}

static void refused(const char *head, unsigned status, const char *code)
{
    gate_verdict v;
    int rc = verdict(head, &v);
    if (rc != GATE_REJECT || v.status != status || strcmp(v.code, code)) {
        fprintf(stderr, "head %.60s: rc %d status %u code %s (want %u %s)\n", head, rc, v.status,
                v.code ? v.code : "-", status, code);
        exit(1);
    }
    CHECK(v.msg[0]);
}

static void accepted(const char *head)
{
    gate_verdict v;
    int rc = verdict(head, &v);
    if (rc != GATE_OK) {
        fprintf(stderr, "head %.60s: rc %d %u %s\n", head, rc, v.status, v.msg);
        exit(1);
    }
}

int main(void)
{
    gate_verdict v;
    const char *good = "POST /jobs?a=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    accepted(good);
    /* Every proper prefix of the head asks for more, never refuses. */
    size_t head_len = strstr(good, "\r\n\r\n") + 4 - good;
    for (size_t n = 0; n < head_len; n++)
        CHECK(gate_check_head(good, n, &LIM, &v) == GATE_MORE);
    accepted("GET / HTTP/1.0\r\n\r\n");
    accepted("GET /x HTTP/1.1\r\nHost:x\r\nX-Y: \t a\x80\xff b \r\n\r\n");

    refused("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, "version_not_supported");
    refused("GET / HTTP/1.2\r\nHost: x\r\n\r\n", 505, "version_not_supported");
    refused("GET / HTTP/1.x\r\nHost: x\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\nHost: x\n\n", 400, "bad_request");
    refused("\x16\x03\x01", 400, "bad_request"); /* TLS on the plain port: at once */
    refused("GET  / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request");
    refused("G(T / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request");
    refused("GET x HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request");
    refused("GET /\x7f HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\n: v\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nX-A : v\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: v\r\n folded\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: v\x01\r\n\r\n", 400, "bad_request");
    refused("GET / HTTP/1.1\r\nHost: x\r\nX-A: v\n\r\n", 400, "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400, "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 400, "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1 2\r\n\r\n", 400, "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\n", 400,
            "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
            400, "bad_request");
    refused("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411,
            "length_required");
    accepted("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 413, "too_large");
    refused("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999999\r\n\r\n", 413,
            "too_large");

    /* The request line: 64 bytes with CRLF pass, 65 do not (even unfinished). */
    char line[128];
    for (int len = 64; len <= 65; len++) {
        /* "GET /" + a's + " HTTP/1.0\r\n" is len bytes. */
        int na = len - 5 - 11;
        snprintf(line, sizeof line, "GET /%.*s HTTP/1.0\r\n\r\n", na,
                 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        CHECK(strstr(line, "\r\n") + 2 - line == len);
        if (len == 64)
            accepted(line);
        else
            refused(line, 414, "too_large");
    }
    memset(line, 'a', 70);
    memcpy(line, "GET /", 5);
    line[70] = 0;
    refused(line, 414, "too_large");
    accepted("GET /?a&b&c HTTP/1.0\r\n\r\n");
    refused("GET /?a&b&c&d HTTP/1.0\r\n\r\n", 414, "too_large");
    /* Fields, cookies and the whole head. */
    accepted("GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 1\r\nC: 1\r\n\r\n");
    refused("GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\n\r\n", 431, "too_large");
    accepted("GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1; b=2\r\n\r\n");
    refused("GET / HTTP/1.1\r\nHost: x\r\nCookie: a=1\r\nCookie: b=2; c=3\r\n\r\n", 431,
            "too_large");
    char big[400];
    snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: x\r\nX: %0250d\r\n\r\n", 0);
    refused(big, 431, "too_large");
    big[200] = 0; /* unfinished and still under the limit: more */
    CHECK(gate_check_head(big, strlen(big), &LIM, &v) == GATE_MORE);

    /* Where the next pipelined request starts. */
    size_t hl;
    unsigned long long bl;
    const char *two = "POST /a HTTP/1.1\r\nHost: x\r\ncontent-length:  12\r\n\r\n{}GET / HTTP/1.1";
    gate_head_extent(two, strlen(two), &hl, &bl);
    CHECK(hl == (size_t)(strstr(two, "{}") - two) && bl == 12);
    const char *plain = "GET / HTTP/1.0\r\n\r\nGET";
    gate_head_extent(plain, strlen(plain), &hl, &bl);
    CHECK(hl == 18 && bl == 0);
    const char *named = "GET / HTTP/1.1\r\nHost: x\r\nX-Content-Length: 5\r\n\r\n";
    gate_head_extent(named, strlen(named), &hl, &bl);
    CHECK(hl == strlen(named) && bl == 0);

    CHECK(gate_has_ctl("a\0b", 3) && gate_has_ctl("\x7f", 1) && !gate_has_ctl("a b\x80", 4));
    printf("gate: head checks ok\n");
    return ty_summary("gate");
}
