#include "backends/gloo/gloo_store.h"

#include <utility>

#include "dtrain/error.h"

namespace dtrain::backends {

GlooStore::GlooStore(std::shared_ptr<dtrain::Store> store) : store_(std::move(store)) {
  if (!store_) throw InvalidArgumentError("GlooStore needs a store, got null");
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  Bytes value = store_->get(key);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout.count() > 0 ? timeout : store_->timeout());
}

}  // namespace dtrain::backends
