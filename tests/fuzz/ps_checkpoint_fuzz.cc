// A parameter server restoring from a damaged or hostile checkpoint: the input is its
// manifest.json (its CRC entry made to match the tables file, so that the manifest's other
// fields are what is read); the server restores, or refuses naming the checkpoint, and never
// crashes. The tables file is one the server wrote itself.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "dtrain/ps.h"

namespace fs = std::filesystem;

namespace {

// A real checkpoint of one dense and one sparse table, written once: its tables file is reused.
fs::path real_checkpoint() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("dtrain_fuzz_ps_" + std::to_string(::getpid()));
    fs::remove_all(d);
    dtrain::ps::ServerOptions o;
    o.listen_host = "127.0.0.1";
    o.checkpoint_dir = d.string();
    dtrain::ps::Server server(o);
    dtrain::ps::ClientOptions co;
    co.servers = {server.address()};
    dtrain::ps::Client client(co);
    std::vector<float> w(16, 0.5f);
    client.create_dense("w", dtrain::TensorView::of(w), {});
    client.create_sparse("emb", {.width = 4});
    client.checkpoint();
    return d / "server-0";
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path source = real_checkpoint();
  fs::path newest;
  for (const auto& e : fs::directory_iterator(source))
    if (e.is_directory()) newest = e.path();
  if (newest.empty()) return 0;
  nlohmann::json manifest = nlohmann::json::parse(data, data + size, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) return 0;
  // The CRC and size of the real tables file, so that the rest of the manifest is what counts.
  nlohmann::json real = nlohmann::json::parse(std::ifstream(newest / "manifest.json"));
  manifest["files"] = real["files"];
  const fs::path dir = fs::temp_directory_path() / ("dtrain_fuzz_restore_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const fs::path ckpt = dir / "server-0" / newest.filename();
  fs::create_directories(ckpt);
  fs::copy_file(newest / "tables.safetensors", ckpt / "tables.safetensors");
  std::ofstream(ckpt / "manifest.json") << manifest.dump();
  try {
    dtrain::ps::ServerOptions o;
    o.listen_host = "127.0.0.1";
    o.checkpoint_dir = dir.string();
    o.restore = true;
    dtrain::ps::Server server(o);
  } catch (const dtrain::Error&) {
  }
  fs::remove_all(dir);
  return 0;
}
