# dtrain for your own programs: `cmake --install build [--prefix P]` puts the headers, the tool,
# two shared libraries and a CMake package (find_package(dtrain): dtrain::core, dtrain::torch)
# plus dtrain.pc for pkg-config under the prefix. In a tree that adds dtrain with
# add_subdirectory, the same two targets exist under the same names.
#
# Shared, not static: each backend registers itself with a static initializer that nothing
# references by name, which a static link would drop unless told to keep the whole archive. A
# shared library keeps every object it is made of, so linking dtrain::core is all a program does.
# The in-tree tools and tests keep linking the static libraries the objects come from.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
find_package(ZLIB REQUIRED)  # the parameter server's and the data layer's checksums, gzip

set(_core_objects)
foreach(layer ${DTRAIN_CORE_LAYERS})
  list(APPEND _core_objects $<TARGET_OBJECTS:${layer}>)
endforeach()
list(APPEND _core_objects $<TARGET_OBJECTS:dtrain_ps> $<TARGET_OBJECTS:dtrain_data>
                  $<TARGET_OBJECTS:dtrain_pipeline> $<TARGET_OBJECTS:dtrain_sharding>
                  $<TARGET_OBJECTS:dtrain_horovod>)
foreach(backend dtrain_gloo dtrain_backend_gloo dtrain_backend_mpi dtrain_cuda dtrain_backend_nccl)
  if(TARGET ${backend})
    list(APPEND _core_objects $<TARGET_OBJECTS:${backend}>)
  endif()
endforeach()

add_library(dtrain_core_shared SHARED ${_core_objects})
add_library(dtrain::core ALIAS dtrain_core_shared)
set_target_properties(dtrain_core_shared PROPERTIES
  OUTPUT_NAME dtrain_core EXPORT_NAME core
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  INSTALL_RPATH_USE_LINK_PATH ON)  # libcudart and NCCL live outside the loader's path
target_include_directories(dtrain_core_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(dtrain_core_shared PUBLIC cxx_std_20)
target_link_libraries(dtrain_core_shared
  PUBLIC Threads::Threads
  PRIVATE fmt::fmt spdlog::spdlog nlohmann_json::nlohmann_json OpenSSL::Crypto ZLIB::ZLIB)
if(TARGET dtrain_gloo)
  target_link_libraries(dtrain_core_shared PRIVATE ${GLOO_LIBRARY})
endif()
if(TARGET dtrain_backend_mpi)
  find_package(MPI COMPONENTS CXX QUIET)  # its imported targets are local to src/backends
  target_link_libraries(dtrain_core_shared PRIVATE MPI::MPI_CXX)
endif()
if(TARGET dtrain_cuda)
  target_link_libraries(dtrain_core_shared PRIVATE CUDA::cudart)
endif()
if(TARGET dtrain_backend_nccl)
  target_link_libraries(dtrain_core_shared PRIVATE ${NCCL_LIBRARY})
endif()
set(_exported dtrain_core_shared)

if(TARGET dtrain_torch)
  # runtime.cc's static initializer gives every program linked with it the fast defaults
  # (threads per local rank, OpenBLAS threads, jemalloc keeping its pages). jemalloc is linked
  # PUBLIC so that the program itself depends on it: a malloc found first, before glibc's.
  add_library(dtrain_torch_shared SHARED
    $<TARGET_OBJECTS:dtrain_torch_objects> $<TARGET_OBJECTS:dtrain_torch>)
  set_target_properties(dtrain_torch_shared PROPERTIES
    OUTPUT_NAME dtrain_torch EXPORT_NAME torch_library
    VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
    INSTALL_RPATH_USE_LINK_PATH ON)
  target_link_libraries(dtrain_torch_shared
    PUBLIC dtrain_core_shared ${TORCH_LIBRARIES}
    PRIVATE ZLIB::ZLIB fmt::fmt spdlog::spdlog ${CMAKE_DL_LIBS})
  # dtrain::torch: the library and jemalloc, kept even by linkers that drop what a program does
  # not call (Debian's gcc links --as-needed): the defaults run from a static initializer that
  # nothing calls, and malloc is the first a program finds only if jemalloc is a dependency of
  # the program itself. LibTorch's own CMake package keeps libtorch_cpu the same way.
  add_library(dtrain_torch_interface INTERFACE)
  add_library(dtrain::torch ALIAS dtrain_torch_interface)
  set_target_properties(dtrain_torch_interface PROPERTIES EXPORT_NAME torch)
  target_link_libraries(dtrain_torch_interface INTERFACE -Wl,--no-as-needed dtrain_torch_shared)
  if(JEMALLOC_LIBRARY)  # one item: LibTorch's own items switch --as-needed back on before it
    target_link_libraries(dtrain_torch_interface INTERFACE "-Wl,--no-as-needed,${JEMALLOC_LIBRARY}")
  endif()
  target_link_libraries(dtrain_torch_interface INTERFACE -Wl,--as-needed)
  # libstdc++ before LibTorch, the torch wheel's NCCL and CUDA runtime first (torch.cmake).
  target_link_options(dtrain_torch_shared PRIVATE ${DTRAIN_TORCH_LINK_OPTIONS})
  target_link_options(dtrain_torch_interface INTERFACE ${DTRAIN_TORCH_LINK_OPTIONS})
  list(APPEND _exported dtrain_torch_shared dtrain_torch_interface)
endif()

install(TARGETS ${_exported} EXPORT dtrainTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS dtrain RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Pollux's cluster traces, read by `dtrain sched-sim` (data/pollux/README.md).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/data/pollux/ DESTINATION ${CMAKE_INSTALL_DATADIR}/dtrain/pollux)
# The documentation, read by `dtrain docs` (and pointed at by every command's --help).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/dtrain/docs)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)

set(DTRAIN_WITH_TORCH OFF)
if(TARGET dtrain_torch)
  set(DTRAIN_WITH_TORCH ON)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/dtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dtrainConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtrainConfig.cmake ${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)

# pkg-config: dtrain::core (LibTorch programs are best built with CMake, which knows its flags).
configure_file(${PROJECT_SOURCE_DIR}/cmake/dtrain.pc.in ${PROJECT_BINARY_DIR}/dtrain.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/dtrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
