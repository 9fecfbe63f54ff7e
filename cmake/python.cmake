# The Python package `dtrain` (python/dtrain) and its extensions:
#   dtrain._core  (src/python/core): process groups on NumPy arrays and the parameter-server
#                 client, for Python without torch; needs python3-dev, pybind11-dev, python3-numpy.
#   dtrain._torch (src/python/torch): the torch.distributed backend "dtrain" and the session under
#                 the Horovod-compatible API; also needs LibTorch and Debian's python3-torch.
# The package is assembled in build/python (PYTHONPATH=build/python for the tests) and installed by
# `cmake --install` into the dist-packages of /usr/bin/python3's version under the prefix, which
# Debian's python3 reads (/usr/local/lib/python3.11/dist-packages by default). DTRAIN_PYTHON=OFF
# skips it all.
option(DTRAIN_PYTHON "Build the Python package" ON)
if(NOT DTRAIN_PYTHON)
  return()
endif()

# Debian's interpreter, the one with torch (the python3 first on PATH may be another).
if(NOT Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3)
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
find_package(pybind11 CONFIG QUIET)
if(NOT Python3_FOUND OR NOT pybind11_FOUND)
  message(STATUS "Python package skipped: needs python3-dev and pybind11-dev (found: python "
                 "${Python3_FOUND}, pybind11 ${pybind11_FOUND})")
  return()
endif()
message(STATUS "Python package: ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 ${pybind11_VERSION}")
set(DTRAIN_PYTHON_DIR ${CMAKE_BINARY_DIR}/python)
set(DTRAIN_PYTHON_INSTALL_DIR
    "lib/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages"
    CACHE STRING "where `cmake --install` puts the dtrain package, under the prefix")

# The pure-Python files, copied beside the extensions at every build (a copy, not a link, so that
# build/python is what gets installed).
file(GLOB_RECURSE _dtrain_py CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/dtrain/*.py)
add_custom_target(dtrain_python_files ALL
  COMMAND ${CMAKE_COMMAND} -E copy_directory ${PROJECT_SOURCE_DIR}/python/dtrain ${DTRAIN_PYTHON_DIR}/dtrain
  DEPENDS ${_dtrain_py}
  COMMENT "Copying the dtrain Python package to ${DTRAIN_PYTHON_DIR}")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/dtrain DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}
        COMPONENT python FILES_MATCHING PATTERN "*.py")

pybind11_add_module(dtrain_python_core MODULE NO_EXTRAS
  src/python/core/module.cc
  src/python/core/array.cc
  src/python/core/process_group_bindings.cc
  src/python/core/ps_bindings.cc
  src/python/core/data_bindings.cc
  src/python/core/pipeline_bindings.cc
  src/python/interrupt.cc)
set_target_properties(dtrain_python_core PROPERTIES
  OUTPUT_NAME _core
  LIBRARY_OUTPUT_DIRECTORY ${DTRAIN_PYTHON_DIR}/dtrain)
target_include_directories(dtrain_python_core PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(dtrain_python_core PRIVATE dtrain_core dtrain_ps dtrain_data dtrain_pipeline fmt::fmt)
add_dependencies(dtrain_python_core dtrain_python_files)
install(TARGETS dtrain_python_core LIBRARY DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}/dtrain
        COMPONENT python)

if(NOT TARGET dtrain_torch)
  message(STATUS "dtrain._torch skipped: LibTorch not found")
  return()
endif()
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS ${TORCH_INSTALL_PREFIX}/lib)
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch"
                RESULT_VARIABLE _torch_py OUTPUT_QUIET ERROR_QUIET)
if(NOT TORCH_PYTHON_LIBRARY OR NOT _torch_py EQUAL 0)
  message(STATUS "dtrain._torch skipped: needs python3-torch and libtorch_python (found: "
                 "${TORCH_PYTHON_LIBRARY})")
  return()
endif()

pybind11_add_module(dtrain_python_torch MODULE NO_EXTRAS
  src/python/torch/module.cc
  src/python/torch/c10d_process_group.cc
  src/python/torch/c10d_work.cc
  src/python/torch/c10d_store.cc
  src/python/torch/session.cc
  src/python/torch/checkpoint_bindings.cc
  src/python/interrupt.cc)
set_target_properties(dtrain_python_torch PROPERTIES
  OUTPUT_NAME _torch
  LIBRARY_OUTPUT_DIRECTORY ${DTRAIN_PYTHON_DIR}/dtrain
  # Installed, it still finds libraries outside the system's paths (CUDA's runtime).
  INSTALL_RPATH_USE_LINK_PATH TRUE)
target_include_directories(dtrain_python_torch PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(dtrain_python_torch PRIVATE
  dtrain_torch_objects dtrain_core dtrain_ps ${TORCH_LIBRARIES} ${TORCH_PYTHON_LIBRARY} fmt::fmt)
if(TARGET dtrain_cuda)
  # CUDA tensors (a CUDA build of torch) staged through pinned host memory, as from C++; the
  # library registers itself, so it is linked whole.
  target_link_libraries(dtrain_python_torch PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,dtrain_cuda>")
endif()
add_dependencies(dtrain_python_torch dtrain_python_files)

install(TARGETS dtrain_python_torch LIBRARY DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}/dtrain
        COMPONENT python)
