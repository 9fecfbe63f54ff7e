#include "transport/shm/segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <utility>

#include <fmt/format.h>

#include "common/env.h"
#include "dtrain/error.h"

namespace dtrain::transport::shm {
namespace {

// A value every process has at a known address, for the cross-memory-attach probe.
const volatile uint64_t kProbeValue = 0x45424f52505f4d43;  // "CM_PROBE"

void* map(int fd) {
  // MAP_POPULATE: fault every page in now, not one 4 KiB page at a time on the message path.
  void* p = ::mmap(nullptr, Segment::size(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

std::string segment_name(const std::string& job, const std::string& group, int lo, int hi) {
  std::string safe;
  for (char c : job + "-" + group)
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  return fmt::format("/dtrain-{}-{}-{}", safe.substr(0, 160), lo, hi);
}

namespace {

// Removes "<prefix>-<pid>" segments whose creator no longer runs.
void remove_stale(const std::string& prefix) {
  const std::string base = prefix.substr(1) + "-";  // names under /dev/shm lack the '/'
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (!file.starts_with(base)) continue;
    const std::string pid_text = file.substr(base.size());
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      ::shm_unlink(("/" + file).c_str());
  }
}

}  // namespace

Segment Segment::create(const std::string& prefix) {
  remove_stale(prefix);
  const std::string name = fmt::format("{}-{}", prefix, ::getpid());
  ::shm_unlink(name.c_str());  // this process made it before and failed midway
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw PeerFailureError(fmt::format("cannot create shared memory {}: {}", name, std::strerror(errno)));
  Segment s;
  s.name_ = name;
  s.linked_ = true;
  if (::ftruncate(fd, static_cast<off_t>(size())) != 0 || (s.base_ = map(fd)) == nullptr) {
    int err = errno;
    ::close(fd);
    throw PeerFailureError(fmt::format("cannot size or map shared memory {} ({} bytes): {}", name,
                                       size(), std::strerror(err)));
  }
  ::close(fd);
  auto* h = new (s.base_) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = 2;
  h->creator_pid = ::getpid();
  h->creator_probe = reinterpret_cast<uint64_t>(&kProbeValue);
  auto* c = static_cast<std::byte*>(s.base_) + 4096;
  new (c) RingControl();
  new (c + sizeof(RingControl) + kRingBytes) RingControl();
  return s;
}

Segment Segment::open(const std::string& name) {
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    throw PeerFailureError(fmt::format("cannot open shared memory {}: {}", name, std::strerror(errno)));
  Segment s;
  s.name_ = name;
  s.base_ = map(fd);
  int err = errno;
  ::close(fd);
  if (!s.base_)
    throw PeerFailureError(fmt::format("cannot map shared memory {}: {}", name, std::strerror(err)));
  if (s.header().magic != kSegmentMagic || s.header().version != 2)
    throw PeerFailureError(fmt::format("shared memory {} is not a dtrain segment of version 2", name));
  s.header().opener_pid = ::getpid();
  s.header().opener_probe = reinterpret_cast<uint64_t>(&kProbeValue);
  return s;
}

Segment::Segment(Segment&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)), name_(std::move(o.name_)),
      linked_(std::exchange(o.linked_, false)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    this->~Segment();
    base_ = std::exchange(o.base_, nullptr);
    name_ = std::move(o.name_);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

Segment::~Segment() {
  unlink();
  if (base_) ::munmap(base_, size());
  base_ = nullptr;
}

void Segment::unlink() {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void Segment::probe_peer(bool creator) {
  SegmentHeader& h = header();
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{reinterpret_cast<void*>(creator ? h.opener_probe : h.creator_probe), sizeof(got)};
  const pid_t pid = creator ? h.opener_pid : h.creator_pid;
  bool ok = env::get_bool(env::kCma) &&
            ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof(got)) &&
            got == kProbeValue;
  (creator ? h.creator_reads_opener : h.opener_reads_creator) = ok ? 1 : 0;
}

Ring Segment::ring(bool from_creator) {
  auto* c = static_cast<std::byte*>(base_) + 4096 + (from_creator ? 0 : sizeof(RingControl) + kRingBytes);
  return Ring(reinterpret_cast<RingControl*>(c), c + sizeof(RingControl), kRingBytes);
}

}  // namespace dtrain::transport::shm
