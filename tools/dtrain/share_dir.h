// What dtrain installs beside its command: PREFIX/share/dtrain/<what> (docs, Pollux's traces), for
// the `dtrain` in PREFIX/bin that CMake's install and pip's wheel both put there.
#pragma once

#include <string>
#include <string_view>

namespace dtrain::tools {

// PREFIX/share/dtrain/<what> when the running `dtrain` has it beside itself (holding `marker`),
// else `source` (the source tree's copy, for a `dtrain` run from its build tree).
std::string share_dir(std::string_view what, std::string_view marker, const std::string& source);

}  // namespace dtrain::tools
