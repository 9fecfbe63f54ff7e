// Pictures of a verified schedule's timeline: text for a terminal, SVG, and Chrome's trace format
// (chrome://tracing, Perfetto). `dtrain pipeline-plan` prints them.
#pragma once

#include <string>

#include "dtrain/pipeline/schedule.h"
#include "dtrain/pipeline/verifier.h"

namespace dtrain::pipeline {

// One row per rank, one column per time unit (the cheapest pass), passes labelled F3, B3, W3
// (with the stage, F3:5, when ranks hold several) and continued with dashes where they last
// longer ("B3 --"), idle units as '.'.
std::string text_chart(const Schedule& schedule, const ScheduleReport& report);
std::string svg_chart(const Schedule& schedule, const ScheduleReport& report);
// Each pass a complete event ("ph": "X"), one thread per rank; one time unit is 1 ms.
std::string chrome_trace(const Schedule& schedule, const ScheduleReport& report);

// "F3", "B3", "W3", with ":stage" when the schedule is interleaved; "" for sends and receives.
std::string label(const Schedule& schedule, const Action& action);

}  // namespace dtrain::pipeline
