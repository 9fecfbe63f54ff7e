// The time the process spends in Work::wait (communication_wait_time(), dtrain/work.h) counts
// the waits of the threads that compute. A thread that runs collectives in the background (a
// group's executor) waits while the others compute: its waits are not a step's communication.
#pragma once

namespace dtrain::comm {

// From now on, this thread's waits are not counted.
void exclude_thread_from_wait_time();

}  // namespace dtrain::comm
