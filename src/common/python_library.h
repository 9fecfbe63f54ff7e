// Whether a Python source file is library code (dtrain's package, torch, the standard library,
// anything installed) rather than the program's own: the frame that names where a program is, or
// who called, is the innermost of the program's own. Used on faulthandler's text (the doctor)
// and on live frames (python/python_site.h).
#pragma once

#include <string_view>

namespace dtrain {

inline bool is_python_library_file(std::string_view path) {
  for (std::string_view part : {"/dtrain/torch/", "/dtrain/tensorflow/", "/dtrain/__init__.py",
                                "/site-packages/", "/dist-packages/", "/lib/python3."})
    if (path.find(part) != std::string_view::npos) return true;
  return false;
}

}  // namespace dtrain
