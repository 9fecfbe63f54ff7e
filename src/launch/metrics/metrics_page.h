// The page `dtrain run --metrics-port` serves at /: the job's ranks as a table (what `dtrain top`
// shows), step time over the run as a plot, and each rank's last steps as a timeline of compute
// and communication, redrawn every second from /history.json (run_history.h). One self-contained
// HTML document: no script or style from elsewhere, nothing to install.
#pragma once

#include <string_view>

namespace dtrain::launch {

std::string_view metrics_page();

}  // namespace dtrain::launch
