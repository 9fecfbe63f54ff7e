// PrefixStore: every key of the base store under "prefix/". Blocking calls use this store's own
// timeout (it starts as the base store's): get and multi_get first wait with it when it differs
// from the base's, since the base's get only knows the base's timeout.
#include <fmt/format.h>

#include "dtrain/error.h"
#include "dtrain/store.h"
#include "store/store_util.h"

namespace dtrain {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  if (!base_)
    throw InvalidArgumentError(fmt::format(
        "PrefixStore(\"{}\") was given no base store; pass the store to share", prefix_));
  timeout_ = base_->timeout();
}

namespace {

std::string describe(std::string_view op, const std::string& prefix,
                     const std::vector<std::string>& keys) {
  return fmt::format("{} on prefix store \"{}\"", store::describe_call(op, keys), prefix);
}

// get/multi_get with this store's own timeout: a wait on the base first, whose timeout message is
// then reworded to name the call the user made.
void wait_then_report(Store& base, const std::vector<std::string>& full_keys,
                      std::chrono::milliseconds timeout, std::string_view call) {
  try {
    base.wait(full_keys, timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("{} timed out: {}", call, e.what()));
  }
}

}  // namespace

std::vector<std::string> PrefixStore::keys_of(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(key_of(k));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(key_of(key), value);
}

Bytes PrefixStore::get(const std::string& key) {
  if (timeout() != base_->timeout())
    wait_then_report(*base_, {key_of(key)}, timeout(), describe("get", prefix_, {key}));
  return base_->get(key_of(key));
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(key_of(key), delta);
}

Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(key_of(key), expected, desired);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(keys_of(keys));
}

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  base_->wait(keys_of(keys), timeout);
}

bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(key_of(key)); }

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys) {
  if (timeout() != base_->timeout())
    wait_then_report(*base_, keys_of(keys), timeout(), describe("multi_get", prefix_, keys));
  return base_->multi_get(keys_of(keys));
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  base_->multi_set(keys_of(keys), values);
}

}  // namespace dtrain
