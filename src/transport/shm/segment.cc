#include "transport/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "common/env.h"
#include "common/socket.h"
#include "dtrain/error.h"

namespace dtrain::transport::shm {
namespace {

// A value every process has at a known address, for the cross-memory-attach probe.
const volatile uint64_t kProbeValue = 0x45424f52505f4d43;  // "CM_PROBE"

void* map(int fd) {
  // MAP_POPULATE: fault every page in now, not one 4 KiB page at a time on the message path.
  void* p =
      ::mmap(nullptr, Segment::size(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
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

// Takes a write lock on the whole file that lasts as long as this open file description (an
// OFD lock: not tied to the process, so it works across PID namespaces). False if another
// description holds one.
bool lock_whole(int fd) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

// Removes "<prefix>-*" segments nobody holds: their creator died between creating and
// unlinking (a live creator keeps its lock until both sides have the segment mapped). Ones
// changed in the last 10 s are left alone: a creator takes its lock an instant after creating.
void remove_stale(const std::string& prefix) {
  const std::string base = prefix.substr(1) + "-";  // names under /dev/shm lack the '/'
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/dev/shm", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (!file.starts_with(base)) continue;
    const std::string name = "/" + file;
    net::Fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600));
    struct stat st {};
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || ::time(nullptr) - st.st_mtime < 10) continue;
    if (lock_whole(fd.get())) ::shm_unlink(name.c_str());
  }
}

}  // namespace

Segment Segment::create(const std::string& prefix) {
  remove_stale(prefix);
  // The pid and a random number: another job with the same job id (and, in another PID
  // namespace sharing /dev/shm, perhaps the same pid) never picks this name.
  std::random_device random;
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = fmt::format("{}-{}-{:08x}", prefix, ::getpid(), random());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    throw PeerFailureError(
        fmt::format("cannot create shared memory {}: {}", name, std::strerror(errno)));
  if (!lock_whole(fd)) {
    int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw PeerFailureError(
        fmt::format("cannot lock shared memory {}: {}", name, std::strerror(err)));
  }
  Segment s;
  s.name_ = name;
  s.linked_ = true;
  s.lock_ = net::Fd(fd);  // holds the lock that says "alive" until the name is unlinked
  if (::ftruncate(fd, static_cast<off_t>(size())) != 0 || (s.base_ = map(fd)) == nullptr) {
    int err = errno;
    throw PeerFailureError(fmt::format("cannot size or map shared memory {} ({} bytes): {}", name,
                                       size(), std::strerror(err)));
  }
  auto* h = new (s.base_) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
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
    throw PeerFailureError(
        fmt::format("cannot open shared memory {}: {}", name, std::strerror(errno)));
  Segment s;
  s.name_ = name;
  s.base_ = map(fd);
  int err = errno;
  ::close(fd);
  if (!s.base_)
    throw PeerFailureError(
        fmt::format("cannot map shared memory {}: {}", name, std::strerror(err)));
  if (s.header().magic != kSegmentMagic || s.header().version != kSegmentVersion)
    throw PeerFailureError(fmt::format("shared memory {} is not a dtrain segment of version {}",
                                       name, kSegmentVersion));
  s.header().opener_pid = ::getpid();
  s.header().opener_probe = reinterpret_cast<uint64_t>(&kProbeValue);
  return s;
}

Segment::Segment(Segment&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      name_(std::move(o.name_)),
      linked_(std::exchange(o.linked_, false)),
      lock_(std::move(o.lock_)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    this->~Segment();
    base_ = std::exchange(o.base_, nullptr);
    name_ = std::move(o.name_);
    linked_ = std::exchange(o.linked_, false);
    lock_ = std::move(o.lock_);
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
  lock_.reset();
}

void Segment::probe_peer(bool creator) {
  SegmentHeader& h = header();
  uint64_t got = 0;
  iovec local{&got, sizeof(got)};
  iovec remote{reinterpret_cast<void*>(creator ? h.opener_probe : h.creator_probe), sizeof(got)};
  const pid_t pid = creator ? h.opener_pid : h.creator_pid;
  bool ok =
      env::get_bool(env::kCma) &&
      ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof(got)) &&
      got == kProbeValue;
  (creator ? h.creator_reads_opener : h.opener_reads_creator) = ok ? 1 : 0;
}

Ring Segment::ring(bool from_creator) {
  auto* c =
      static_cast<std::byte*>(base_) + 4096 + (from_creator ? 0 : sizeof(RingControl) + kRingBytes);
  return Ring(reinterpret_cast<RingControl*>(c), c + sizeof(RingControl), kRingBytes);
}

}  // namespace dtrain::transport::shm
