/* test_emu_guard.c — kernels.cuda_emu.guard: with TY_EMU_GUARD=1 the
 * emulated device's memory cannot be read by host code (as on a GPU), yet
 * copies and kernels still reach it. This is what makes the engine's
 * device-path tests (engine.device.*) fail on a host dereference of a
 * device pointer instead of passing where a GPU would crash. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "tyassert.h"

static void on_segv(int sig)
{
    (void)sig;
    _exit(42);
}

int main(void)
{
    setenv("TY_EMU_GUARD", "1", 1);
    kn_ctx *c = NULL;
    ty_err err = {0};
    if (kn_open_backend(&c, &kn_cuda_emu_backend, KN_CUDA, 0, 1, &err)) {
        printf("FAIL: open: %s\n", err.msg);
        return 1;
    }
    float host[5] = {1, 2, 3, 4, 5}, back[5] = {0};
    float *d = kn_alloc(c, sizeof host);
    kn_to_device(c, d, host, sizeof host);
    kn_scale(c, d, 5, 2.0f); /* a kernel writes it */
    kn_to_host(c, back, d, sizeof back);
    for (int i = 0; i < 5; i++)
        CHECK(back[i] == 2 * host[i], "element %d: %g after scale", i, back[i]);
    CHECK(kn_sum(c, d, 5) == 30.0, "sum %g", kn_sum(c, d, 5));
    /* A host read of the device block must fault (in a child, so the
     * fault is observed rather than fatal). */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* Our own handler, so the outcome is the same with AddressSanitizer
         * (which would report and exit 1) as without. */
        struct sigaction sa = {0};
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        volatile float x = d[0];
        (void)x;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42,
          "a host read of device memory did not fault (status %d)", st);
    /* Pinned host memory stays readable. */
    float *h = kn_host_alloc(c, 16);
    h[0] = 1;
    kn_host_free(c, h);
    CHECK(kn_check(c, &err) == 0, "context error: %s", err.msg);
    kn_close(c);
    return ty_summary("kernels.cuda_emu.guard");
}
