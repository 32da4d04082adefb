# sources.cmake — the kernels/cuda sources (names without .cu), one list
# for the nvcc build (CMakeLists.txt, which adds cuda_ltload, the
# run-time loading of cuBLASLt) and for the emulation (emu/CMakeLists.txt).
set(TY_CUDA_KERNEL_SOURCES cuda_backend cuda_elementwise cuda_norm cuda_colsum cuda_matmul
    cuda_attention cuda_attn_fwd cuda_attn_dq cuda_attn_dkdv cuda_loss cuda_convert cuda_optim
    cuda_nf4 cuda_matmul_gelu cuda_profile)
# The attention sources: nvcc gives each ptxas's resource report, which
# ptxas-report.sh keeps for kernels.cuda_attn_ptxas.
set(TY_CUDA_ATTENTION_SOURCES cuda_attention cuda_attn_fwd cuda_attn_dq cuda_attn_dkdv)
