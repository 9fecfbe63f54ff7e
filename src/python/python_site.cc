#include "python/python_site.h"

#include <Python.h>
#include <frameobject.h>

#include <array>
#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "common/python_library.h"

namespace dtrain::python {
namespace {

// The innermost program frames of a call: (code object, instruction offset) of each.
using Key = std::array<uintptr_t, 4>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    for (uintptr_t v : k) h = h * 1000003 ^ std::hash<uintptr_t>{}(v);
    return h;
  }
};

// Guarded by the GIL. The code objects named in the keys are kept alive (a reference each, never
// released: one per place in the program that calls dtrain), so that an address names one.
struct Sites {
  std::unordered_map<Key, uint32_t, KeyHash> ids;
  std::unordered_map<PyCodeObject*, bool> library;
};
Sites& sites() {
  static auto* s = new Sites();  // never destroyed: Python may call during its exit
  return *s;
}

std::string utf8(PyObject* s) {
  const char* text = s != nullptr ? PyUnicode_AsUTF8(s) : nullptr;
  if (text == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return text;
}

bool is_library(PyCodeObject* code) {
  auto [it, added] = sites().library.try_emplace(code, false);
  if (added) {
    Py_INCREF(code);
    it->second = is_python_library_file(utf8(code->co_filename));
  }
  return it->second;
}

// "train.py:42 in step"
std::string describe(PyFrameObject* frame, PyCodeObject* code) {
  std::string file = utf8(code->co_filename);
  if (const auto slash = file.rfind('/'); slash != std::string::npos) file.erase(0, slash + 1);
  return fmt::format("{}:{} in {}", file, PyFrame_GetLineNumber(frame), utf8(code->co_name));
}

uint32_t capture() {
  constexpr int kFrames = 2;
  std::array<PyFrameObject*, kFrames> frames{};
  std::array<PyCodeObject*, kFrames> codes{};
  Key key{};
  int found = 0;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr && found < kFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    if (!is_library(code)) {
      frames[found] = frame;
      codes[found] = code;
      key[found * 2] = reinterpret_cast<uintptr_t>(code);
#if PY_VERSION_HEX >= 0x030B0000
      key[found * 2 + 1] = static_cast<uintptr_t>(PyFrame_GetLasti(frame));
#else
      key[found * 2 + 1] = static_cast<uintptr_t>(PyFrame_GetLineNumber(frame));
#endif
      Py_INCREF(frame);
      ++found;
    } else {
      Py_DECREF(code);
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  uint32_t id = 0;
  if (found > 0) {
    auto [it, added] = sites().ids.try_emplace(key, 0);
    if (added) {
      std::string text = describe(frames[0], codes[0]);
      for (int i = 1; i < found; ++i) text += " <- " + describe(frames[i], codes[i]);
      it->second = comm::FlightRecorder::global().python_site(text);
      for (int i = 0; i < found; ++i) Py_INCREF(codes[i]);  // the key's
    }
    id = it->second;
  }
  for (int i = 0; i < found; ++i) {
    Py_DECREF(codes[i]);
    Py_DECREF(frames[i]);
  }
  return id;
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

}  // namespace

uint32_t python_call_site() {
  if (!comm::FlightRecorder::global().enabled() || !Py_IsInitialized() || finalizing() ||
      PyGILState_GetThisThreadState() == nullptr)
    return 0;
  const PyGILState_STATE gil = PyGILState_Ensure();
  const uint32_t id = capture();
  PyGILState_Release(gil);
  return id;
}

}  // namespace dtrain::python
