# Finds the pinned LibTorch: the one shipped in PyTorch's wheel, installed by scripts/bootstrap
# into a virtual environment outside the work tree. Sets TORCH_LIBRARIES, TORCH_INCLUDE_DIRS,
# TORCH_CXX_FLAGS (as find_package(Torch) does), PIPETRAIN_PYTHON (that venv's interpreter, used by
# every Python part of the project) and PIPETRAIN_HAS_CUDA.
#
#   PIPETRAIN_PYTHON  the interpreter whose torch is used (default: scripts/bootstrap --print-python)
#   PIPETRAIN_CUDA    AUTO (default): build the CUDA paths when torch has CUDA, nvcc is found and
#                     a GPU is visible (nvidia-smi -L lists one); ON: require torch's CUDA and
#                     nvcc (a build for GPUs on a machine without one); OFF: a CPU-only build even
#                     against a CUDA torch. Without the CUDA paths nothing of libtorch_cuda is
#                     linked: each process starts in about 60% of the CPU time (it loads and
#                     initialises torch's CPU libraries only), which the multi-process tests pay
#                     at every rank.
#
# Bad input stops here with one line saying what was found and what to run.

file(READ "${PROJECT_SOURCE_DIR}/scripts/torch-version" PIPETRAIN_TORCH_PIN)
string(STRIP "${PIPETRAIN_TORCH_PIN}" PIPETRAIN_TORCH_PIN)

set(PIPETRAIN_PYTHON "" CACHE FILEPATH
    "Python interpreter of the venv with the pinned torch (default: scripts/bootstrap --print-python)")
if(NOT PIPETRAIN_PYTHON)
  execute_process(COMMAND "${PROJECT_SOURCE_DIR}/scripts/bootstrap" --print-python
                  OUTPUT_VARIABLE default_python OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(PIPETRAIN_PYTHON "${default_python}" CACHE FILEPATH
      "Python interpreter of the venv with the pinned torch (default: scripts/bootstrap --print-python)"
      FORCE)
endif()
if(NOT EXISTS "${PIPETRAIN_PYTHON}")
  message(FATAL_ERROR "pipetrain: no Python interpreter at ${PIPETRAIN_PYTHON}; run scripts/bootstrap "
                      "(installs torch ${PIPETRAIN_TORCH_PIN}) or pass -DPIPETRAIN_PYTHON=/path/to/python")
endif()

execute_process(
  COMMAND "${PIPETRAIN_PYTHON}" -c
          "import torch; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')"
  RESULT_VARIABLE torch_probe_result OUTPUT_VARIABLE torch_probe ERROR_VARIABLE torch_probe_error
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT torch_probe_result EQUAL 0)
  string(REGEX MATCH "[^\n]+\n?$" torch_probe_error "${torch_probe_error}")
  string(STRIP "${torch_probe_error}" torch_probe_error)
  message(FATAL_ERROR "pipetrain: ${PIPETRAIN_PYTHON} cannot import torch (${torch_probe_error}); "
                      "run scripts/bootstrap (installs torch ${PIPETRAIN_TORCH_PIN})")
endif()
string(REPLACE "\n" ";" torch_probe "${torch_probe}")
list(GET torch_probe 0 PIPETRAIN_TORCH_FOUND_VERSION)
list(GET torch_probe 1 torch_prefix_path)
list(LENGTH torch_probe torch_probe_length)
set(PIPETRAIN_TORCH_CUDA_VERSION "")
if(torch_probe_length GREATER 2)
  list(GET torch_probe 2 PIPETRAIN_TORCH_CUDA_VERSION)
endif()
string(REGEX REPLACE "\\+.*$" "" torch_base_version "${PIPETRAIN_TORCH_FOUND_VERSION}")
if(NOT torch_base_version VERSION_EQUAL PIPETRAIN_TORCH_PIN)
  message(FATAL_ERROR "pipetrain: ${PIPETRAIN_PYTHON} has torch ${PIPETRAIN_TORCH_FOUND_VERSION}, this "
                      "project pins ${PIPETRAIN_TORCH_PIN} (scripts/torch-version); run scripts/bootstrap "
                      "and reconfigure with -DPIPETRAIN_PYTHON=$(scripts/bootstrap --print-python)")
endif()

set(PIPETRAIN_CUDA AUTO CACHE STRING "Build the CUDA paths: AUTO (torch has CUDA and nvcc found), ON, OFF")
set_property(CACHE PIPETRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
find_program(PIPETRAIN_NVCC nvcc HINTS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)

if(PIPETRAIN_CUDA STREQUAL "ON")
  if(NOT PIPETRAIN_TORCH_CUDA_VERSION)
    message(FATAL_ERROR "pipetrain: PIPETRAIN_CUDA=ON but torch ${PIPETRAIN_TORCH_FOUND_VERSION} at "
                        "${PIPETRAIN_PYTHON} is a CPU-only build; install the CUDA wheel "
                        "(scripts/bootstrap) or configure with -DPIPETRAIN_CUDA=OFF")
  endif()
  if(NOT PIPETRAIN_NVCC)
    message(FATAL_ERROR "pipetrain: PIPETRAIN_CUDA=ON but no nvcc was found (PATH, CUDA_HOME, "
                        "/usr/local/cuda); install the CUDA ${PIPETRAIN_TORCH_CUDA_VERSION} toolkit "
                        "or configure with -DPIPETRAIN_CUDA=OFF")
  endif()
endif()
set(PIPETRAIN_GPU_VISIBLE OFF)
if(PIPETRAIN_CUDA STREQUAL "AUTO" AND PIPETRAIN_TORCH_CUDA_VERSION AND PIPETRAIN_NVCC)
  execute_process(COMMAND nvidia-smi -L RESULT_VARIABLE smi_result OUTPUT_VARIABLE smi_out
                  ERROR_QUIET TIMEOUT 20)
  if(smi_result EQUAL 0 AND smi_out MATCHES "GPU [0-9]")
    set(PIPETRAIN_GPU_VISIBLE ON)
  endif()
endif()
if(PIPETRAIN_TORCH_CUDA_VERSION AND PIPETRAIN_NVCC
   AND (PIPETRAIN_CUDA STREQUAL "ON" OR PIPETRAIN_GPU_VISIBLE))
  set(PIPETRAIN_HAS_CUDA ON)
else()
  set(PIPETRAIN_HAS_CUDA OFF)
endif()

list(APPEND CMAKE_PREFIX_PATH "${torch_prefix_path}")
get_filename_component(PIPETRAIN_TORCH_ROOT "${torch_prefix_path}/../.." ABSOLUTE)
if(PIPETRAIN_HAS_CUDA)
  # Torch's config finds the toolkit through CUDAToolkit (nvcc's directory) and cuDNN.
  get_filename_component(cuda_bin "${PIPETRAIN_NVCC}" DIRECTORY)
  get_filename_component(CUDAToolkit_ROOT "${cuda_bin}/.." ABSOLUTE)
  set(CMAKE_CUDA_COMPILER "${PIPETRAIN_NVCC}")
  find_package(Torch REQUIRED)
else()
  # A CPU-only build needs no CUDA toolkit: Torch's own config would look for one when the wheel
  # is a CUDA build, so the CPU libraries are named directly. Nothing of libtorch_cuda is linked.
  set(TORCH_INCLUDE_DIRS "${PIPETRAIN_TORCH_ROOT}/include"
                         "${PIPETRAIN_TORCH_ROOT}/include/torch/csrc/api/include")
  set(TORCH_LIBRARIES "")
  foreach(lib torch_cpu c10)
    find_library(PIPETRAIN_TORCH_${lib}_LIBRARY ${lib} PATHS "${PIPETRAIN_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
    if(NOT PIPETRAIN_TORCH_${lib}_LIBRARY)
      message(FATAL_ERROR "pipetrain: lib${lib}.so not found under ${PIPETRAIN_TORCH_ROOT}/lib; run scripts/bootstrap")
    endif()
    list(APPEND TORCH_LIBRARIES "${PIPETRAIN_TORCH_${lib}_LIBRARY}")
  endforeach()
  # What the wheel's torch_cpu target would add: the ABI and the c10d features it was built with
  # (Caffe2Targets.cmake: USE_DISTRIBUTED, USE_C10D_GLOO, ...), which its headers test.
  set(TORCH_CXX_FLAGS
      "-D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DUSE_RPC -DUSE_TENSORPIPE")
endif()
message(STATUS "pipetrain: torch ${PIPETRAIN_TORCH_FOUND_VERSION} from ${PIPETRAIN_PYTHON}, "
               "CUDA paths ${PIPETRAIN_HAS_CUDA} (torch CUDA '${PIPETRAIN_TORCH_CUDA_VERSION}', "
               "nvcc '${PIPETRAIN_NVCC}', GPU visible ${PIPETRAIN_GPU_VISIBLE}, "
               "PIPETRAIN_CUDA ${PIPETRAIN_CUDA})")
