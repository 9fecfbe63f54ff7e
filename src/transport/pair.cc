#include "transport/pair.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "common/check.h"
#include "common/error_message.h"
#include "common/log.h"
#include "common/reduce.h"
#include "dtrain/error.h"
#include "transport/loop.h"
#include "transport/tag.h"

namespace dtrain::transport {
namespace {

constexpr size_t kMaxIov = 64;
// Where an arriving group-failed notice is kept while its text is read (no data tag is 0).
constexpr uint64_t kControlQueue = 0;

ErrorKind kind_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.kind();
  } catch (...) {
    return ErrorKind::kInternal;
  }
}

}  // namespace

std::string Request::describe() const {
  const bool send = kind == Kind::kSend;
  return fmt::format("{} #{} {} rank {} ({}, {}), {}, {} bytes", send ? "send" : "recv", seq,
                     send ? "to" : "from", pair->peer_rank(), pair->peer_address(),
                     pair->shared_memory() ? "shm" : "tcp", describe_tag(tag), size);
}

namespace {

std::variant<tcp::SocketStream, shm::RingStream> make_stream(int fd, bool same_host,
                                                             shm::Segment segment, bool creator) {
  if (segment.valid()) return shm::RingStream(fd, std::move(segment), creator);
  return tcp::SocketStream(fd, same_host);
}

}  // namespace

Pair::Pair(std::shared_ptr<Loop> loop, net::Fd fd, const PairOptions& options, shm::Segment segment,
           bool segment_creator)
    : loop_(std::move(loop)),
      fd_(std::move(fd)),
      options_(options),
      stream_(make_stream(fd_.get(), options_.same_host, std::move(segment), segment_creator)) {
  net::set_nonblocking(fd_.get(), true);
  net::set_nodelay(fd_.get());
  // A peer whose host vanished (no FIN, no RST) is noticed within ~7 s even when idle.
  net::set_keepalive(fd_.get(), net::kPeerKeepalive);
  std::lock_guard lock(mu_);
  rearm_locked();
}

Pair::~Pair() { loop_->remove(fd_.get()); }

std::string Pair::peer_text() const {
  return fmt::format("rank {} ({})", options_.peer_rank, options_.peer_address);
}

std::exception_ptr Pair::connection_error(const std::string& what, int err) const {
  if (err == 0)
    return make_error(ErrorKind::kPeerFailure,
                      fmt::format("the connection to {} was closed by the peer while {} (the "
                                  "process probably exited or was killed)",
                                  peer_text(), what));
  // The kernel gave up on the peer (TCP_USER_TIMEOUT, set with the keepalive): say what that
  // means, since "Connection timed out" reads like a slow peer.
  const std::string why =
      err == ETIMEDOUT
          ? fmt::format(
                ": its host acknowledged nothing for {} s (the connection's limit): it is "
                "down or unreachable, or the network between dropped every packet for "
                "that long; check that host and the links to it",
                net::kPeerKeepalive.limit_s())
          : "";
  return make_error(ErrorKind::kPeerFailure,
                    fmt::format("the connection to {} broke while {}: {} (errno {}){}", peer_text(),
                                what, std::strerror(err), err, why));
}

std::unique_lock<std::mutex> Pair::lock_to_post() {
  posters_.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(mu_);
  posters_.fetch_sub(1, std::memory_order_relaxed);
  return lock;
}

std::shared_ptr<Request> Pair::isend(uint64_t tag, const void* data, size_t size, Deadline deadline,
                                     uint64_t aux) {
  auto r = std::make_shared<Request>();
  r->kind = Request::Kind::kSend;
  r->tag = tag;
  r->data = static_cast<std::byte*>(const_cast<void*>(data));
  r->size = size;
  r->deadline = deadline;
  r->pair = shared_from_this();
  r->wire.header.tag = tag;
  r->wire.header.size = size;
  r->wire.header.aux = aux;
  std::unique_lock lock = lock_to_post();
  post_send_locked(r);
  rearm_after_post_locked();
  return r;
}

void Pair::post_send_locked(const std::shared_ptr<Request>& r) {
  r->seq = ++send_seq_;
  if (auto e = refuse_locked(*r)) {
    r->completion.fail(e);
    return;
  }
  if (on_stream([&](auto& s) { return s.sends_in_one_copy(r->size); })) {
    r->cma = true;
    r->wire.header.flags = r->wire.header.flags | kFrameCma;
    r->wire.cma = CmaDescriptor{reinterpret_cast<uint64_t>(r->data)};
  }
  send_queue_.push_back(r);
  if (send_queue_.size() == 1) progress_send_locked();  // write straight away when idle
}

namespace {

std::shared_ptr<Request> new_receive(uint64_t tag, void* data, size_t size, Deadline deadline,
                                     uint64_t expected_aux) {
  auto r = std::make_shared<Request>();
  r->expected_aux = expected_aux;
  r->kind = Request::Kind::kRecv;
  r->tag = tag;
  r->data = static_cast<std::byte*>(data);
  r->size = size;
  r->deadline = deadline;
  return r;
}

}  // namespace

std::shared_ptr<Request> Pair::irecv(uint64_t tag, void* data, size_t size, Deadline deadline,
                                     uint64_t expected_aux) {
  return post_recv(new_receive(tag, data, size, deadline, expected_aux));
}

std::shared_ptr<Request> Pair::irecv_reduce(uint64_t tag, void* data, size_t size,
                                            Deadline deadline, uint64_t expected_aux,
                                            Request::Reduction reduce) {
  check_reduce_op(reduce.dtype, reduce.op);
  const size_t elem = element_size(reduce.dtype);
  if (size % elem != 0)
    throw InvalidArgumentError(fmt::format(
        "rank {}: a reducing receive from rank {} of {} bytes is not a whole number of {} "
        "elements ({} bytes each)",
        options_.self_rank, options_.peer_rank, size, to_string(reduce.dtype), elem));
  auto r = new_receive(tag, data, size, deadline, expected_aux);
  r->reduce = reduce;
  return post_recv(std::move(r));
}

std::shared_ptr<Request> Pair::post_recv(std::shared_ptr<Request> r) {
  r->pair = shared_from_this();
  std::unique_lock lock = lock_to_post();
  post_recv_locked(r);
  rearm_after_post_locked();
  return r;
}

void Pair::post_recv_locked(const std::shared_ptr<Request>& r) {
  const uint64_t tag = r->tag;
  r->seq = ++recv_seq_;
  if (group_failure_locked(tag)) {
    r->completion.fail(refuse_locked(*r));
    return;
  }
  // A message with this tag may already be here (or arriving): the stream is sequential, so
  // only the newest unexpected message can still be incomplete. Messages that arrived before
  // the connection closed are still delivered.
  if (auto* early = unexpected_.front(tag)) {
    Unexpected& u = **early;
    if (u.complete()) {
      deliver_unexpected(u, *r);
      recycle_locked(unexpected_.take_front(tag));
      return;
    }
    if (!u.claimant && !broken_) {
      r->matched = true;
      if (&u == rx_unexpected_ && u.size == r->size &&
          (r->expected_aux == 0 || r->expected_aux == u.aux)) {
        // Still arriving: keep what came, and let the rest stream straight into the receive
        // (the bytes of an element cut in two wait in the bounce buffer for the rest of it).
        const size_t elem = r->reduce ? element_size(r->reduce->dtype) : 1;
        const size_t whole = u.done - u.done % elem;
        land_locked(*r, u.bytes.get(), whole);
        rx_carry_ = u.done - whole;
        if (rx_carry_ > 0) std::memcpy(bounce_locked(), u.bytes.get() + whole, rx_carry_);
        rx_unexpected_ = nullptr;
        recycle_locked(unexpected_.take_front(tag));
        rx_request_ = r;
        rx_state_ = RxState::kIntoRequest;
        return;
      }
      u.claimant = r;
      return;
    }
  }
  if (auto e = refuse_locked(*r)) {
    r->completion.fail(e);
    return;
  }
  posted_.push_back(tag, r);
}

std::exception_ptr Pair::refuse_locked(const Request& r) const {
  // A group's own failure explains more than the connection closing after it.
  std::exception_ptr cause = broken_;
  if (auto failed = group_failure_locked(r.tag)) cause = failed;
  if (!cause) return nullptr;
  return make_error(kind_of(cause), fmt::format("rank {}: {} cannot start: {}", options_.self_rank,
                                                r.describe(), message_of(cause)));
}

void Pair::send_group_failed(uint64_t tag, std::string text) {
  auto r = std::make_shared<Request>();
  r->kind = Request::Kind::kSend;
  r->tag = tag;
  r->owned = std::move(text);
  r->data = reinterpret_cast<std::byte*>(r->owned.data());
  r->size = r->owned.size();
  r->deadline = Deadline::after(std::chrono::seconds(5));
  r->pair = shared_from_this();
  r->wire.header.tag = tag;
  r->wire.header.size = r->size;
  r->wire.header.flags = kFrameGroupFailed;
  std::lock_guard lock(mu_);
  if (broken_) return;
  r->seq = ++send_seq_;
  send_queue_.push_back(r);
  // The failing process may exit right after this: push the notice (and a message cut short
  // ahead of it) onto the wire now, for up to a fraction of a second.
  const Deadline flush = Deadline::after(std::chrono::milliseconds(250));
  for (;;) {
    progress_send_locked();
    if (send_queue_.empty() || broken_ || r->completion.done() || flush.expired()) break;
    pollfd p{fd_.get(), POLLOUT, 0};
    ::poll(&p, 1, flush.poll_ms());
  }
  rearm_locked();
}

void Pair::fail_group(uint32_t group_id, uint32_t from_seq, std::exception_ptr error) {
  std::lock_guard lock(mu_);
  fail_group_locked(group_id, from_seq, std::move(error));
}

std::exception_ptr Pair::group_failure_locked(uint64_t tag) const {
  auto it = failed_groups_.find(group_of(tag));
  if (it == failed_groups_.end()) return nullptr;
  const uint32_t from = it->second.from_seq;
  const uint32_t seq = collective_seq_of(tag);
  const bool before = from != 0 && seq != 0 && static_cast<int32_t>(seq - from) < 0;
  return before ? nullptr : it->second.error;
}

void Pair::fail_group_locked(uint32_t group_id, uint32_t from_seq, std::exception_ptr error) {
  auto [entry, first] = failed_groups_.try_emplace(group_id, GroupFailure{error, from_seq});
  if (!first) {
    // Failed already; a later report may reach further back (or, from 0, to everything).
    const uint32_t had = entry->second.from_seq;
    if (had == 0 || (from_seq != 0 && static_cast<int32_t>(from_seq - had) >= 0)) return;
    entry->second.from_seq = from_seq;
    error = entry->second.error;  // the first cause stays the one reported
  }
  auto covered = [&](uint64_t tag) {
    return group_of(tag) == group_id && group_failure_locked(tag) != nullptr;
  };
  const std::string cause = message_of(error);
  const ErrorKind kind = kind_of(error);
  auto fail = [&](Request& r) {
    r.completion.fail(make_error(
        kind, fmt::format("rank {}: {} failed: {}", options_.self_rank, r.describe(), cause)));
  };
  // Sends already on the wire finish (the stream must stay whole); queued ones are dropped.
  for (auto it = send_queue_.begin(); it != send_queue_.end();) {
    Request& r = **it;
    if (covered(r.tag) && r.header_done == 0 &&
        !(r.wire.header.flags & (kFrameGroupFailed | kFrameCmaDone))) {
      fail(r);
      it = send_queue_.erase(it);
    } else {
      ++it;
    }
  }
  posted_.remove_if([&](uint64_t tag, std::shared_ptr<Request>& r) {
    if (!covered(tag)) return false;
    fail(*r);
    return true;
  });
  for (auto& [tag, u] : unexpected_)
    if (u->claimant && covered(tag)) {
      fail(*u->claimant);
      u->claimant.reset();
    }
  wake_sleepers_locked();
}

bool Pair::reject_frame(Request& r, uint64_t size, uint64_t aux) {
  if (r.expected_aux != 0 && aux != r.expected_aux) {
    r.received_aux = aux;
    r.completion.fail(make_error(
        ErrorKind::kInvalidArgument,
        fmt::format("rank {}: {} does not match: rank {} sent a message of another call "
                    "(fingerprint 0x{:016x}, expected 0x{:016x})",
                    options_.self_rank, r.describe(), options_.peer_rank, aux, r.expected_aux)));
    return true;
  }
  if (size != r.size) {
    r.completion.fail(make_error(
        ErrorKind::kInvalidArgument,
        fmt::format("rank {}: {} does not match: rank {} sent {} bytes with this tag; make the "
                    "receive the same size as the send",
                    options_.self_rank, r.describe(), options_.peer_rank, size)));
    return true;
  }
  return false;
}

void Pair::deliver_unexpected(Unexpected& u, Request& r) {
  if (reject_frame(r, u.size, u.aux)) return;
  land_locked(r, u.bytes.get(), r.size);
  r.completion.succeed();
}

void Pair::land_locked(Request& r, const std::byte* bytes, size_t n) {
  if (n == 0) return;
  if (r.reduce)
    reduce_into(r.data + r.done, bytes, n / element_size(r.reduce->dtype), r.reduce->dtype,
                r.reduce->op);
  else
    std::memcpy(r.data + r.done, bytes, n);
  r.done += n;
}

std::byte* Pair::bounce_locked() {
  if (!bounce_) bounce_ = std::make_unique_for_overwrite<std::byte[]>(kBounceBytes);
  return bounce_.get();
}

bool Pair::wants_to_write() {
  std::lock_guard lock(mu_);
  return !send_queue_.empty() && !broken_;
}

bool Pair::has_unexpected(uint64_t tag) {
  std::lock_guard lock(mu_);
  auto* early = unexpected_.front(tag);
  return early != nullptr && !(*early)->claimant;
}

bool Pair::try_progress() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  const uint64_t before = bytes_moved_;
  progress_locked();
  if (bytes_moved_ == before) return false;
  wake_sleepers_locked();  // a thread asleep on the bell may wait for what just moved
  return true;
}

void Pair::on_event(uint32_t /*events*/) {
  std::lock_guard lock(mu_);
  armed_ = false;                               // one-shot: the event consumed the registration
  on_stream([](auto& s) { s.begin_event(); });  // a doorbell or a close: read the socket
  const uint64_t before = bytes_moved_;
  progress_locked();
  // A thread asleep on the bell waits for requests this may have finished.
  if (bytes_moved_ != before) wake_sleepers_locked();
  rearm_locked();
  on_stream([](auto& s) { s.end_event(); });
}

void Pair::progress_locked() {
  if (broken_) return;
  if (!send_queue_.empty()) progress_send_locked();
  if (!broken_) progress_recv_locked();
}

void Pair::progress_send_locked() {
  while (!send_queue_.empty() && !broken_) {
    iovec iov[kMaxIov];
    size_t count = 0;
    for (const auto& r : send_queue_) {
      if (count + 2 > kMaxIov) break;
      if (r->header_done < r->prefix())
        iov[count++] = {reinterpret_cast<char*>(&r->wire) + r->header_done,
                        r->prefix() - r->header_done};
      if (r->done < r->stream_size())
        iov[count++] = {r->data + r->done, r->stream_size() - r->done};
    }
    ssize_t n = write_out(iov, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      fail_locked(
          connection_error(fmt::format("sending {}", send_queue_.front()->describe()), errno));
      return;
    }
    bytes_moved_ += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (left > 0 && !send_queue_.empty()) {
      Request& r = *send_queue_.front();
      size_t h = std::min(left, r.prefix() - r.header_done);
      r.header_done += h;
      left -= h;
      size_t p = std::min(left, r.stream_size() - r.done);
      r.done += p;
      left -= p;
      if (r.header_done == r.prefix() && r.done == r.stream_size()) {
        // The peer must read these even while it waits on another pair (its ring then asks for
        // no doorbell), so always ring: a one-copy offer (done when the peer has copied it out;
        // such frames exist on shared memory only), and a group's failure, which fails what the
        // peer waits on elsewhere (a third rank it waits for may never send).
        if (r.cma || ((r.wire.header.flags & kFrameGroupFailed) && ring() != nullptr))
          ring()->ring_doorbell();
        if (r.cma)
          cma_pending_.push_back(std::move(send_queue_.front()));
        else
          r.completion.succeed();
        send_queue_.pop_front();
      }
    }
  }
}

void Pair::progress_recv_locked() {
  // Bytes nobody has asked for yet are read a bounded amount per call: a thread that came for
  // one message must not stay to copy a large early one that streams in behind it (the rest is
  // read on the next call, or straight into its receive once that is posted).
  size_t unexpected_budget = kUnexpectedBytesPerCall;
  for (;;) {
    std::byte* target = nullptr;
    size_t want = 0;
    std::byte scratch[16384];
    switch (rx_state_) {
      case RxState::kHeader:
        target = reinterpret_cast<std::byte*>(&rx_header_) + rx_header_done_;
        want = sizeof(FrameHeader) - rx_header_done_;
        break;
      case RxState::kCmaDescriptor:
        target = reinterpret_cast<std::byte*>(&rx_cma_) + rx_cma_done_;
        want = sizeof(CmaDescriptor) - rx_cma_done_;
        break;
      case RxState::kIntoRequest:
        if (rx_request_->reduce) {
          target = bounce_locked() + rx_carry_;
          want =
              std::min(rx_request_->size - rx_request_->done - rx_carry_, kBounceBytes - rx_carry_);
        } else {
          target = rx_request_->data + rx_request_->done;
          want = rx_request_->size - rx_request_->done;
        }
        break;
      case RxState::kIntoUnexpected:
        if (unexpected_budget == 0 || posters_.load(std::memory_order_relaxed) > 0) return;
        target = rx_unexpected_->bytes.get() + rx_unexpected_->done;
        want = std::min(rx_unexpected_->size - rx_unexpected_->done, unexpected_budget);
        break;
      case RxState::kDiscard:
        target = scratch;
        want = std::min<uint64_t>(rx_discard_left_, sizeof(scratch));
        break;
    }
    ssize_t n = read_in(target, want);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      fail_locked(connection_error(rx_request_
                                       ? fmt::format("receiving {}", rx_request_->describe())
                                       : std::string("waiting for messages"),
                                   errno));
      return;
    }
    if (n == 0) {
      fail_locked(connection_error(rx_request_
                                       ? fmt::format("receiving {}", rx_request_->describe())
                                       : std::string("waiting for messages"),
                                   0));
      return;
    }
    const size_t got = static_cast<size_t>(n);
    bytes_moved_ += got;
    switch (rx_state_) {
      case RxState::kHeader:
        rx_header_done_ += got;
        if (rx_header_done_ == sizeof(FrameHeader)) {
          rx_header_done_ = 0;
          on_frame_header_locked();
          if (broken_) return;
        }
        break;
      case RxState::kCmaDescriptor:
        rx_cma_done_ += got;
        if (rx_cma_done_ == sizeof(CmaDescriptor)) {
          rx_cma_done_ = 0;
          rx_state_ = RxState::kHeader;
          on_cma_descriptor_locked();
          if (broken_) return;
        }
        break;
      case RxState::kIntoRequest:
        if (rx_request_->reduce) {
          const size_t have = rx_carry_ + got;
          const size_t whole = have - have % element_size(rx_request_->reduce->dtype);
          land_locked(*rx_request_, bounce_.get(), whole);
          rx_carry_ = have - whole;
          if (rx_carry_ > 0) std::memmove(bounce_.get(), bounce_.get() + whole, rx_carry_);
        } else {
          rx_request_->done += got;
        }
        if (rx_request_->done == rx_request_->size) {
          rx_request_->completion.succeed();
          rx_request_.reset();
          rx_state_ = RxState::kHeader;
        }
        break;
      case RxState::kIntoUnexpected:
        unexpected_budget -= got;
        rx_unexpected_->done += got;
        if (rx_unexpected_->complete()) {
          Unexpected* u = rx_unexpected_;
          rx_unexpected_ = nullptr;
          rx_state_ = RxState::kHeader;
          finish_unexpected_locked(*u);
        }
        break;
      case RxState::kDiscard:
        rx_discard_left_ -= got;
        if (rx_discard_left_ == 0) rx_state_ = RxState::kHeader;
        break;
    }
  }
}

void Pair::on_frame_header_locked() {
  const FrameHeader& h = rx_header_;
  if (h.magic != kFrameMagic || h.size > kMaxFrameBytes) {
    fail_locked(make_error(
        ErrorKind::kPeerFailure,
        fmt::format("the stream from {} is corrupt: frame magic 0x{:08x} (expected 0x{:08x}), "
                    "size {}; is the peer running the same dtrain version?",
                    peer_text(), h.magic, kFrameMagic, h.size)));
    return;
  }
  if (h.flags & kFrameGoodbye) {
    fail_locked(
        make_error(ErrorKind::kPeerFailure,
                   fmt::format("{} closed its process group (it finished, or destroyed the group)",
                               peer_text())));
    return;
  }
  if (h.flags & kFrameCmaDone) {
    if (cma_pending_.empty()) {
      fail_locked(make_error(ErrorKind::kPeerFailure,
                             fmt::format("{} acknowledged a copy this rank never offered; the "
                                         "stream is corrupt",
                                         peer_text())));
      return;
    }
    Request& r = *cma_pending_.front();
    r.done = r.size;
    r.completion.succeed();
    cma_pending_.pop_front();
    return;
  }
  if (h.flags & kFrameCma) {
    if (!ring()) {
      fail_locked(make_error(ErrorKind::kPeerFailure,
                             fmt::format("{} offered a shared-memory copy over TCP; the stream is "
                                         "corrupt",
                                         peer_text())));
      return;
    }
    rx_state_ = RxState::kCmaDescriptor;
    return;
  }
  if (h.flags & kFrameGroupFailed) {
    if (h.size > (uint64_t{1} << 20)) {
      fail_locked(make_error(ErrorKind::kPeerFailure,
                             fmt::format("{} sent a group-failed notice of {} bytes; the stream is "
                                         "corrupt",
                                         peer_text(), h.size)));
      return;
    }
    auto u = new_unexpected_locked(h.tag, 0, h.size);
    u->control = true;
    rx_unexpected_ = u.get();
    rx_state_ = RxState::kIntoUnexpected;
    unexpected_.push_back(kControlQueue, std::move(u));
    if (h.size == 0) {
      rx_state_ = RxState::kHeader;
      finish_unexpected_locked(*rx_unexpected_);
      rx_unexpected_ = nullptr;
    }
    return;
  }
  if (posted_.front(h.tag)) {
    std::shared_ptr<Request> r = posted_.take_front(h.tag);
    if (reject_frame(*r, h.size, h.aux)) {
      rx_discard_left_ = h.size;
      rx_state_ = h.size > 0 ? RxState::kDiscard : RxState::kHeader;
      return;
    }
    r->matched = true;
    if (h.size == 0) {
      r->completion.succeed();
      return;
    }
    rx_carry_ = 0;
    rx_request_ = std::move(r);
    rx_state_ = RxState::kIntoRequest;
    return;
  }
  if (options_.on_unexpected) options_.on_unexpected(h.tag, h.aux, options_.peer_rank);
  auto u = new_unexpected_locked(h.tag, h.aux, h.size);
  Unexpected* raw = u.get();
  unexpected_.push_back(h.tag, std::move(u));
  if (h.size == 0) return;  // complete already; waits for its receive
  rx_unexpected_ = raw;
  rx_state_ = RxState::kIntoUnexpected;
}

bool Pair::can_read_peer() {
  auto* rs = ring();
  return rs != nullptr && rs->we_read_peer();
}

void Pair::read_peer(std::byte* out, uint64_t address, size_t size) {
  DTRAIN_CHECK(can_read_peer());
  peer_copied(ring()->read_peer(out, address, size), size, /*write=*/false);
}

void Pair::write_peer(uint64_t address, const std::byte* in, size_t size) {
  DTRAIN_CHECK(can_read_peer());
  peer_copied(ring()->write_peer(address, in, size), size, /*write=*/true);
}

void Pair::peer_copied(bool ok, size_t size, bool write) {
  if (!ok) {
    const int error = errno;
    auto failure = std::make_exception_ptr(PeerFailureError(fmt::format(
        "rank {}: copying {} bytes {} {}'s memory failed: {} (errno {}); the peer probably "
        "exited",
        options_.self_rank, size, write ? "into" : "out of", peer_text(), std::strerror(error),
        error)));
    // No such process: the peer is gone for certain, perhaps before its socket says so. The
    // pair breaks now, so that everyone asking after this peer (a post-mortem waiting for its
    // word) learns it at once.
    if (error == ESRCH) poison(failure);
    std::rethrow_exception(failure);
  }
  std::lock_guard lock(mu_);
  bytes_moved_ += size;
}

void Pair::queue_frame_locked(uint32_t flags, uint64_t tag) {
  auto r = std::make_shared<Request>();
  r->kind = Request::Kind::kSend;
  r->tag = tag;
  r->deadline = Deadline::after(std::chrono::seconds(60));
  r->pair = shared_from_this();
  r->wire.header.tag = tag;
  r->wire.header.flags = flags;
  r->seq = ++send_seq_;
  send_queue_.push_back(std::move(r));
  if (send_queue_.size() == 1) progress_send_locked();
}

void Pair::on_cma_descriptor_locked() {
  const FrameHeader h = rx_header_;
  const size_t size = static_cast<size_t>(h.size);
  std::byte* target = nullptr;
  std::shared_ptr<Request> r;
  Unexpected* u = nullptr;
  if (posted_.front(h.tag)) {
    r = posted_.take_front(h.tag);
    if (!reject_frame(*r, h.size, h.aux)) target = r->data;
  } else {
    if (options_.on_unexpected) options_.on_unexpected(h.tag, h.aux, options_.peer_rank);
    auto fresh = new_unexpected_locked(h.tag, h.aux, size);
    u = fresh.get();
    target = u->bytes.get();
    unexpected_.push_back(h.tag, std::move(fresh));
  }
  // A reducing receive pulls through the bounce buffer, a piece at a time.
  const bool bounce = r && target != nullptr && r->reduce;
  const size_t piece = bounce ? kBounceBytes - kBounceBytes % element_size(r->reduce->dtype)
                              : std::max<size_t>(size, 1);
  for (size_t at = 0; target != nullptr && at < size; at += piece) {
    const size_t n = std::min(piece, size - at);
    if (!ring()->read_peer(bounce ? bounce_locked() : target + at, rx_cma_.address + at, n)) {
      fail_locked(connection_error(
          fmt::format("copying {} bytes out of its memory (cross-memory attach)", size), errno));
      return;
    }
    if (bounce) land_locked(*r, bounce_.get(), n);
  }
  bytes_moved_ += size;
  if (r && target != nullptr) {
    r->done = r->size;
    r->completion.succeed();
  }
  if (u) u->done = size;
  queue_frame_locked(kFrameCmaDone, h.tag);  // the sender may reuse its buffer now
}

void Pair::finish_unexpected_locked(Unexpected& u) {
  if (u.control) {
    auto* first = unexpected_.front(kControlQueue);
    DTRAIN_CHECK(first != nullptr && first->get() == &u);
    std::string text(reinterpret_cast<const char*>(u.bytes.get()), u.size);
    uint64_t tag = u.tag;
    unexpected_.take_front(kControlQueue);
    // Fail this pair's requests of the group now, before a close that may follow the notice on
    // the same stream; the device then fails them on the other pairs.
    fail_group_locked(group_of(tag), collective_seq_of(tag),
                      make_error(ErrorKind::kPeerFailure, text));
    if (options_.on_group_failed)
      options_.on_group_failed(tag, options_.peer_rank, std::move(text));
    return;
  }
  if (!u.claimant) return;  // stays until a receive with its tag is posted
  std::shared_ptr<Request> r = std::move(u.claimant);
  auto* first = unexpected_.front(u.tag);
  DTRAIN_CHECK(first != nullptr && first->get() == &u);
  deliver_unexpected(u, *r);
  recycle_locked(unexpected_.take_front(u.tag));
}

std::unique_ptr<Pair::Unexpected> Pair::new_unexpected_locked(uint64_t tag, uint64_t aux,
                                                              size_t size) {
  auto u = std::make_unique<Unexpected>();
  u->tag = tag;
  u->aux = aux;
  u->size = size;
  u->bytes = spare_.take(size, u->capacity);
  return u;
}

void Pair::recycle_locked(std::unique_ptr<Unexpected> u) {
  if (u && u->bytes) spare_.give(std::move(u->bytes), u->capacity);
}

void Pair::rearm_after_post_locked() {
  // A parked pair (a thread spun on it last and left it idle) stays as it is: its poster waits
  // on it next, as a blocking send or receive does, and moves the bytes itself. Arming a TCP
  // pair here cost an epoll_ctl now, another when the waiter begins to spin, and, when the
  // peer's bytes came in between, a wake-up of the loop thread fighting the waiter for the
  // pair's lock; on shared memory, asking for doorbells made the peer write one to the socket
  // for every message, waking the loop the same way (docs/performance.md, "Point-to-point").
  // Should nobody wait on it, a thread of this device about to sleep unparks it (Loop::unpark).
  if (parked_) return;
  // Whatever happened (on shared memory, a posted receive also wants the peer's doorbells),
  // look at the stream again: a reader that stopped for this thread (see posters_) counts on it.
  rearm_locked();
}

void Pair::rearm_locked() {
  if (broken_ || spinners_.load() > 0) return;
  {
    // New data needs a doorbell when a thread sleeps on this pair or a receive is posted on
    // it (its owner may be waiting on something else that needs this data first); data nobody
    // asked for yet can sit in the ring until someone polls (or the ring fills up). On TCP the
    // socket tells the loop itself.
    const bool want_data = blocked_ > 0 || !posted_.empty() || rx_request_;
    while (!on_stream([&](auto& s) { return s.ask_to_be_told(want_data, !send_queue_.empty()); })) {
      on_stream([](auto& s) { s.quiet(); });
      const uint64_t before = bytes_moved_;
      progress_locked();
      if (bytes_moved_ != before) wake_sleepers_locked();
      if (broken_) return;
      // Nothing moved because the reader stops for a thread waiting to post (posters_): let it
      // in. It rearms once it has posted; looping here would hold the lock it waits for.
      if (bytes_moved_ == before && posters_.load(std::memory_order_relaxed) > 0) break;
    }
  }
  const uint32_t events =
      EPOLLIN | (send_queue_.empty() || !socket_carries_data() ? 0u : uint32_t{EPOLLOUT});
  parked_ = false;
  if (armed_ && armed_events_ == events) return;
  loop_->arm(this, fd_.get(), events);
  armed_ = true;
  armed_events_ = events;
}

void Pair::fail_locked(std::exception_ptr error) {
  if (broken_) return;
  broken_ = error;
  broken_at_ = Clock::now();
  const ErrorKind kind = kind_of(error);
  const std::string cause = message_of(error);
  size_t failed = 0;
  auto fail = [&](Request& r) {
    const bool send = r.kind == Request::Kind::kSend;
    ++failed;
    r.completion.fail(make_error(
        kind, fmt::format("rank {}: {} failed with {} of {} bytes {}: {}", options_.self_rank,
                          r.describe(), r.done, r.size, send ? "sent" : "received", cause)));
  };
  for (auto& r : send_queue_) fail(*r);
  send_queue_.clear();
  for (auto& r : cma_pending_) fail(*r);
  cma_pending_.clear();
  for (auto& [tag, r] : posted_) fail(*r);
  posted_.clear();
  // Complete messages stay deliverable; the one cut short is dropped.
  unexpected_.remove_if([&](uint64_t, std::unique_ptr<Unexpected>& u) {
    if (u->complete()) return false;
    if (u->claimant) fail(*u->claimant);
    return true;
  });
  if (rx_request_) fail(*rx_request_);
  rx_request_.reset();
  rx_unexpected_ = nullptr;
  if (kind != ErrorKind::kAborted && failed > 0)
    DTRAIN_LOG_ERROR("rank {}: {} ({} pending operation(s) failed)", options_.self_rank, cause,
                     failed);
  else
    DTRAIN_LOG_DEBUG("rank {}: {}", options_.self_rank, cause);
  loop_->remove(fd_.get());
  armed_ = false;
  wake_sleepers_locked();
  // Tell the peer at once instead of leaving it to its own timeout.
  ::shutdown(fd_.get(), SHUT_RDWR);
}

void Pair::close(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  if (!broken_ && send_queue_.empty()) {
    // Say goodbye so the peer can tell a finished rank from a crashed one.
    FrameHeader bye;
    bye.flags = kFrameGoodbye;
    iovec iov{&bye, sizeof(bye)};
    [[maybe_unused]] ssize_t n = write_out(&iov, 1);
  }
  fail_locked(std::move(error));
}

Pair::BrokenBy Pair::broken_by() {
  std::lock_guard lock(mu_);
  if (!broken_) return BrokenBy::kNothing;
  switch (kind_of(broken_)) {
    case ErrorKind::kTimeout:
      return BrokenBy::kTimeout;
    case ErrorKind::kAborted:
      return BrokenBy::kUs;
    default:
      return BrokenBy::kPeer;
  }
}

void Pair::poison(std::exception_ptr error) {
  std::lock_guard lock(mu_);
  fail_locked(std::move(error));
}

void Pair::cancel_locked(Request& r, const std::string& why) {
  if (r.completion.done()) return;
  const bool send = r.kind == Request::Kind::kSend;
  const std::string text =
      fmt::format("rank {}: {} {} with {} of {} bytes {}", options_.self_rank, r.describe(), why,
                  r.done, r.size, send ? "sent" : "received");
  if (send) {
    auto it = std::find_if(send_queue_.begin(), send_queue_.end(),
                           [&](const auto& q) { return q.get() == &r; });
    if (it != send_queue_.end() && r.header_done == 0) {
      send_queue_.erase(it);
      r.completion.fail(make_error(ErrorKind::kTimeout, text));
      return;
    }
  } else if (!r.matched) {
    posted_.remove_if([&](uint64_t, const std::shared_ptr<Request>& p) { return p.get() == &r; });
    r.completion.fail(make_error(ErrorKind::kTimeout, text));
    return;
  } else {
    for (auto& [tag, u] : unexpected_)
      if (u->claimant.get() == &r) {
        u->claimant.reset();  // the message still arrives and waits for a later receive
        r.completion.fail(make_error(ErrorKind::kTimeout, text));
        return;
      }
  }
  // Half a message is on the wire: the stream can no longer be trusted in either direction.
  fail_locked(make_error(ErrorKind::kTimeout,
                         text + "; the connection is closed because a message was cut short"));
}

void Pair::begin_spin() {
  std::lock_guard lock(mu_);
  spinners_.fetch_add(1);
  if (!socket_carries_data()) {
    // The socket only carries doorbells, and none come while the flags are down: the loop can
    // stay armed (no system call here).
    on_stream([](auto& s) { s.quiet(); });
    return;
  }
  if (armed_ && !broken_) {
    // Leave the socket to the spinning thread: an event-loop wake-up per message would cost a
    // context switch on a core the peers need.
    loop_->arm(this, fd_.get(), 0);
    armed_ = false;
  }
}

void Pair::end_spin() {
  std::lock_guard lock(mu_);
  if (spinners_.fetch_sub(1) == 1 && !broken_ && (!socket_carries_data() || !armed_) &&
      posted_.empty() && !rx_request_ && send_queue_.empty() && blocked_ == 0) {
    // Idle: left out of the loop (TCP), or asking the peer for no doorbells (shared memory, as
    // while spinning), until a waiter spins on it again or a thread is about to sleep.
    parked_ = true;
    loop_->parked();
    return;
  }
  rearm_locked();
}

void Pair::unpark() {
  std::lock_guard lock(mu_);
  if (!parked_) return;
  parked_ = false;
  rearm_locked();
}

void Pair::block_begin() {
  std::lock_guard lock(mu_);
  ++blocked_;
  rearm_locked();
}

void Pair::block_end() {
  std::lock_guard lock(mu_);
  if (--blocked_ == 0 && !socket_carries_data()) rearm_locked();
}

void Pair::cancel(Request& r, const std::string& why) {
  std::lock_guard lock(mu_);
  cancel_locked(r, why);
}

void Pair::unpark_idle_pairs() { loop_->unpark(); }

Pair::SleepOn Pair::sleep_on() {
  if (auto* bell = on_stream([](auto& s) { return s.bell(); })) return {.bell = bell};
  return {.fd = fd_.get()};
}

void Pair::begin_bell_sleep() {
  std::lock_guard lock(mu_);
  on_stream([](auto& s) { s.add_sleeper(); });
}

void Pair::end_bell_sleep() {
  std::lock_guard lock(mu_);
  on_stream([](auto& s) { s.remove_sleeper(); });
  rearm_locked();
}

void Pair::look_before_sleep() {
  // Ask for the bell, then look once more: what came before the flags were seen is here.
  std::lock_guard lock(mu_);
  rearm_locked();
  progress_locked();
}

}  // namespace dtrain::transport
