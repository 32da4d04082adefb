/* events.h — the engine's event stream of DESIGN §5.
 *
 * One JSON object per line on fd 3, or stdout when fd 3 is not open. Only
 * rank 0 writes; other ranks' calls are no-ops. The server parses these
 * lines, so each is written with a single write() loop and nothing else ever
 * goes to this fd (logs go to stderr). */
#ifndef TY_EVENTS_H
#define TY_EVENTS_H

#include <jansson.h>
#include <stdint.h>

/* Picks the fd; call once at start-up. */
void ev_init(int rank);
/* Rank 0's events go to path when it is set (TY_EVENTS_PATH: a FIFO or a
 * file, opened append), else to stdout when world > 1 (a launcher's fd 3 is
 * not ours). After ev_init; -1 with errno when path cannot be opened. */
int ev_set_output(const char *path, int world);
/* Writes obj as one compact line, keys in insertion order; steals the ref. */
void ev_emit(json_t *obj);
void ev_error(const char *message);
void ev_done(const char *status);

/* Log lines to stderr with a "trainyard-engine:" prefix. */
void ev_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
