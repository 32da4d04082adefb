/* routes.h — the route table (routes.c): every method and path the API
 * answers, with its handler, body type, token scope and query parameters,
 * and the matching the HTTP daemon (http.c) dispatches with. Handlers
 * answer through http.h. */
#ifndef TY_ROUTES_H
#define TY_ROUTES_H

#include "http.h"

typedef enum MHD_Result (*route_fn)(http_req *q);

typedef struct route {
    const char *method;
    const char *pattern; /* "/jobs/{id}/events" */
    route_fn fn;
    bool json_body;     /* body must be application/json */
    bool public_;       /* no token needed (static assets, health) */
    unsigned scope;     /* SCOPE_READ / SCOPE_SUBMIT / SCOPE_ADMIN a token needs */
    const char *params; /* query parameters, comma-separated; "name*" may repeat */
} route;

extern const route routes_table[];
extern const int routes_count;

/* Matches method + path; returns the route index, -1 for an unknown path,
 * -2 for a known path with another method. Fills q->id / q->arg. */
int routes_match(http_req *q, const char *method, const char *path);
/* The methods the path answers, "GET, HEAD, DELETE" (for 405's Allow). */
void routes_allowed(const char *path, char *out, size_t cap);
/* Strict query parsing for the route: a parameter it takes given twice
 * (unless a list), without a value, with a control character, or a list
 * over 255 bytes in all. Returns nonzero with field and msg filled. */
int routes_check_query(http_req *q, const route *rt, char *field, size_t fcap, char *msg,
                       size_t mcap);

#endif
