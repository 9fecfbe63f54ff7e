# The Python environment dtrain builds for, and the torch installed in it.
#
# One LibTorch: the one inside the torch wheel of that environment. The C++ layer (src/torch, the
# examples, the tools that link LibTorch) and the Python extension both build against it, so a
# program and a script of the same job run the same torch.
#
# The interpreter: Python3_EXECUTABLE when given (scikit-build-core gives it for `pip install .`),
# else the virtual environment scripts/install-deps.sh makes (DTRAIN_VENV, /opt/dtrain/venv), else
# the python3 CMake finds. The python3 first on PATH may be another interpreter without torch.
#
# Sets: Python3_* (Interpreter, Development.Module), DTRAIN_TORCH_VERSION ("" without torch),
# DTRAIN_TORCH_DIR (site-packages/torch), DTRAIN_TORCH_LIB_DIR, DTRAIN_PYBIND11_INCLUDE_DIR.

set(DTRAIN_VENV "/opt/dtrain/venv" CACHE PATH "the Python environment scripts/install-deps.sh makes")
if(NOT Python3_EXECUTABLE AND Python_EXECUTABLE)
  set(Python3_EXECUTABLE "${Python_EXECUTABLE}")
endif()
if(NOT Python3_EXECUTABLE AND EXISTS "${DTRAIN_VENV}/bin/python")
  set(Python3_EXECUTABLE "${DTRAIN_VENV}/bin/python")
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)

# The range this code is written and tested for (python/dtrain/torch/_version.py says the same
# to a user at import).
set(DTRAIN_TORCH_MIN "2.11")
set(DTRAIN_TORCH_BELOW "2.16")

set(DTRAIN_TORCH_VERSION "")
set(DTRAIN_TORCH_DIR "")
# -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON builds without torch (scripts/fuzz.sh's clang build).
if(Python3_Interpreter_FOUND AND NOT CMAKE_DISABLE_FIND_PACKAGE_Torch)
  # PYTHONPATH unset: under `pip install .` with build isolation, pip points it at the isolated
  # build environment, which hides the torch installed in the environment being built for.
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH ${Python3_EXECUTABLE} -c
      "import os, torch, torch.utils; print(torch.__version__.split('+')[0]); print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.utils.cmake_prefix_path)"
    RESULT_VARIABLE _torch_rc OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _torch_out "${_torch_out}")
    list(GET _torch_out 0 DTRAIN_TORCH_VERSION)
    list(GET _torch_out 1 DTRAIN_TORCH_DIR)
    list(GET _torch_out 2 DTRAIN_TORCH_CXX11_ABI)
    list(GET _torch_out 3 DTRAIN_TORCH_CMAKE_PREFIX)
    set(DTRAIN_TORCH_LIB_DIR "${DTRAIN_TORCH_DIR}/lib")
    if(DTRAIN_TORCH_VERSION VERSION_LESS DTRAIN_TORCH_MIN OR
       NOT DTRAIN_TORCH_VERSION VERSION_LESS DTRAIN_TORCH_BELOW)
      message(WARNING "torch ${DTRAIN_TORCH_VERSION} in ${Python3_EXECUTABLE} is outside the range "
                      "dtrain supports (${DTRAIN_TORCH_MIN} <= torch < ${DTRAIN_TORCH_BELOW}): "
                      "building without torch. Install a supported torch into that environment "
                      "(scripts/install-deps.sh, or pip install 'torch==2.15.*').")
      set(DTRAIN_TORCH_VERSION "")
    else()
      list(PREPEND CMAKE_PREFIX_PATH "${DTRAIN_TORCH_CMAKE_PREFIX}")
      message(STATUS "torch ${DTRAIN_TORCH_VERSION} (${DTRAIN_TORCH_DIR}), C++11 ABI ${DTRAIN_TORCH_CXX11_ABI}")
    endif()
  else()
    string(REGEX REPLACE "\n$" "" _torch_err "${_torch_err}")
    string(REGEX MATCH "[^\n]*$" _torch_err "${_torch_err}")
    message(STATUS "No torch in ${Python3_EXECUTABLE} (${_torch_err}): dtrain_torch, the examples "
                   "that train and dtrain.torch are skipped; scripts/install-deps.sh installs it")
  endif()
endif()

# pybind11: torch's own copy when there is a torch (an extension that passes torch's objects must
# be built with the pybind11 torch was), else Debian's pybind11-dev.
set(DTRAIN_PYBIND11_INCLUDE_DIR "")
if(DTRAIN_TORCH_VERSION AND EXISTS "${DTRAIN_TORCH_DIR}/include/pybind11/pybind11.h")
  set(DTRAIN_PYBIND11_INCLUDE_DIR "${DTRAIN_TORCH_DIR}/include")
else()
  find_package(pybind11 CONFIG QUIET)
  if(pybind11_FOUND)
    set(DTRAIN_PYBIND11_INCLUDE_DIR "${pybind11_INCLUDE_DIRS}")
  endif()
endif()

# TensorFlow (optional: `pip install .[tensorflow]`, scripts/install-deps.sh --tensorflow): its
# version, headers, framework library and C++ ABI, for dtrain._tensorflow (cmake/tensorflow.cmake).
# Its ops are compiled against that TensorFlow's headers, so the module loads under that release
# only; python/dtrain/tensorflow/__init__.py says so to a user with another.
set(DTRAIN_TENSORFLOW_MIN "2.21")
set(DTRAIN_TENSORFLOW_BELOW "2.22")
set(DTRAIN_TENSORFLOW_VERSION "")
if(Python3_Interpreter_FOUND AND NOT CMAKE_DISABLE_FIND_PACKAGE_TensorFlow)
  execute_process(
    COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH TF_CPP_MIN_LOG_LEVEL=3 ${Python3_EXECUTABLE} -c
      "import tensorflow as tf; s = tf.sysconfig; print(tf.__version__); print(s.get_include()); print(s.get_lib()); print(s.CXX11_ABI_FLAG)"
    RESULT_VARIABLE _tf_rc OUTPUT_VARIABLE _tf_out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_tf_rc EQUAL 0)
    string(REPLACE "\n" ";" _tf_out "${_tf_out}")
    list(GET _tf_out 0 _tf_version)
    list(GET _tf_out 1 DTRAIN_TENSORFLOW_INCLUDE_DIR)
    list(GET _tf_out 2 DTRAIN_TENSORFLOW_LIB_DIR)
    list(GET _tf_out 3 DTRAIN_TENSORFLOW_CXX11_ABI)
    if(_tf_version VERSION_LESS DTRAIN_TENSORFLOW_MIN OR
       NOT _tf_version VERSION_LESS DTRAIN_TENSORFLOW_BELOW)
      message(WARNING "TensorFlow ${_tf_version} in ${Python3_EXECUTABLE} is outside the range "
                      "dtrain supports (${DTRAIN_TENSORFLOW_MIN} <= tensorflow < "
                      "${DTRAIN_TENSORFLOW_BELOW}): building without dtrain.tensorflow. Install "
                      "a supported one (pip install 'tensorflow-cpu==2.21.*').")
    elseif(NOT DTRAIN_TENSORFLOW_CXX11_ABI EQUAL 1)
      message(WARNING "TensorFlow ${_tf_version} is built with the pre-C++11 ABI of libstdc++, "
                      "which dtrain is not: building without dtrain.tensorflow")
    else()
      set(DTRAIN_TENSORFLOW_VERSION "${_tf_version}")
      message(STATUS "TensorFlow ${DTRAIN_TENSORFLOW_VERSION} (${DTRAIN_TENSORFLOW_LIB_DIR})")
    endif()
  else()
    message(STATUS "No TensorFlow in ${Python3_EXECUTABLE}: dtrain.tensorflow is skipped "
                   "(scripts/install-deps.sh --tensorflow installs it)")
  endif()
endif()
