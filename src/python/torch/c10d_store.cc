#include "python/torch/c10d_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtrain/error.h"

namespace dtrain::python {
namespace {

// torch's stores throw c10::Error (a timeout included) or std::runtime_error; dtrain's callers
// expect StoreError and TimeoutError, with the keys named.
template <typename F>
auto call(const char* what, const std::vector<std::string>& keys, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (auto nl = m.find("\nException raised from"); nl != std::string::npos) m.resize(nl);
    std::string text =
        fmt::format("torch's store: {} of key(s) {} failed: {}", what, fmt::join(keys, ", "), m);
    if (m.find("imeout") != std::string::npos || m.find("imed out") != std::string::npos)
      throw TimeoutError(text);
    throw StoreError(text);
  }
}

}  // namespace

C10dStore::C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {
  timeout_ = store_->getTimeout();
}

void C10dStore::set(const std::string& key, const Bytes& value) {
  call("set", {key}, [&] { store_->set(key, value); });
}

Bytes C10dStore::get(const std::string& key) {
  // c10d's get waits for the key itself, up to the store's timeout.
  return call("get", {key}, [&] { return store_->get(key); });
}

int64_t C10dStore::add(const std::string& key, int64_t delta) {
  return call("add", {key}, [&] { return store_->add(key, delta); });
}

Bytes C10dStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return call("compare_set", {key}, [&] { return store_->compareSet(key, expected, desired); });
}

bool C10dStore::check(const std::vector<std::string>& keys) {
  return call("check", keys, [&] { return store_->check(keys); });
}

void C10dStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  call("wait", keys, [&] { store_->wait(keys, timeout); });
}

bool C10dStore::delete_key(const std::string& key) {
  return call("delete", {key}, [&] { return store_->deleteKey(key); });
}

int64_t C10dStore::num_keys() {
  return call("num_keys", {}, [&] { return store_->getNumKeys(); });
}

std::vector<Bytes> C10dStore::multi_get(const std::vector<std::string>& keys) {
  wait(keys, timeout());
  std::vector<Bytes> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(get(k));
  return out;
}

void C10dStore::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgumentError(
        fmt::format("multi_set: {} keys but {} values", keys.size(), values.size()));
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace dtrain::python
