// GlooStore: gloo's rendezvous store interface over a dtrain::Store, so that Gloo contexts meet
// through dtrain's own store (TCP or file, with its job id, token and timeouts) instead of a
// second rendezvous service. Used by the Gloo backend and by bench/peers/gloo_peer.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "dtrain/store.h"

namespace dtrain::backends {

class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(std::shared_ptr<dtrain::Store> store);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the dtrain store's timeout for the key.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // A zero or negative timeout means the dtrain store's own timeout (gloo passes its
  // kNoTimeout, 0, when it has none).
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const std::shared_ptr<dtrain::Store>& store() const { return store_; }

 private:
  std::shared_ptr<dtrain::Store> store_;
};

}  // namespace dtrain::backends
