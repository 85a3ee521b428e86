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

# OpenVINO: the C++ files of PyPI's `openvino` wheel, which scripts/setup.sh installs into
# .venv/openvino (no Debian package has OpenVINO). Found through the wheel's own
# openvino.utils.get_cmake_path() when OpenVINO_DIR is not given. The wheel is built with the
# C++11 ABI (_GLIBCXX_USE_CXX11_ABI=1, like Debian's libtorch, gRPC and protobuf), so the backend
# links it directly (docs/design.md, "OpenVINO's ABI").
set(ASYNCINFER_HAVE_OPENVINO OFF)
if(ASYNCINFER_WITH_OPENVINO)
  if(ASYNCINFER_SANITIZE)
    message(STATUS "asyncinfer: openvino backend off under sanitizers (OpenVINO is uninstrumented)")
  else()
    set(ASYNCINFER_OPENVINO_PYTHON "${PROJECT_SOURCE_DIR}/.venv/openvino/bin/python" CACHE FILEPATH
        "The interpreter whose `openvino` package has the C++ files (scripts/setup.sh makes it)")
    if(NOT OpenVINO_DIR AND EXISTS "${ASYNCINFER_OPENVINO_PYTHON}")
      execute_process(
        COMMAND "${ASYNCINFER_OPENVINO_PYTHON}" -c
                "import openvino.utils as u; print(u.get_cmake_path(), end='')"
        OUTPUT_VARIABLE _ov_cmake_dir RESULT_VARIABLE _ov_rc ERROR_QUIET)
      if(_ov_rc EQUAL 0 AND EXISTS "${_ov_cmake_dir}/OpenVINOConfig.cmake")
        set(OpenVINO_DIR "${_ov_cmake_dir}" CACHE PATH "OpenVINO's CMake config" FORCE)
      endif()
    endif()
    find_package(OpenVINO QUIET COMPONENTS Runtime)
    if(OpenVINO_FOUND)
      if(NOT OpenVINO_GLIBCXX_USE_CXX11_ABI STREQUAL "" AND NOT OpenVINO_GLIBCXX_USE_CXX11_ABI)
        message(STATUS "asyncinfer: OpenVINO ${OpenVINO_VERSION} was built with the old C++ ABI "
                       "(_GLIBCXX_USE_CXX11_ABI=0) and cannot share std::string with this build; "
                       "openvino backend off")
      else()
        set(ASYNCINFER_HAVE_OPENVINO ON)
      endif()
    else()
      message(STATUS "asyncinfer: OpenVINO not found (scripts/setup.sh makes .venv/openvino, or "
                     "pass -DOpenVINO_DIR); openvino backend off")
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

# asyncinfer_cuda_object_library(<name> <sources...>): an OBJECT library of CUDA code for
# libasyncinfer (the cuda device backend, builtin:gemm), built for ASYNCINFER_CUDA_ARCHITECTURES
# with our warnings, our include paths and ASYNCINFER_HAVE_CUDA. CUDA's headers come from the
# imported CUDA:: targets, which CMake marks SYSTEM: our -Werror flags do not apply to them.
function(asyncinfer_cuda_object_library name)
  add_library(${name} OBJECT ${ARGN})
  set_target_properties(${name} PROPERTIES
    CUDA_ARCHITECTURES "${ASYNCINFER_CUDA_ARCHITECTURES}"
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Shared
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/include
                                             ${PROJECT_SOURCE_DIR}/src)
  target_compile_definitions(${name} PRIVATE ASYNCINFER_HAVE_CUDA=1)
  target_link_libraries(${name} PRIVATE CUDA::cudart asyncinfer_compile_options)
endfunction()

# The Python module: pybind11 (Debian: pybind11-dev), the interpreter's headers (python3-dev) and
# the DLPack header (libdlpack-dev). Debian's /usr/bin/python3 is preferred over another python3
# on the PATH, since the module must match the interpreter that has Debian's numpy and torch.
set(ASYNCINFER_HAVE_PYTHON OFF)
if(ASYNCINFER_WITH_PYTHON)
  option(ASYNCINFER_PYTHON_WITH_SANITIZERS
         "Build the python module under ASYNCINFER_SANITIZE too (manual checks: run python with LD_PRELOAD of the sanitizer runtime; see docs/python.md)"
         OFF)
  if(ASYNCINFER_SANITIZE AND NOT ASYNCINFER_PYTHON_WITH_SANITIZERS)
    message(STATUS "asyncinfer: python module off under sanitizers (the interpreter is uninstrumented)")
  else()
    if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
      set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the module is built for")
    endif()
    find_package(Python 3.8 QUIET COMPONENTS Interpreter Development.Module)
    if(Python_FOUND)
      set(PYBIND11_FINDPYTHON ON)
      find_package(pybind11 2.10 CONFIG QUIET)
    endif()
    find_path(ASYNCINFER_DLPACK_INCLUDE_DIR dlpack/dlpack.h)
    if(NOT Python_FOUND)
      message(STATUS "asyncinfer: Python headers not found (Debian: python3-dev); python module off")
    elseif(NOT pybind11_FOUND)
      message(STATUS "asyncinfer: pybind11 not found (Debian: pybind11-dev); python module off")
    elseif(NOT ASYNCINFER_DLPACK_INCLUDE_DIR)
      message(STATUS "asyncinfer: dlpack/dlpack.h not found (Debian: libdlpack-dev); python module off")
    else()
      set(ASYNCINFER_HAVE_PYTHON ON)
    endif()
  endif()
endif()
