#include "comm/p2p_work.h"

namespace dtrain::comm {

bool PairWork::is_completed() {
  auto& r = *request_;
  if (r.completion.done()) return true;
  r.pair->try_progress();
  if (!r.completion.done() && r.deadline.expired()) {
    try {
      r.pair->wait(r, r.deadline);  // cancels it with the timeout error; exception() has it
    } catch (const std::exception&) {
    }
  }
  return r.completion.done();
}

void PairWork::wait(std::optional<std::chrono::milliseconds> timeout) {
  auto& r = *request_;
  r.pair->wait(r, timeout ? Deadline::after(*timeout) : r.deadline);
}

}  // namespace dtrain::comm
