// SharedPage: one page of memory that the ranks of one host share, for atomic counters. One rank
// creates it as an anonymous memfd; the others take a duplicate of that descriptor straight out
// of the creator's process (pidfd_getfd, Linux 5.6+, the same permission as cross-memory attach)
// and map it. It has no name, so nothing is ever left behind in /dev/shm, and each mapping lives
// as long as its owner's object (RAII), whatever happens to the other processes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common/socket.h"

namespace dtrain::transport::shm {

class SharedPage {
 public:
  static constexpr size_t kWords = 4096 / sizeof(uint64_t);

  // A fresh page of zeros; nullopt (with the reason in `why`) when the system refuses.
  static std::optional<SharedPage> create(std::string* why);
  // The page process `pid` created, whose descriptor there is `fd`.
  static std::optional<SharedPage> adopt(pid_t pid, int fd, std::string* why);
  SharedPage(SharedPage&& o) noexcept;
  SharedPage& operator=(SharedPage&& o) noexcept;
  SharedPage(const SharedPage&) = delete;
  SharedPage& operator=(const SharedPage&) = delete;
  ~SharedPage();

  std::atomic<uint64_t>& word(size_t i) { return static_cast<std::atomic<uint64_t>*>(base_)[i]; }
  // This process's descriptor of the page (what another process passes to adopt()).
  int fd() const { return fd_.get(); }

 private:
  SharedPage() = default;
  bool map(std::string* why);

  net::Fd fd_;
  void* base_ = nullptr;
};

}  // namespace dtrain::transport::shm
