#include "transport/shm/shared_page.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

namespace dtrain::transport::shm {
namespace {

constexpr size_t kPageBytes = 4096;
static_assert(SharedPage::kWords * sizeof(uint64_t) == kPageBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);  // shared between processes

}  // namespace

std::optional<SharedPage> SharedPage::create(std::string* why) {
  SharedPage page;
  page.fd_ = net::Fd(::memfd_create("dtrain-shared-page", MFD_CLOEXEC));
  if (!page.fd_.valid()) {
    *why = fmt::format("memfd_create failed: {}", std::strerror(errno));
    return std::nullopt;
  }
  if (::ftruncate(page.fd_.get(), kPageBytes) != 0) {
    *why = fmt::format("ftruncate of the memfd failed: {}", std::strerror(errno));
    return std::nullopt;
  }
  if (!page.map(why)) return std::nullopt;
  return page;
}

std::optional<SharedPage> SharedPage::adopt(pid_t pid, int fd, std::string* why) {
  net::Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) {
    *why = fmt::format("pidfd_open({}) failed: {}", pid, std::strerror(errno));
    return std::nullopt;
  }
  SharedPage page;
  page.fd_ = net::Fd(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
  if (!page.fd_.valid()) {
    *why = fmt::format("pidfd_getfd(pid {}, fd {}) failed: {}", pid, fd, std::strerror(errno));
    return std::nullopt;
  }
  if (!page.map(why)) return std::nullopt;
  return page;
}

bool SharedPage::map(std::string* why) {
  void* p = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (p == MAP_FAILED) {
    *why = fmt::format("mmap of the shared page failed: {}", std::strerror(errno));
    return false;
  }
  base_ = p;
  return true;
}

SharedPage::SharedPage(SharedPage&& o) noexcept
    : fd_(std::move(o.fd_)), base_(std::exchange(o.base_, nullptr)) {}

SharedPage& SharedPage::operator=(SharedPage&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, kPageBytes);
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
  }
  return *this;
}

SharedPage::~SharedPage() {
  if (base_) ::munmap(base_, kPageBytes);
}

}  // namespace dtrain::transport::shm
