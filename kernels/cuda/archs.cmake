# archs.cmake — the GPU architectures kernels/cuda is compiled for: T4
# (sm_75, fp16) through A100, A10/3090, L4/4090 to H100/H200 (sm_90a),
# unless the build sets CMAKE_CUDA_ARCHITECTURES itself
# (-DCMAKE_CUDA_ARCHITECTURES=90a, tests/gpu/run.sh's CUDA_ARCHS). Its own
# file so that kernels.cuda_archs can check the rule without a toolkit.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "75;80;86;89;90a")
endif()
