#include "launch/submit/job_file.h"

#include <map>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "dtrain/error.h"

namespace dtrain::submit {

std::string load_job_file(const std::string& path, Job& job,
                          const std::function<bool(const std::string& key)>& given) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw InvalidArgumentError(fmt::format("dtrain submit: cannot read the job file {}", path));
  } catch (const YAML::Exception& e) {
    throw InvalidArgumentError(fmt::format("dtrain submit: {}:{}:{}: not YAML: {}", path,
                                           e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (!root.IsMap())
    throw InvalidArgumentError(fmt::format(
        "dtrain submit: {} must be a map of job keys (nodes: 2, command: [...])", path));

  std::string engine;
  using Setter = std::function<void(const YAML::Node&)>;
  auto text = [](std::string& field) {
    return [&field](const YAML::Node& v) { field = v.as<std::string>(); };
  };
  auto number = [](int& field) { return [&field](const YAML::Node& v) { field = v.as<int>(); }; };
  auto list = [](std::vector<std::string>& field) {
    return [&field](const YAML::Node& v) {
      field = v.IsSequence() ? v.as<std::vector<std::string>>()
                             : std::vector<std::string>{v.as<std::string>()};
    };
  };
  const std::map<std::string, Setter> keys = {
      {"name", text(job.name)},
      {"engine", text(engine)},
      {"command",
       [&job](const YAML::Node& v) {
         // A list of words, or one string run by the shell.
         job.command = v.IsSequence()
                           ? v.as<std::vector<std::string>>()
                           : std::vector<std::string>{"/bin/sh", "-c", v.as<std::string>()};
       }},
      {"nodes", number(job.nodes)},
      {"procs-per-node", number(job.procs_per_node)},
      {"gpus-per-proc", number(job.gpus_per_proc)},
      {"gpu-model", text(job.gpu_model)},
      {"cpus-per-proc", number(job.cpus_per_proc)},
      {"mem", text(job.memory)},
      {"time", text(job.time_limit)},
      {"partition", text(job.partition)},
      {"constraint", text(job.constraint)},
      {"container", text(job.container)},
      {"stage-in", list(job.stage_in)},
      {"stage-out", list(job.stage_out)},
      {"log-dir", text(job.log_dir)},
      {"notify-command", text(job.notify.command)},
      {"notify-webhook", text(job.notify.webhook)},
      {"mail", text(job.notify.mail)},
      {"max-restarts", number(job.max_restarts)},
      {"preemptible", [&job](const YAML::Node& v) { job.preemptible = v.as<bool>(); }},
      {"placement", text(job.placement)},
      {"topology-key", text(job.topology_key)},
      {"volcano", [&job](const YAML::Node& v) { job.volcano = v.as<bool>(); }},
      {"env",
       [&job](const YAML::Node& v) {
         for (const auto& kv : v.as<std::map<std::string, std::string>>()) job.env.insert(kv);
       }},
  };
  for (const auto& entry : root) {
    if (!entry.first.IsScalar())
      throw InvalidArgumentError(fmt::format("dtrain submit: {}:{}: a key must be a name", path,
                                             entry.first.Mark().line + 1));
    const std::string key = entry.first.as<std::string>();
    const auto it = keys.find(key);
    const auto line = entry.first.Mark().line + 1;
    if (it == keys.end()) {
      std::string known;
      for (const auto& [k, setter] : keys) known += (known.empty() ? "" : ", ") + k;
      throw InvalidArgumentError(fmt::format(
          "dtrain submit: {}:{}: unknown key '{}'; the keys are {}", path, line, key, known));
    }
    // "preemptible" is set by the command line's --not-preemptible; the file's env is merged
    // with --env's (which win, name by name).
    if (key != "env" && given(key == "preemptible" ? "not-preemptible" : key)) continue;
    if (entry.second.IsNull())
      throw InvalidArgumentError(
          fmt::format("dtrain submit: {}:{}: '{}' has no value", path, line, key));
    try {
      it->second(entry.second);
    } catch (const YAML::Exception&) {
      throw InvalidArgumentError(fmt::format(
          "dtrain submit: {}:{}: '{}' has a value of the wrong kind (a {} was expected)", path,
          line, key,
          key == "command" || key.starts_with("stage") ? "list of strings"
          : key == "env"                               ? "map of NAME: value"
          : key == "preemptible" || key == "volcano"   ? "true or false"
          : key.find("nodes") != std::string::npos || key.ends_with("-per-proc") ||
                  key.ends_with("-per-node") || key == "max-restarts"
              ? "whole number"
              : "string"));
    }
  }
  return engine;
}

}  // namespace dtrain::submit
