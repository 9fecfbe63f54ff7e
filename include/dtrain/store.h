// The rendezvous store: a small key-value service the ranks of a job use to find each other.
// Every blocking call waits at most the store's timeout (or the one given) and a timeout names
// the keys still missing.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

using Bytes = std::vector<uint8_t>;

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to timeout()) for the key to exist, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Adds delta to the integer stored at key (0 when missing) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets key to `desired` if its value is `expected` (an empty `expected` matches a missing key).
  // Returns the value the key holds afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // True when every key exists; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; TimeoutError (naming the missing keys) after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Removes key; false when it did not exist.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;
  // Waits for every key (up to timeout()), then returns their values in order.
  virtual std::vector<Bytes> multi_get(const std::vector<std::string>& keys) = 0;
  virtual void multi_set(const std::vector<std::string>& keys,
                         const std::vector<Bytes>& values) = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  // String conveniences.
  void set(const std::string& key, std::string_view value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes b = get(key);
    return std::string(b.begin(), b.end());
  }

 protected:
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;   // 0 with is_server = any free port; read it back with port()
  bool is_server = false;  // host the server inside this process as well as connecting to it
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;  // default limit of each call
  std::chrono::milliseconds connect_timeout{60'000};  // how long to keep retrying to connect
  std::string job_id;                                 // empty = DTRAIN_JOB_ID (default "dtrain")
  std::string token;  // empty = DTRAIN_AUTH_TOKEN (unset = no authentication)
  int rank = -1;      // this process's rank, for error messages and server logs
};

class TcpStoreServer;

// A client of a TCP store server (and, with is_server, that server too).
// One TcpStore may be used from several threads: calls are serialised on its connection.
class TcpStore : public Store {
 public:
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  using Store::set;

  const std::string& host() const;
  uint16_t port() const;
  // The local IP address of this client's connection: the address that routes to the store,
  // a good default for the address this process publishes to its peers.
  std::string local_ip() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreServerOptions {
  std::string host;       // "" = every interface
  uint16_t port = 29500;  // 0 = any free port
  std::string job_id;     // empty = DTRAIN_JOB_ID
  std::string token;      // empty = DTRAIN_AUTH_TOKEN
  std::chrono::milliseconds handshake_timeout{10'000};
  // Also serve PyTorch's TCPStore clients (torch 2.x's protocol and 1.13's), so that a script's
  // init_process_group meets this store under TORCHELASTIC_USE_AGENT_STORE=True, as under
  // torchrun. Their protocol cannot authenticate: with a token set they are refused. 1.13's
  // silent second connection (watch_key callbacks) is held open instead of timing out.
  bool torch_clients = false;
};

// The server: one thread accepts, one thread serves each client. Refused connections (garbage,
// another job, wrong token) are logged and dropped; everyone else keeps being served.
class TcpStoreServer {
 public:
  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();  // stops serving and joins every thread
  uint16_t port() const;
  // Stops serving; first waits up to `wait_for_clients` for the connected clients to hang up
  // (a rank that hosts the store and finishes first must not pull it from under the others).
  void stop(std::chrono::milliseconds wait_for_clients = std::chrono::milliseconds(0));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A store in one file on a shared file system; processes coordinate with file locks.
class FileStore : public Store {
 public:
  explicit FileStore(const std::string& path,
                     std::chrono::milliseconds timeout = Store::kDefaultTimeout);
  ~FileStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  using Store::set;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Puts every key of `base` under "prefix/": separate groups, or restarts, share one store.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;  // keys of the base store as a whole
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  using Store::set;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string key_of(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> keys_of(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace dtrain
