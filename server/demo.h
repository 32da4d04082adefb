/* demo.h — `trainyard demo` (demo.c): submits a small from-scratch job to
 * the server at TY_URL and prints the dashboard URL where it trains. */
#ifndef TY_DEMO_H
#define TY_DEMO_H

/* argv[0] is "demo"; `--steps N`. Returns the process exit status. */
int demo_main(int argc, char **argv);

#endif
