// C10dStore: torch's c10d::Store (the PrefixStore init_process_group hands a backend) seen as a
// dtrain::Store, so that the native process group finds its peers through torch's rendezvous.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtrain/store.h"

namespace dtrain::python {

class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  // c10d's Store has no multi-key calls: these are one call per key.
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  using Store::set;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace dtrain::python
