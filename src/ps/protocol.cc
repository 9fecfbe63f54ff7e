#include "ps/protocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::ps {

const char* to_string(Op op) {
  switch (op) {
    case Op::kCreateDense:
      return "create_dense";
    case Op::kCreateSparse:
      return "create_sparse";
    case Op::kPush:
      return "push";
    case Op::kPull:
      return "pull";
    case Op::kPushPull:
      return "push_pull";
    case Op::kPushRows:
      return "push_rows";
    case Op::kPullRows:
      return "pull_rows";
    case Op::kCheckpoint:
      return "checkpoint";
    case Op::kBye:
      return "bye";
    case Op::kForget:
      return "forget_worker";
  }
  return "unknown op";
}

uint64_t table_key(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void send_message(int fd, const Header& header, std::span<const std::span<const std::byte>> parts,
                  const Deadline& deadline, std::string_view context) {
  std::vector<iovec> iov;
  iov.reserve(parts.size() + 1);
  iov.push_back({const_cast<Header*>(&header), sizeof(Header)});
  for (const auto& p : parts)
    if (!p.empty()) iov.push_back({const_cast<std::byte*>(p.data()), p.size()});
  size_t total = 0;
  for (const auto& v : iov) total += v.iov_len;

  size_t sent = 0;
  size_t first = 0;  // iov[first] is the first part not yet fully sent
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd, POLLOUT, 0};
        int r = ::poll(&p, 1, deadline.poll_ms());
        if (r == 0 || (r < 0 && errno != EINTR && deadline.expired()))
          throw TimeoutError(fmt::format("{}: sending stalled at {} of {} bytes after {}", context,
                                         sent, total, deadline.describe()));
        continue;
      }
      throw PeerFailureError(fmt::format("{}: connection lost while sending ({} of {} bytes): {}",
                                         context, sent, total, std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

Header read_header(int fd, const Deadline& deadline, std::string_view context) {
  Header h;
  net::read_all(fd, &h, sizeof(h), deadline, context);
  if (h.magic != kWireMagic)
    throw InvalidArgumentError(fmt::format(
        "{}: received bytes that are not a parameter-server message (magic {:#010x}, expected "
        "{:#010x}): the other side is not a dtrain ps peer of this version",
        context, h.magic, kWireMagic));
  if (h.bytes > kMaxPayload)
    throw InvalidArgumentError(
        fmt::format("{}: a {} message announces {} payload bytes, more than the limit of {}",
                    context, to_string(static_cast<Op>(h.op)), h.bytes, kMaxPayload));
  return h;
}

}  // namespace dtrain::ps
