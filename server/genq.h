/* genq.h — POST /jobs/{id}/generate: one queue of generation requests run
 * by `trainyard-engine generate` one at a time, on the CPU, with a time
 * limit (genq.c). The HTTP connection is suspended while its request
 * waits and runs, so no libmicrohttpd thread is held. */
#ifndef TY_GENQ_H
#define TY_GENQ_H

#include "http.h"

/* The route handler: validates, queues and suspends; called again by
 * libmicrohttpd after the worker resumes the connection, it answers. */
enum MHD_Result genq_post(http_req *q);
/* Before MHD_stop_daemon: kills a running generation, answers every
 * waiting request 503 and resumes them, stops the worker. */
void genq_shutdown(void);

#endif
