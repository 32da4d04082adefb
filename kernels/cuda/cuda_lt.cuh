/* cuda_lt.cuh — cuBLASLt reached through dlopen, not the link line.
 *
 * libcublasLt is 550 MB and not part of the CUDA toolkit on our machines;
 * linking it would make every engine binary fail to start where it is
 * missing, including the CPU-only runs of a CUDA build. So the backend
 * loads it when a CUDA context opens (cuda_ltload.cu, kn_lt_load) and a
 * missing library is one more reason `backend: auto` falls back to the CPU
 * (`cuda` reports it). The sources still read as plain cuBLASLt: after
 * cublasLt.h, each function name used is redefined to the pointer of the
 * same type in kn_lt. Only the nvcc build sees this; the emulation has its
 * own cuBLASLt (emu/emu_cublaslt.h). */
#ifndef TY_KN_CUDA_LT_CUH
#define TY_KN_CUDA_LT_CUH

#include <cublasLt.h>

extern "C" {
#include "tyerr.h"
}

#define KN_LT_FUNCS(X)                                                                             \
    X(cublasLtCreate)                                                                              \
    X(cublasLtDestroy)                                                                             \
    X(cublasLtMatmul)                                                                              \
    X(cublasLtMatmulAlgoGetHeuristic)                                                              \
    X(cublasLtMatmulDescCreate)                                                                    \
    X(cublasLtMatmulDescDestroy)                                                                   \
    X(cublasLtMatmulDescSetAttribute)                                                              \
    X(cublasLtMatmulPreferenceCreate)                                                              \
    X(cublasLtMatmulPreferenceDestroy)                                                             \
    X(cublasLtMatmulPreferenceSetAttribute)                                                        \
    X(cublasLtMatrixLayoutCreate)                                                                  \
    X(cublasLtMatrixLayoutDestroy)

struct kn_lt_api {
#define KN_LT_FIELD(f) decltype(&::f) f;
    KN_LT_FUNCS(KN_LT_FIELD)
#undef KN_LT_FIELD
};
extern kn_lt_api kn_lt;

/* Loads libcublasLt once per process (later calls return the first
 * outcome): 0, or TY_EINVAL with what was tried. Thread-safe. */
int kn_lt_load(ty_err *err);

#ifndef KN_LT_NO_RENAME /* cuda_ltload.cu fills kn_lt by the real names */
#define cublasLtCreate kn_lt.cublasLtCreate
#define cublasLtDestroy kn_lt.cublasLtDestroy
#define cublasLtMatmul kn_lt.cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic kn_lt.cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate kn_lt.cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy kn_lt.cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute kn_lt.cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate kn_lt.cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy kn_lt.cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute kn_lt.cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate kn_lt.cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy kn_lt.cublasLtMatrixLayoutDestroy
#endif

#endif
