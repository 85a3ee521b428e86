# Decides which optional backends are built. Each is on by default where its toolkit is found and
# is quietly left out otherwise (the message says which and why).

set(ASYNCINFER_HAVE_TORCH OFF)
if(ASYNCINFER_WITH_TORCH)
  if(ASYNCINFER_SANITIZE)
    message(STATUS "asyncinfer: torch backend off under sanitizers (libtorch is uninstrumented)")
  else()
    find_package(Torch QUIET)
    if(Torch_FOUND)
      set(ASYNCINFER_HAVE_TORCH ON)
    else()
      message(STATUS "asyncinfer: libtorch not found (Debian: libtorch-dev); torch backend off")
    endif()
  endif()
endif()

set(ASYNCINFER_HAVE_CUDA OFF)
if(ASYNCINFER_WITH_CUDA)
  if(ASYNCINFER_SANITIZE)
    message(STATUS "asyncinfer: cuda backend off under sanitizers (the driver is uninstrumented)")
  else()
    include(CheckLanguage)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      enable_language(CUDA)
      find_package(CUDAToolkit QUIET)
      if(CUDAToolkit_FOUND)
        set(ASYNCINFER_HAVE_CUDA ON)
        # Device code of the cuda backend and of builtin:gemm is small (spin and host-wait
        # kernels, the gemm weight initialiser), so it is built for Hopper (sm_90, H100/H200) as
        # machine code plus compute_75 PTX that the driver JIT-compiles on any other GPU CUDA 13
        # supports (Turing and later). Override with e.g. "80-real;90-real;75-virtual".
        set(ASYNCINFER_CUDA_ARCHITECTURES "90-real;75-virtual" CACHE STRING
            "CUDA_ARCHITECTURES of the cuda backend's and builtin:gemm's device code")
      else()
        message(STATUS "asyncinfer: nvcc found but not the CUDA runtime; cuda backend off")
      endif()
    else()
      message(STATUS "asyncinfer: CUDA toolkit not found; cuda backend off")
    endif()
  endif()
endif()
