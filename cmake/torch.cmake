# dtrain_torch: everything that includes LibTorch (DDP, the distributed optimizer, the sampler,
# Fashion-MNIST, safetensors, the timeline, checkpoints), the train_fashion_mnist example, and (from
# tests/torch) their tests. Built only when the Python environment holds a supported torch
# (cmake/python_env.cmake): its LibTorch is the one every target links.
#
# One LibTorch translation unit takes half a minute to compile, so the torch code is kept in few
# files; files that need no LibTorch header (coordinator, timeline) compile in a second.

if(NOT DTRAIN_TORCH_VERSION)
  return()
endif()
# A CUDA wheel's TorchConfig looks for a CUDA toolkit (it links torch's CUDA libraries); the one
# in /usr/local/cuda serves for compiling and linking, without a GPU.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
# dtrain compiles no CUDA code: naming the architecture keeps that config from compiling a probe
# for the GPUs present (in the C++ dialect of this project, which CMake 3.25 cannot give nvcc).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "9.0")
endif()
set(CMAKE_CUDA_STANDARD 17)
find_package(Torch REQUIRED)
message(STATUS "LibTorch: ${TORCH_INSTALL_PREFIX}")
# torch's package gives caffe2::mkl link folders under MKL_ROOT even where it found no MKL
# (pytorch/pytorch#73008): /lib/intel64 and Windows folders would land on every program's
# run-time path. Only folders that exist are kept.
if(TARGET caffe2::mkl)
  get_target_property(_mkl_dirs caffe2::mkl INTERFACE_LINK_DIRECTORIES)
  set(_mkl_kept)
  foreach(_dir IN LISTS _mkl_dirs)
    if(IS_DIRECTORY "${_dir}")
      list(APPEND _mkl_kept "${_dir}")
    endif()
  endforeach()
  set_property(TARGET caffe2::mkl PROPERTY INTERFACE_LINK_DIRECTORIES "${_mkl_kept}")
endif()
# torch's include folder carries its own fmt (a newer one than Debian's spdlog is built with),
# searched before /usr/include: Debian's fmt and spdlog, through links in a folder given with -I
# (searched before every -isystem folder), win for every target that includes torch's headers.
set(_system_headers ${CMAKE_BINARY_DIR}/system_headers)
file(MAKE_DIRECTORY ${_system_headers})
foreach(_header fmt/format.h spdlog/spdlog.h)
  get_filename_component(_lib ${_header} DIRECTORY)
  find_path(_dir_${_lib} ${_header} NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
  if(_dir_${_lib} AND NOT EXISTS ${_system_headers}/${_lib})
    file(CREATE_LINK ${_dir_${_lib}}/${_lib} ${_system_headers}/${_lib} SYMBOLIC)
  endif()
endforeach()
# dtrain_torch_env: what every target built against the environment's torch needs.
add_library(dtrain_torch_env INTERFACE)
target_include_directories(dtrain_torch_env INTERFACE $<BUILD_INTERFACE:${_system_headers}>)
# A CUDA wheel's libraries need the NCCL and CUDA runtime of PyPI's nvidia-* packages beside
# torch, which they find at run time by their own RUNPATH; the linker, checking their symbols,
# must look there, before any older copies of a toolkit on the rpath (src/backends points this
# build's CUDA::cudart there; cmake/install.cmake gives dtrain::torch's users the same option).
# PyPI's LibTorch exports private copies of libstdc++'s std::filesystem (libtorch_cpu.so; in 2.11
# libtorch.so too, whose remove_all jumps to address 0). The loader binds a program's or module's
# references to the first of its dependencies that defines them, so libstdc++ goes first.
set(DTRAIN_TORCH_LINK_OPTIONS "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
file(GLOB _nvidia_lib_dirs LIST_DIRECTORIES true "${DTRAIN_TORCH_DIR}/../nvidia/*/lib")
if(_nvidia_lib_dirs)
  list(JOIN _nvidia_lib_dirs ":" _nvidia_lib_path)
  list(APPEND DTRAIN_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_nvidia_lib_path}")
endif()
target_link_options(dtrain_torch_env INTERFACE ${DTRAIN_TORCH_LINK_OPTIONS})
# Programs find LibTorch where the wheel keeps it, built or installed.
list(APPEND CMAKE_BUILD_RPATH "${DTRAIN_TORCH_LIB_DIR}")
list(APPEND CMAKE_INSTALL_RPATH "${DTRAIN_TORCH_LIB_DIR}")

find_package(ZLIB REQUIRED)

# Everything but the allocator (runtime.cc and jemalloc, below) is an object library that the
# Python module dtrain._torch (cmake/python.cmake) links as well: jemalloc has no place in a module
# loaded by dlopen into a running interpreter.
add_library(dtrain_torch_objects OBJECT
  src/torch/distributed_sampler.cc
  src/torch/fashion_mnist.cc
  src/torch/safetensors.cc
  src/torch/broadcast.cc
  src/torch/comm_hook.cc
  src/torch/reducer.cc
  src/torch/distributed_data_parallel.cc
  src/torch/gradient_hooks.cc
  src/torch/distributed_optimizer.cc
  src/torch/parameter_server.cc
  src/torch/checkpoint_files.cc
  src/torch/optimizer_state.cc
  src/torch/checkpoint.cc
  src/torch/commit.cc
  src/torch/pipeline.cc
  src/torch/pipeline_checkpoint.cc
  src/torch/sharded_data_parallel.cc
  src/torch/shard_pieces.cc
  src/torch/sharded_checkpoint.cc
  src/torch/sharded_snapshot.cc
  src/torch/tensor_parallel.cc
  src/torch/device.cc
)
dtrain_layer(dtrain_torch_objects FOLDERS torch HEADERS torch)
target_link_libraries(dtrain_torch_objects
  PUBLIC dtrain_torch_env dtrain_horovod dtrain_ps dtrain_data dtrain_pipeline dtrain_sharding ${TORCH_LIBRARIES}
  PRIVATE ZLIB::ZLIB fmt::fmt spdlog::spdlog nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})

add_library(dtrain_torch STATIC src/torch/runtime.cc)
target_include_directories(dtrain_torch
  PUBLIC ${PROJECT_SOURCE_DIR}/include
  PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(dtrain_torch
  PUBLIC dtrain_torch_env dtrain_torch_objects dtrain_core dtrain_ps dtrain_data dtrain_pipeline dtrain_sharding
         ${TORCH_LIBRARIES}
  PRIVATE ZLIB::ZLIB fmt::fmt spdlog::spdlog nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})

# The allocator: glibc malloc makes LibTorch return and re-fault its big buffers every step
# (millions of page faults, a third of the throughput). Everything linking dtrain_torch gets
# jemalloc when Debian's libjemalloc-dev is installed; without it runtime.cc tunes glibc with
# mallopt at start-up instead.
find_library(JEMALLOC_LIBRARY NAMES jemalloc)
if(JEMALLOC_LIBRARY)
  message(STATUS "dtrain_torch: linking jemalloc (${JEMALLOC_LIBRARY})")
  target_link_libraries(dtrain_torch PUBLIC ${JEMALLOC_LIBRARY})
  target_compile_definitions(dtrain_torch PRIVATE DTRAIN_HAVE_JEMALLOC=1)
else()
  message(STATUS "dtrain_torch: jemalloc not found (libjemalloc-dev); glibc malloc is tuned with mallopt")
endif()

if(DTRAIN_BUILD_EXAMPLES)  # the main job's trainer
  add_executable(train_fashion_mnist examples/train_fashion_mnist.cc)
  target_link_libraries(train_fashion_mnist PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt nlohmann_json::nlohmann_json)
  # Pipeline parallelism (x data parallelism) on a deep MLP.
  add_executable(train_pipeline examples/train_pipeline.cc)
  target_link_libraries(train_pipeline PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt nlohmann_json::nlohmann_json)
  # Sharded data parallelism (ZeRO 1-3) with checkpoints that reshard.
  add_executable(train_sharded examples/train_sharded.cc)
  target_link_libraries(train_sharded PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt nlohmann_json::nlohmann_json)
endif()

# pipeline_bench: the schedules on stages of calibrated cost, measured against the verifier
# (docs/performance.md, "Pipeline schedules"); run it under `dtrain run -n 4`.
add_executable(pipeline_bench bench/pipeline_bench.cc)
target_link_libraries(pipeline_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt)

# tensor_parallel_bench: transformer blocks on dtrain's tensor-parallel layers, beside torch's
# DTensor (bench/tensor_parallel.sh; docs/performance.md, "Tensor parallelism").
add_executable(tensor_parallel_bench bench/tensor_parallel_bench.cc)
target_link_libraries(tensor_parallel_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt nlohmann_json::nlohmann_json)

# snapshot_bench: a training step's stall for a snapshot of a 100M-parameter transformer
# (docs/performance.md).
add_executable(snapshot_bench bench/snapshot_bench.cc)
target_link_libraries(snapshot_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt)

# transformer_bench: DDP and ZeRO 1-3 on the transformer of bench/transformer_lm.py, in C++
# (bench/transformer.sh puts it beside torch's DDP and FSDP2).
add_executable(transformer_bench bench/transformer_bench.cc)
target_link_libraries(transformer_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt nlohmann_json::nlohmann_json)

# state_handover_bench: a state handed to a newcomer by broadcast or in pieces from every holder
# (docs/fault_tolerance.md, live recovery); run it under `dtrain run -n 4`.
add_executable(state_handover_bench bench/state_handover_bench.cc)
target_link_libraries(state_handover_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt)

# sharded_bench: DDP against ZeRO stages 1-3, throughput and model-state memory
# (docs/performance.md, "Sharded data parallelism"); run it under `dtrain run -n 2`.
add_executable(sharded_bench bench/sharded_bench.cc)
target_link_libraries(sharded_bench PRIVATE dtrain_torch CLI11::CLI11 fmt::fmt)
