/* jobview.h — a job as the API shows it (docs/api.md's Job): GET
 * /jobs/{id}, the job lists, GET /queue and every answer that returns a
 * job. Also the small renderings the API's other shapes share. */
#ifndef TY_JOBVIEW_H
#define TY_JOBVIEW_H

#include <jansson.h>
#include <stdint.h>

#include "db.h"
#include "server.h"

/* The job as a JSON object. */
json_t *jobview_json(const srv_config *cfg, db *d, const db_job *j);

/* The same object as compact JSON text (what ty_json_dumps would write of
 * jobview_json), with the stored spec copied in as it is stored instead of
 * parsed and printed again. NULL on allocation failure; free() it. */
char *jobview_text(const srv_config *cfg, db *d, const db_job *j);

/* The ETA in seconds of a running job at `step`, < 0 when unknown. */
double jobview_eta(const db_job *j, int64_t step);

/* An RFC 3339 UTC time, or null for ms <= 0. */
json_t *jobview_time(int64_t ms);
/* A string, or null for NULL. */
json_t *jobview_text_or_null(const char *s);

#endif
