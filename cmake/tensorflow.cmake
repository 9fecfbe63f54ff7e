# dtrain._tensorflow (src/python/tensorflow): Horovod's TensorFlow API as TensorFlow ops on dtrain's
# coordinator. One file is both the op library (ops.cc, compiled against the environment's
# TensorFlow headers, loaded by tf.load_op_library) and the Python module that opens the session
# (module.cc, pybind11). Built when the Python environment holds a supported TensorFlow
# (cmake/python_env.cmake); nothing else in dtrain needs it.
if(NOT DTRAIN_TENSORFLOW_VERSION OR NOT TARGET dtrain_python_core)
  return()
endif()
find_library(DTRAIN_TENSORFLOW_FRAMEWORK NAMES libtensorflow_framework.so.2
             PATHS ${DTRAIN_TENSORFLOW_LIB_DIR} NO_DEFAULT_PATH REQUIRED)

# The kernels and the session, apart from pybind11's headers: TensorFlow's include folder holds
# its own protobuf, absl and Eigen, and torch's (pybind11's) another protobuf.
add_library(dtrain_tensorflow_ops OBJECT
  src/python/tensorflow/ops.cc
  src/python/tensorflow/session.cc)
target_include_directories(dtrain_tensorflow_ops PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_include_directories(dtrain_tensorflow_ops SYSTEM PRIVATE ${DTRAIN_TENSORFLOW_INCLUDE_DIR})
# TensorFlow's own flags (tf.sysconfig.get_compile_flags()); its headers warn about themselves.
target_compile_definitions(dtrain_tensorflow_ops PRIVATE _GLIBCXX_USE_CXX11_ABI=1
                           EIGEN_MAX_ALIGN_BYTES=64)
target_compile_options(dtrain_tensorflow_ops PRIVATE -Wno-deprecated-declarations)
target_link_libraries(dtrain_tensorflow_ops PRIVATE dtrain_core dtrain_horovod fmt::fmt)

dtrain_python_module(dtrain_python_tensorflow _tensorflow src/python/tensorflow/module.cc)
target_link_libraries(dtrain_python_tensorflow PRIVATE
  dtrain_tensorflow_ops dtrain_horovod dtrain_core fmt::fmt ${DTRAIN_TENSORFLOW_FRAMEWORK})
if(SKBUILD)
  # In a wheel, TensorFlow sits beside dtrain in site-packages.
  set_target_properties(dtrain_python_tensorflow PROPERTIES INSTALL_RPATH "$ORIGIN/../tensorflow")
else()
  set_target_properties(dtrain_python_tensorflow PROPERTIES
    BUILD_RPATH "${DTRAIN_TENSORFLOW_LIB_DIR}" INSTALL_RPATH "${DTRAIN_TENSORFLOW_LIB_DIR}")
endif()
target_compile_definitions(dtrain_python_tensorflow PRIVATE
  DTRAIN_TENSORFLOW_BUILT_FOR="${DTRAIN_TENSORFLOW_VERSION}")
add_dependencies(dtrain_python_package dtrain_python_tensorflow)
