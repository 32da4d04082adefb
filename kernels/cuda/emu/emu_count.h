/* emu_count.h — what cuda-emu counts per launch (emu_count.cpp says how),
 * in C so that tests read the records too (emu_count_take). */
#ifndef TY_EMU_COUNT_H
#define TY_EMU_COUNT_H

#include <stdint.h>

/* The execution paths FLOPs are counted by (emu_lt_path picks a matmul's). */
enum { EMU_PATH_TC16, EMU_PATH_TF32, EMU_PATH_SIMT, EMU_PATH_MMA, EMU_PATHS };

typedef struct emu_count_rec {
    char name[96];
    unsigned grid[3], block[3];
    uint64_t flops[EMU_PATHS];
    int declared, seen;        /* decl_* / seen_* hold values */
    uint64_t decl_rd, decl_wr; /* bytes the source declares */
    uint64_t seen_rd, seen_wr; /* bytes the launch touched (TY_EMU_COUNT_MEM=1) */
} emu_count_rec;

#ifdef __cplusplus
extern "C" {
#endif
/* Moves up to max records made since the last call into out; the count. */
int emu_count_take(emu_count_rec *out, int max);
/* The FLOP path cuBLASLt takes for a compute type and A/B type. */
int emu_lt_path(int compute_type, int ab_type);
#ifdef __cplusplus
}
#endif

#endif
