// The schedules dtrain ships, one file each; schedule.cc registers them. A new schedule is one file
// that returns its ScheduleInfo, plus a line here and in schedule.cc's registry.
#pragma once

#include "dtrain/pipeline/schedule.h"

namespace dtrain::pipeline {

ScheduleInfo gpipe_schedule();             // gpipe.cc
ScheduleInfo one_f_one_b_schedule();       // one_f_one_b.cc
ScheduleInfo interleaved_1f1b_schedule();  // interleaved_1f1b.cc
ScheduleInfo zb_h1_schedule();             // zb_h1.cc

// `s` with the sends and receives placed around its passes (what make_schedule returns).
Schedule with_communication(Schedule s);

// The 1F1B order of F and B passes of stage `rank` (one stage per rank), which zb-h1 refines.
std::vector<Action> one_f_one_b_order(int ranks, int rank, int microbatches, Op backward);

}  // namespace dtrain::pipeline
