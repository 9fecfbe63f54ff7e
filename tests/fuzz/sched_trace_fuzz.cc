// The scheduling simulator's inputs from outside (src/scheduling): a workload or job table, an
// application's placements.csv, its validation-BATCH.csv. The first byte chooses which; the rest
// is the file. Reading it, and a short simulation of what was read, ends or throws
// InvalidArgumentError, never anything else.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "dtrain/error.h"
#include "scheduling/application.h"
#include "scheduling/simulator.h"
#include "scheduling/workload.h"

namespace {
namespace fs = std::filesystem;
using namespace dtrain::scheduling;

// A scratch application "app" whose three files are valid until the input replaces one.
const std::string& scratch() {
  static const std::string dir = [] {
    const std::string d = fs::temp_directory_path() / ("sched_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(d + "/traces/app");
    std::ofstream(d + "/applications.csv") << "name,max_epochs\napp,1\n";
    return d;
  }();
  return dir;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

const char kValidation[] = "progress,iteration,metric,grad_sqr,grad_var\n10,1,0.5,1,1\n";
const char kPlacements[] = "placement,local_bsz,step_time,sync_time\n1,32,0.5,0\n2,16,0.4,0.1\n";
const char kScalability[] = "num_nodes,num_replicas,local_bsz,step_time,sync_time\n";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::string& dir = scratch();
  const std::string app = dir + "/traces/app";
  SimulationOptions o;
  o.cluster = {.nodes = 2, .gpus_per_node = 2};
  o.max_seconds = 1e5;  // bounded work: the fuzzer looks for crashes, not slow inputs
  try {
    switch (data[0] % 3) {
      case 0: {
        write(dir + "/workload.csv", text);
        const auto jobs = read_workload(dir + "/workload.csv");
        if (jobs.size() <= 8) simulate(jobs, {}, o);
        break;
      }
      case 1:
      case 2: {
        fs::remove_all(app);
        fs::create_directories(app);
        write(app + "/validation-32.csv", data[0] % 3 == 1 ? kValidation : text);
        write(app + "/placements.csv", data[0] % 3 == 2 ? kPlacements : text);
        write(app + "/scalability.csv", kScalability);
        const auto apps = load_applications(dir + "/traces", dir + "/applications.csv");
        JobSpec j;
        j.name = "j";
        j.application = "app";
        j.gpus = 1 + data[0] % 4;
        j.batch_size = 32;
        simulate({j}, apps, o);
        break;
      }
    }
  } catch (const dtrain::InvalidArgumentError&) {
  }
  return 0;
}
