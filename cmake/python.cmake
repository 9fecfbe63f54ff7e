# The Python package `dtrain` (python/dtrain) and its extensions:
#   dtrain._core  (src/python/core): process groups on NumPy arrays and the parameter-server
#                 client, for Python without torch; needs python3-dev and numpy.
#   dtrain._torch (src/python/torch): the torch.distributed backend "dtrain" and the session under
#                 the Horovod-compatible API; needs the environment's torch (cmake/python_env.cmake).
# The package is assembled in build/python (PYTHONPATH=build/python for the tests). Installed by
# `pip install .` (pyproject.toml, scikit-build-core) into the environment pip runs in, or by
# `cmake --install` into the site-packages of the interpreter the build is for (the virtual
# environment of scripts/install-deps.sh). DTRAIN_PYTHON=OFF skips it all.
option(DTRAIN_PYTHON "Build the Python package" ON)
if(NOT DTRAIN_PYTHON)
  return()
endif()

if(NOT Python3_Development.Module_FOUND OR NOT DTRAIN_PYBIND11_INCLUDE_DIR)
  message(STATUS "Python package skipped: needs an interpreter with its headers (python3-dev) and "
                 "pybind11 (torch's, or pybind11-dev) (found: python ${Python3_EXECUTABLE}, "
                 "pybind11 '${DTRAIN_PYBIND11_INCLUDE_DIR}')")
  return()
endif()
message(STATUS "Python package: ${Python3_EXECUTABLE} (${Python3_VERSION}), pybind11 in ${DTRAIN_PYBIND11_INCLUDE_DIR}")
set(DTRAIN_PYTHON_DIR ${CMAKE_BINARY_DIR}/python)
if(SKBUILD)
  set(_site ".")  # the wheel's root: scikit-build-core installs it into site-packages
else()
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import sysconfig; print(sysconfig.get_paths()['platlib'])"
                  OUTPUT_VARIABLE _site OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
set(DTRAIN_PYTHON_INSTALL_DIR "${_site}" CACHE STRING
    "where `cmake --install` puts the dtrain package (the interpreter's site-packages)")

# An extension module of the package, built with the pybind11 chosen above.
function(dtrain_python_module target name)
  Python3_add_library(${target} MODULE WITH_SOABI ${ARGN})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${name}
    LIBRARY_OUTPUT_DIRECTORY ${DTRAIN_PYTHON_DIR}/dtrain
    CXX_VISIBILITY_PRESET hidden)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(${target} SYSTEM PRIVATE ${DTRAIN_PYBIND11_INCLUDE_DIR})
  if(TARGET dtrain_torch_env)  # torch's include folder (pybind11's) also holds a fmt
    target_link_libraries(${target} PRIVATE dtrain_torch_env)
  endif()
  add_dependencies(${target} dtrain_python_files)
  install(TARGETS ${target} LIBRARY DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}/dtrain
          COMPONENT python)
endfunction()

# The pure-Python files, copied beside the extensions at every build (a copy, not a link, so that
# build/python is what gets installed), with the type information: py.typed and the stubs of the
# extensions (*.pyi, PEP 561), which type checkers read in place of the compiled modules.
file(GLOB_RECURSE _dtrain_py CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/dtrain/*.py
     ${PROJECT_SOURCE_DIR}/python/dtrain/*.pyi ${PROJECT_SOURCE_DIR}/python/dtrain/py.typed)
add_custom_target(dtrain_python_files ALL
  COMMAND ${CMAKE_COMMAND} -E copy_directory ${PROJECT_SOURCE_DIR}/python/dtrain ${DTRAIN_PYTHON_DIR}/dtrain
  DEPENDS ${_dtrain_py}
  COMMENT "Copying the dtrain Python package to ${DTRAIN_PYTHON_DIR}")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/dtrain DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}
        COMPONENT python FILES_MATCHING PATTERN "*.py" PATTERN "*.pyi" PATTERN "py.typed")

# What the package was built for: dtrain.torch compares it with the torch and Python it meets.
if(DTRAIN_HAVE_CUDA)
  set(DTRAIN_PYTHON_CUDA True)
else()
  set(DTRAIN_PYTHON_CUDA False)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/build_info.py.in
               ${DTRAIN_PYTHON_DIR}/dtrain/_build_info.py @ONLY)
install(FILES ${DTRAIN_PYTHON_DIR}/dtrain/_build_info.py
        DESTINATION ${DTRAIN_PYTHON_INSTALL_DIR}/dtrain COMPONENT python)

if(SKBUILD)
  # pip installs the `dtrain` command (run, bench, store ...) into the environment's bin/.
  install(TARGETS dtrain RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT python)
  # Beside it, as CMake's install puts them: PREFIX/share/dtrain, found from PREFIX/bin/dtrain
  # (`dtrain docs`, `dtrain sched-sim`).
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/
          DESTINATION ${SKBUILD_DATA_DIR}/share/dtrain/docs COMPONENT python)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/pollux/
          DESTINATION ${SKBUILD_DATA_DIR}/share/dtrain/pollux COMPONENT python)
endif()

dtrain_python_module(dtrain_python_core _core
  src/python/core/module.cc
  src/python/core/array.cc
  src/python/core/process_group_bindings.cc
  src/python/core/flight_bindings.cc
  src/python/core/live_bindings.cc
  src/python/core/ps_bindings.cc
  src/python/core/data_bindings.cc
  src/python/core/pipeline_bindings.cc
  src/python/interrupt.cc
  src/python/python_site.cc)
target_link_libraries(dtrain_python_core PRIVATE dtrain_core dtrain_ps dtrain_data dtrain_pipeline fmt::fmt)
# What `pip install .` builds (pyproject.toml): the package's extensions and the `dtrain` command.
add_custom_target(dtrain_python_package)
add_dependencies(dtrain_python_package dtrain_python_core dtrain)

if(NOT TARGET dtrain_torch)
  message(STATUS "dtrain._torch skipped: LibTorch not found")
  return()
endif()
# torch's Python bindings (the casters of Tensor, Store, Backend) live in libtorch_python, which
# TORCH_LIBRARIES does not name.
find_library(TORCH_PYTHON_LIBRARY torch_python PATHS ${DTRAIN_TORCH_LIB_DIR} NO_DEFAULT_PATH REQUIRED)

dtrain_python_module(dtrain_python_torch _torch
  src/python/torch/module.cc
  src/python/torch/c10d_backend.cc
  src/python/torch/c10d_work.cc
  src/python/torch/c10d_store.cc
  src/python/torch/session.cc
  src/python/torch/checkpoint_bindings.cc
  src/python/interrupt.cc
  src/python/python_site.cc)
if(SKBUILD)
  # In a wheel, torch sits beside dtrain in site-packages.
  set_target_properties(dtrain_python_torch PROPERTIES INSTALL_RPATH "$ORIGIN/../torch/lib")
else()
  set_target_properties(dtrain_python_torch PROPERTIES INSTALL_RPATH "${DTRAIN_TORCH_LIB_DIR}")
endif()
# The version of torch the module is built for: dtrain.torch refuses another at import.
target_compile_definitions(dtrain_python_torch PRIVATE DTRAIN_TORCH_BUILT_FOR="${DTRAIN_TORCH_VERSION}")
target_link_libraries(dtrain_python_torch PRIVATE
  dtrain_torch_objects dtrain_core dtrain_ps ${TORCH_LIBRARIES} ${TORCH_PYTHON_LIBRARY} fmt::fmt)
add_dependencies(dtrain_python_package dtrain_python_torch)
# CUDA tensors (a CUDA build of torch) staged through pinned host memory, as from C++, and
# DTRAIN_BACKEND=nccl: CUDA tensors through NCCL, host ones through a native group beside it.
# Each library registers itself, so it is linked whole; the nccl backend brings dtrain_cuda.
# Its libnccl is the one torch's wheel brings (src/backends/CMakeLists.txt looks there first),
# loaded by torch before dtrain. Not mpi: a wheel would then need OpenMPI on every machine.
if(TARGET dtrain_backend_nccl)
  target_link_libraries(dtrain_python_torch PRIVATE
    "$<LINK_LIBRARY:WHOLE_ARCHIVE,dtrain_backend_nccl>")
elseif(TARGET dtrain_cuda)
  target_link_libraries(dtrain_python_torch PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,dtrain_cuda>")
endif()
