/* sse.h — the server-sent-events hub: per-job and global event streams and
 * followed logs, all on suspended libmicrohttpd connections.
 *
 * No thread per client: a publisher appends a shared, reference-counted
 * message to each subscriber's bounded queue and resumes its connection (in
 * rounds: during a fan-out pass new messages wait for the pass to end, so a
 * client gets everything queued in one send; see sse.c); the connection's
 * content callback drains the queue. A client whose queue is
 * full is dropped (it reconnects with Last-Event-ID) so one slow reader never
 * slows the others. Replay from the database happens inside the callback
 * after subscribing, and live messages with ids already replayed are skipped:
 * no gap, no duplicate. */
#ifndef TY_SSE_H
#define TY_SSE_H

#include <microhttpd.h>
#include <stdint.h>

#include "server.h"

typedef struct sse_hub sse_hub;

sse_hub *sse_hub_new(srv *s, ty_err *err);
/* Resumes and ends every stream, waits for them to close (bounded), frees. */
void sse_hub_shutdown(sse_hub *h);
void sse_hub_free(sse_hub *h);

/* A committed event: to its job's streams (id = seq) and, for state,
 * started and gpu events, to the global stream (id = global id). */
void sse_hub_publish(sse_hub *h, const db_event *ev);
/* A live-only global event without an id (samples of GPUs no job holds). */
void sse_hub_publish_live(sse_hub *h, const char *type, const char *data_json);

/* Queue a streaming response on c. job_id 0 = the global stream. `from` is
 * the last id the client has (replay starts after it); -1 = live only. */
enum MHD_Result sse_hub_serve_events(sse_hub *h, struct MHD_Connection *c, int64_t job_id,
                                     int64_t from);
/* Streams a job's log file from the start, following it until the job is
 * finished and the file fully sent. */
enum MHD_Result sse_hub_serve_log(sse_hub *h, struct MHD_Connection *c, int64_t job_id,
                                  const char *path);

int64_t sse_hub_clients(sse_hub *h);

/* "id: ..\nevent: ..\ndata: {...}\n\n" for one event; malloc'd, *len set.
 * `global` picks the id shown (global id vs per-job seq). */
char *sse_format_event(const db_event *ev, int global, size_t *len);

#endif
