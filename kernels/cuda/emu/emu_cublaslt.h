/* emu_cublaslt.h — the part of cuBLASLt kernels/cuda uses, on the CPU.
 *
 * Test-only, like cuda_emu.h. Same names and argument order as the real
 * library, so cuda_matmul.cu has one source; cublasLtMatmul is routed to
 * OpenBLAS's column-major sgemm (the CPU reference), 16-bit operands
 * widened exactly to fp32 first (a product of 16-bit values is exact in
 * fp32, so only the summation order differs from a GPU's tensor cores),
 * a 16-bit D rounded to nearest-even at the end, as cuBLASLt's epilogue
 * does.
 *
 * It refuses what the real library refuses. emu_cublaslt.cpp holds the
 * rules, taken from the cublasLt.h we build against (13.x): the type
 * combinations of CUBLAS_COMPUTE_32F, a bias and a GELU aux matrix of D's
 * type, the aux leading dimension, pointer alignment as told to the
 * heuristic. A heuristic query outside them returns no algorithm; a
 * matmul that breaks them (a pointer less aligned than its algorithm
 * assumes, an algorithm used with another epilogue) fails. With
 * TY_EMU_LT_REFUSE=<list> the heuristic also refuses the named cases, so
 * each of cuda_matmul.cu's fallbacks runs in the tests:
 *   bias   the BIAS epilogue          gelu  GELU_AUX and GELU_AUX_BIAS
 *   dgelu  the DGELU epilogue         16bit any bf16 / fp16 operand
 *   all    every query (cuda_matmul.cu's own GEMM kernel runs)
 *   bgrad  the BGRADB epilogue
 * With TY_EMU_LT_CASES=<file> the process writes at exit how many queries
 * were of each case and how many were refused on request. */
#ifndef TY_EMU_CUBLASLT_H
#define TY_EMU_CUBLASLT_H

#include "cuda_emu.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
/* Only CUBLAS_COMPUTE_32F is accepted by cublasLtMatmulDescCreate; the
 * others are named for emu_lt_path, which classifies as cuBLASLt does. */
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
    CUBLASLT_EPILOGUE_BGRADB = 512
} cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

typedef struct emu_lt *cublasLtHandle_t;
typedef struct emu_lt_desc {
    cublasComputeType_t ct; /* for emu_lt_path (counting) */
    cublasOperation_t ta, tb;
    cublasLtEpilogue_t epi;
    const void *bias;
    int bias_type;   /* -1: D's type (cuBLASLt's default and, here, its only choice) */
    const void *aux; /* GELU input: written by GELU_AUX*, read by DGELU */
    int aux_type;    /* -1: D's type, likewise */
    int64_t aux_ld;
} * cublasLtMatmulDesc_t;
typedef struct emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
} * cublasLtMatrixLayout_t;
typedef struct emu_lt_pref {
    size_t ws;
    uint32_t align[4]; /* MIN_ALIGNMENT_{A,B,C,D}_BYTES; 256 when not told */
} * cublasLtMatmulPreference_t;
/* Opaque in the real library; here what the algorithm assumes, checked by
 * cublasLtMatmul: the epilogue it was found for and the alignment of each
 * pointer (A, B, C, D as told; bias and aux as their pointers were when
 * the heuristic saw them, 256 for an unset one). */
typedef struct {
    int id;
    int epi;
    uint32_t align[6];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct,
                                        cudaDataType_t scale_type);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                              cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t size);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a,
                                                    const void *buf, size_t size);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                              cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t *res, int *returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Al, const void *B,
                              cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
                              cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_size,
                              cudaStream_t s);

#endif
