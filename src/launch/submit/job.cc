#include "launch/submit/job.h"

#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "dtrain/error.h"

namespace dtrain::submit {

void Job::validate() const {
  auto refuse = [](const std::string& what) {
    throw InvalidArgumentError("dtrain submit: " + what);
  };
  if (command.empty()) refuse("no command: put it after --, e.g. -- python3 train.py");
  if (!std::regex_match(name, std::regex("[a-z]([-a-z0-9]{0,50}[a-z0-9])?")))
    refuse(
        fmt::format("job name '{}' must be 1-52 lowercase letters, digits or '-', starting "
                    "with a letter and ending with a letter or digit (a Kubernetes Service name)",
                    name));
  if (nodes < 1 || nodes > 100000) refuse(fmt::format("--nodes {} must be 1 to 100000", nodes));
  if (procs_per_node < 1 || procs_per_node > 1024)
    refuse(fmt::format("--procs-per-node {} must be 1 to 1024", procs_per_node));
  if (gpus_per_proc < 0 || gpus_per_proc > 64)
    refuse(fmt::format("--gpus-per-proc {} must be 0 to 64", gpus_per_proc));
  if (!gpu_model.empty() && gpus_per_proc == 0)
    refuse(fmt::format("--gpu-model {} without --gpus-per-proc", gpu_model));
  if (!gpu_model.empty() && !std::regex_match(gpu_model, std::regex("[A-Za-z0-9_.-]+")))
    refuse(fmt::format("--gpu-model '{}' must be letters, digits, '.', '_' or '-'", gpu_model));
  if (cpus_per_proc < 0 || cpus_per_proc > 1024)
    refuse(fmt::format("--cpus-per-proc {} must be 0 to 1024", cpus_per_proc));
  if (!memory.empty() && !std::regex_match(memory, std::regex("[0-9]+[KMGT]?")))
    refuse(fmt::format("--mem '{}' must be a number with K, M, G or T (per node, as Slurm's)",
                       memory));
  if (!time_limit.empty() &&
      !std::regex_match(time_limit, std::regex("([0-9]+-)?[0-9]+(:[0-5][0-9]){0,2}")))
    refuse(fmt::format("--time '{}' must read MINUTES, HH:MM:SS or D-HH:MM:SS", time_limit));
  for (const auto* list : {&stage_in, &stage_out})
    for (const auto& s : *list)
      if (s.find(':') == std::string::npos || s.front() == ':' || s.back() == ':')
        refuse(fmt::format("'{}' must read SRC:DST", s));
  if (max_restarts < 0 || max_restarts > 1000)
    refuse(fmt::format("--max-restarts {} must be 0 to 1000", max_restarts));
  if (placement != "pack" && placement != "spread" && placement != "auto")
    refuse(fmt::format("--placement '{}' must be pack, spread or auto", placement));
  if (!notify.webhook.empty() && !std::regex_match(notify.webhook, std::regex("https?://\\S+")))
    refuse(fmt::format("--notify-webhook '{}' must be an http:// or https:// URL", notify.webhook));
  // Values that go into #SBATCH lines and paths: no spaces, quotes, newlines or '%' (Slurm's
  // file-name patterns), so that nothing can end a line or start a command.
  auto plain = [&](const std::string& value, const char* flag, const char* allowed) {
    if (!value.empty() && !std::regex_match(value, std::regex(allowed)))
      refuse(
          fmt::format("{} '{}' has characters it cannot take here (spaces, quotes, newlines, "
                      "'%', '$' or '`')",
                      flag, value));
  };
  plain(partition, "--partition", "[A-Za-z0-9_.,-]+");
  plain(constraint, "--constraint", "[A-Za-z0-9_.,&|!*:()\\[\\]-]+");
  plain(notify.mail, "--mail", "[A-Za-z0-9_.+@,-]+");
  plain(log_dir, "--log-dir", "[A-Za-z0-9_./+,:=@-]+");
  plain(container, "--container", "[A-Za-z0-9_./:@+#-]+");
  plain(topology_key, "--topology-key", "[A-Za-z0-9_./-]+");
  if (log_dir.empty()) refuse("--log-dir is empty");
  for (const auto& [k, v] : env)
    if (!std::regex_match(k, std::regex("[A-Za-z_][A-Za-z0-9_]*")))
      refuse(fmt::format("--env '{}': not a variable name", k));
}

ShellOutput run_shell(const std::string& command) {
  ShellOutput o;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) o.text += buf;
  const int status = ::pclose(p);
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

std::string write_job_file(const std::string& dir, const std::string& file,
                           const std::string& text) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string path = (fs::path(dir) / file).string();
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.flush();
  if (!f)
    throw InvalidArgumentError(
        fmt::format("dtrain submit: cannot write {}: {}", path, std::strerror(errno)));
  return path;
}

std::string shell_quote(const std::string& text) {
  if (!text.empty() && std::regex_match(text, std::regex("[A-Za-z0-9_./:=@%+,-]+"))) return text;
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : " ") + shell_quote(w);
  return out;
}

namespace {

std::pair<std::string, std::string> source_and_destination(const std::string& mapping) {
  const auto colon = mapping.find(':');
  return {shell_quote(mapping.substr(0, colon)), shell_quote(mapping.substr(colon + 1))};
}

}  // namespace

std::string stage_in_commands(const Job& job, bool notifying) {
  std::string s;
  for (const auto& in : job.stage_in) {
    const auto [from, to] = source_and_destination(in);
    s += fmt::format(
        "cp -r {0} {1} || {{ echo 'dtrain: staging failed:' {0} {1} >&2; {2}exit 1; }}\n", from, to,
        notifying ? "notify failure 1; " : "");
  }
  return s;
}

std::string stage_out_commands(const Job& job) {
  std::string s;
  for (const auto& out : job.stage_out) {
    const auto [from, to] = source_and_destination(out);
    s += fmt::format("cp -r {0} {1} || echo 'dtrain: collecting failed:' {0} {1} >&2\n", from, to);
  }
  return s;
}

std::string notify_function(const Job& job, const std::string& id_variable) {
  if (job.notify.command.empty() && job.notify.webhook.empty()) return "";
  std::string body = fmt::format(
      "# Tells of the job's events; a notifier that fails never fails the job.\n"
      "notify() {{\n"
      "  local event=$1 status=${{2:-}}\n");
  if (!job.notify.command.empty())
    body += fmt::format(
        "  DTRAIN_JOB_EVENT=$event DTRAIN_JOB_ID={} DTRAIN_JOB_NAME={} DTRAIN_JOB_STATUS=$status "
        "\\\n"
        "    bash -c {} || echo \"dtrain: the notify command failed ($?)\" >&2\n",
        id_variable, shell_quote(job.name), shell_quote(job.notify.command));
  if (!job.notify.webhook.empty())
    body += fmt::format(
        "  curl -fsS -m 10 -X POST -H 'Content-Type: application/json' \\\n"
        "    -d \"{{\\\"job\\\": \\\"{}\\\", \\\"id\\\": \\\"{}\\\", \\\"event\\\": "
        "\\\"$event\\\", "
        "\\\"status\\\": \\\"$status\\\"}}\" {} >/dev/null || echo \"dtrain: the webhook failed\" "
        ">&2\n",
        job.name, id_variable, shell_quote(job.notify.webhook));
  return body + "}\n";
}

}  // namespace dtrain::submit
