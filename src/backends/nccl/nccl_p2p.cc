#include "backends/nccl/nccl_p2p.h"

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/completion.h"
#include "common/error_message.h"
#include "common/log.h"
#include "dtrain/error.h"

namespace dtrain::backends::nccl {

using namespace std::chrono_literals;

// One send or receive: queued on its channel, then issued on the channel's stream.
class P2pWork : public Work, public std::enable_shared_from_this<P2pWork> {
 public:
  P2pWork(std::weak_ptr<NcclP2p> owner, bool send, const TensorView& tensor, int peer,
          Deadline deadline, std::string what)
      : owner_(std::move(owner)),
        send_(send),
        tensor_(tensor),
        peer_(peer),
        deadline_(deadline),
        what_(std::move(what)) {}

  bool is_completed() override {
    if (auto owner = owner_.lock()) owner->progress();
    return step(deadline_);
  }

  void wait_until_done(std::optional<std::chrono::milliseconds> timeout) override {
    const Deadline limit = timeout ? Deadline::after(*timeout) : deadline_;
    for (int spins = 0; !step(limit); ++spins) {
      if (auto owner = owner_.lock()) owner->progress();
      if (spins < 100)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 20 : 500));
    }
    if (auto e = completion_.error()) std::rethrow_exception(e);
  }

  std::exception_ptr exception() const override { return completion_.error(); }

  // Called by NcclP2p with its lock held.
  void issued(std::shared_ptr<NcclComm> comm, std::shared_ptr<cuda::Event> done) {
    std::lock_guard lock(mu_);
    comm_ = std::move(comm);
    done_ = std::move(done);
  }
  void fail(std::exception_ptr error) { completion_.fail(std::move(error)); }
  void succeed() { completion_.succeed(); }

  bool send() const { return send_; }
  const TensorView& tensor() const { return tensor_; }
  const Deadline& deadline() const { return deadline_; }
  const std::string& what() const { return what_; }

 private:
  // One look; true once complete. At `limit`: a queued operation is dropped, an issued one
  // aborts its channel.
  bool step(const Deadline& limit) {
    std::shared_ptr<NcclComm> comm;
    {
      std::lock_guard lock(mu_);
      if (completion_.done()) return true;
      comm = comm_;
      if (comm) {
        // The channel first: after an abort, its kernels end early and their events complete.
        if (auto cause = comm->check_async(what_)) {
          completion_.fail(failed_because(cause, what_));
          return true;
        }
        try {
          if (done_->done(what_)) {
            completion_.succeed();
            return true;
          }
        } catch (...) {
          comm->abort(std::current_exception());
          completion_.fail(std::current_exception());
          return true;
        }
        if (!limit.expired()) return false;
        auto error = std::make_exception_ptr(TimeoutError(fmt::format(
            "{} did not complete within {}; NCCL cannot cancel it, so this rank aborted its "
            "channel to rank {} ({} this way is unusable from now on): rank {} did not post the "
            "matching {}, or is stuck or dead",
            what_, limit.describe(), peer_, send_ ? "sending" : "receiving", peer_,
            send_ ? "receive" : "send")));
        comm->abort(error);
        completion_.fail(error);
        return true;
      }
      if (!limit.expired()) return false;
    }
    // Still queued at the limit: drop it (outside our lock: NcclP2p's comes first).
    auto error = std::make_exception_ptr(TimeoutError(fmt::format(
        "{} did not start within {}: rank {} has not posted an operation on the channel between "
        "the two ranks (NCCL sets it up when both have); nothing was sent, and the group stays "
        "usable",
        what_, limit.describe(), peer_)));
    auto owner = owner_.lock();
    if (!owner || owner->cancel(this, error)) {
      completion_.fail(error);
      return true;
    }
    return completion_.done();  // issued meanwhile: the next look polls it
  }

  std::weak_ptr<NcclP2p> owner_;
  bool send_;
  TensorView tensor_;
  int peer_;
  Deadline deadline_;
  std::string what_;
  std::mutex mu_;                   // guards comm_, done_
  std::shared_ptr<NcclComm> comm_;  // the channel's, once issued
  std::shared_ptr<cuda::Event> done_;
  Completion completion_;
};

NcclP2p::NcclP2p(std::shared_ptr<Store> store, int rank, int device, std::string group)
    : store_(std::move(store)), rank_(rank), device_(device), group_(std::move(group)) {}

NcclP2p::~NcclP2p() {
  abort(std::make_exception_ptr(
      AbortedError(fmt::format("rank {}: group {} (nccl) was destroyed", rank_, group_))));
}

NcclP2p::Channel& NcclP2p::channel_locked(int peer, bool outgoing) {
  auto [it, fresh] = channels_.try_emplace({peer, outgoing});
  Channel& ch = it->second;
  if (!fresh) return ch;
  ch.peer = peer;
  ch.outgoing = outgoing;
  const int from = outgoing ? rank_ : peer;
  const int to = outgoing ? peer : rank_;
  ch.key = fmt::format("p2p/{}-{}", from, to);
  try {
    cuda::DeviceGuard guard(device_);
    ch.stream = std::make_unique<cuda::Stream>();
    ch.order = std::make_unique<cuda::Event>();
    if (rank_ < peer) {
      // The lower rank creates the channel's id and joins at once; the higher one joins when it
      // finds the id (advance_locked).
      ncclUniqueId id;
      if (const ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess)
        std::rethrow_exception(error_of(rc, fmt::format("rank {}: ncclGetUniqueId", rank_)));
      const auto* b = reinterpret_cast<const uint8_t*>(&id);
      store_->set(ch.key, Bytes(b, b + sizeof(id)));
      ch.comm =
          NcclComm::start(id, channel_rank(peer), 2, device_, fmt::format("{}/{}", group_, ch.key));
    }
  } catch (...) {
    ch.failure = std::current_exception();
  }
  return ch;
}

void NcclP2p::fail_channel_locked(Channel& ch, std::exception_ptr error) {
  if (!ch.failure) ch.failure = error;
  for (auto& w : ch.queued)
    w->fail(std::make_exception_ptr(PeerFailureError(
        fmt::format("{} cannot start: the channel {} rank {} is unusable since: {}", w->what(),
                    ch.outgoing ? "to" : "from", ch.peer, message_of(ch.failure)))));
  ch.queued.clear();
}

void NcclP2p::advance_locked(Channel& ch) {
  if (ch.failure) {
    fail_channel_locked(ch, ch.failure);
    return;
  }
  if (ch.ready && ch.queued.empty()) return;
  try {
    if (!ch.comm) {
      const auto now = Clock::now();
      if (now < ch.next_look) return;
      ch.next_look = now + 2ms;
      if (!store_->check({ch.key})) return;
      const Bytes b = store_->get(ch.key);
      ncclUniqueId id;
      if (b.size() != sizeof(id))
        throw InternalError(
            fmt::format("rank {}: the NCCL id of channel {} of group {} has {} "
                        "bytes, not {}",
                        rank_, ch.key, group_, b.size(), sizeof(id)));
      std::memcpy(&id, b.data(), sizeof(id));
      ch.comm = NcclComm::start(id, channel_rank(ch.peer), 2, device_,
                                fmt::format("{}/{}", group_, ch.key));
    }
    if (!ch.ready) {
      if (!ch.comm->ready(
              fmt::format("rank {}: joining channel {} of group {} (nccl)", rank_, ch.key, group_)))
        return;
      ch.ready = true;
      DTRAIN_LOG_DEBUG("rank {}: nccl channel {} of group {} is up", rank_, ch.key, group_);
    }
    while (!ch.queued.empty()) {
      auto work = std::move(ch.queued.front());
      ch.queued.pop_front();
      try {
        issue_locked(ch, *work);
      } catch (...) {
        work->fail(std::current_exception());
        if (ch.comm->failure()) throw;  // the channel broke: fail the rest too
      }
    }
  } catch (...) {
    fail_channel_locked(ch, std::current_exception());
  }
}

void NcclP2p::issue_locked(Channel& ch, P2pWork& work) {
  const TensorView& t = work.tensor();
  cuda::DeviceGuard guard(device_);
  cudaStream_t stream = ch.stream->get();
  cuda::order_after(stream, t.stream, *ch.order, work.what());
  const int peer = 1 - channel_rank(ch.peer);
  ch.comm->issue(
      [&](ncclComm_t comm) {
        return work.send() ? ncclSend(t.data, t.nbytes(), ncclUint8, peer, comm, stream)
                           : ncclRecv(t.data, t.nbytes(), ncclUint8, peer, comm, stream);
      },
      work.deadline(), work.what());
  if (!events_) events_ = cuda::EventPool::create();  // on device_, current here
  auto done = events_->take();
  done->record(stream, work.what());
  work.issued(ch.comm, std::move(done));
}

std::shared_ptr<Work> NcclP2p::post(bool send, const TensorView& tensor, int peer,
                                    const Deadline& deadline, std::string what) {
  auto work =
      std::make_shared<P2pWork>(weak_from_this(), send, tensor, peer, deadline, std::move(what));
  // Both ends skip an empty message alike: sizes must match.
  if (tensor.nbytes() == 0) {
    work->succeed();
    return work;
  }
  std::lock_guard lock(mu_);
  Channel& ch = channel_locked(peer, send);
  if (ch.failure) {
    work->fail(std::make_exception_ptr(PeerFailureError(
        fmt::format("{} cannot start: the channel {} rank {} is unusable since: {}", work->what(),
                    send ? "to" : "from", peer, message_of(ch.failure)))));
    return work;
  }
  ch.queued.push_back(work);
  advance_locked(ch);
  return work;
}

void NcclP2p::progress() {
  std::lock_guard lock(mu_);
  for (auto& [key, ch] : channels_) advance_locked(ch);
}

bool NcclP2p::cancel(const P2pWork* work, std::exception_ptr error) {
  std::lock_guard lock(mu_);
  for (auto& [key, ch] : channels_)
    for (auto it = ch.queued.begin(); it != ch.queued.end(); ++it)
      if (it->get() == work) {
        (*it)->fail(std::move(error));
        ch.queued.erase(it);
        return true;
      }
  return false;
}

void NcclP2p::abort(std::exception_ptr reason) {
  std::lock_guard lock(mu_);
  for (auto& [key, ch] : channels_) {
    if (ch.comm) ch.comm->abort(reason);
    fail_channel_locked(ch, reason);
  }
}

}  // namespace dtrain::backends::nccl
