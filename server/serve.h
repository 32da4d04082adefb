/* serve.h — `trainyard serve` (serve.c): starts the parts in order, waits
 * for SIGINT/SIGTERM and stops them. Only main.c includes this; the parts
 * share state through state.h, never through serve.c. */
#ifndef TY_SERVE_H
#define TY_SERVE_H

/* Runs the daemon until SIGINT/SIGTERM; returns an exit code. */
int srv_serve_main(int argc, char **argv);

#endif
