/* fuzz_util.h — what the fuzz targets share: handing an input to an entry
 * point that only takes a path, without touching the disk.
 *
 * The input goes into a memfd and the entry point gets /proc/self/fd/N: the
 * real open/fstat/mmap/pread path runs on it, exactly as on a file, and
 * nothing is left behind if the fuzzer is killed. Everything is static
 * inline: each target is one .c file plus this header. */
#ifndef TY_FUZZ_UTIL_H
#define TY_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd; path gets its /proc name. Returns the fd
 * (close it when done) or aborts: a harness that cannot run must not pass. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char path[64])
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) {
        perror("fuzz: memfd_create");
        abort();
    }
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            perror("fuzz: write");
            abort();
        }
        off += (size_t)w;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

/* A NUL-terminated copy of the input (parsers that take C strings). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s) abort();
    for (size_t i = 0; i < size; i++)
        s[i] = (char)data[i];
    s[size] = 0;
    return s;
}

/* Reports a broken invariant the sanitizers cannot see and stops the run, so
 * libFuzzer saves the input. */
#define FUZZ_ASSERT(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz: invariant broken: %s: ", #cond);                                \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
