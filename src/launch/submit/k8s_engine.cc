#include "launch/submit/k8s_engine.h"

#include <cstdio>
#include <regex>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "dtrain/error.h"
#include "dtrain/preemption.h"

namespace dtrain::submit {
namespace {

// Slurm's "64G" (and a bare number of megabytes) as a Kubernetes quantity: "64Gi".
std::string k8s_memory(const std::string& slurm) {
  const char unit = slurm.back();
  if (unit >= '0' && unit <= '9') return slurm + "Mi";
  return slurm.substr(0, slurm.size() - 1) + unit + "i";
}

// Slurm's time limit (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) in seconds.
long long seconds_of(const std::string& limit) {
  long long days = 0;
  std::string rest = limit;
  const auto dash = limit.find('-');
  if (dash != std::string::npos) {
    days = std::stoll(limit.substr(0, dash));
    rest = limit.substr(dash + 1);
  }
  std::vector<long long> f;
  std::istringstream in(rest);
  for (std::string part; std::getline(in, part, ':');) f.push_back(std::stoll(part));
  long long s = 0;
  if (dash != std::string::npos) {  // D-HH, D-HH:MM, D-HH:MM:SS
    const long long mult[] = {3600, 60, 1};
    for (size_t i = 0; i < f.size(); ++i) s += f[i] * mult[i];
  } else if (f.size() == 1) {
    s = f[0] * 60;
  } else if (f.size() == 2) {
    s = f[0] * 60 + f[1];
  } else {
    s = f[0] * 3600 + f[1] * 60 + f[2];
  }
  return days * 86400 + s;
}

// What each pod runs: this node's part of the job under `dtrain run`, with SIGTERM passed on
// (bash as PID 1 would not), the inputs, the outputs and, from pod 0, the notifications.
std::string pod_script(const Job& job) {
  const bool notifying = !job.notify.command.empty() || !job.notify.webhook.empty();
  // SIGTERM (the pod deleted, preempted) is passed on to `dtrain run`; before it runs, it stops
  // the script (bash as PID 1 would ignore it).
  std::string s =
      "set -u\nchild=\nstop=\ntrap 'stop=1; [ -n \"$child\" ] && kill -TERM \"$child\" "
      "2>/dev/null' TERM\nindex=${JOB_COMPLETION_INDEX:?the Job controller sets it}\n";
  s += notify_function(job, "${JOB_NAME}");
  auto event = [&](const std::string& e, const std::string& status) {
    return notifying ? fmt::format("[ \"$index\" = 0 ] && notify {} {}\n", e, status) : "";
  };
  s += event("start", "0");
  s += stage_in_commands(job, notifying);
  s += "[ -n \"$stop\" ] && exit 143\n";
  std::vector<std::string> run = {"dtrain",   "run",
                                  "-n",       std::to_string(job.procs_per_node),
                                  "--nnodes", std::to_string(job.nodes)};
  if (job.gpus_per_proc > 0) {
    run.push_back("--gpus-per-proc");
    run.push_back(std::to_string(job.gpus_per_proc));
  }
  s += fmt::format(
      "{} --node-rank \"$index\" --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" "
      "-- {} &\n"
      "child=$!\n"
      "[ -n \"$stop\" ] && kill -TERM \"$child\"\n"
      "wait \"$child\"; status=$?\n"
      "while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; status=$?; done\n",
      shell_join(run), shell_join(job.command));
  s += stage_out_commands(job);
  if (notifying)
    s += fmt::format(
        "if [ \"$index\" = 0 ]; then\n"
        "  if [ \"$status\" -eq 0 ]; then notify end 0\n"
        "  elif [ \"$status\" -eq {} ]; then notify requeue \"$status\"\n"
        "  else notify failure \"$status\"; fi\n"
        "fi\n",
        Preemption::kRequeueExitCode);
  return s + "exit \"$status\"\n";
}

// A number or a boolean, written as is. Every other scalar is a string, and is quoted where
// YAML would read it as something else: an env value "29500" must stay a string (Kubernetes
// refuses a number there).
template <typename T>
YAML::Node plain(T value) {
  YAML::Node n(value);
  n.SetTag("!plain");
  return n;
}

bool reads_as_non_string(const std::string& s) {
  static const std::regex kOther(
      "|~|null|Null|NULL|true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|"
      "Off|OFF|y|Y|n|N|[-+]?(\\.[0-9]|[0-9])[0-9_.:eE+-]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)|"
      "0[xXoObB][0-9a-fA-F_]+");
  return std::regex_match(s, kOther);
}

// The manifests as YAML: block style, multi-line strings (the pod's script) as literal blocks.
void emit(YAML::Emitter& out, const YAML::Node& n) {
  if (n.IsMap()) {
    out << YAML::BeginMap;
    for (const auto& kv : n) {
      out << YAML::Key << kv.first.Scalar() << YAML::Value;
      emit(out, kv.second);
    }
    out << YAML::EndMap;
  } else if (n.IsSequence()) {
    out << YAML::BeginSeq;
    for (const auto& item : n) emit(out, item);
    out << YAML::EndSeq;
  } else if (n.Tag() == "!plain") {
    out << n.Scalar();
  } else if (const std::string& t = n.Scalar();
             t.find('\n') != std::string::npos && t.back() == '\n' && t.front() != ' ') {
    out << YAML::Literal << t;  // the pod's script: readable as it runs
  } else if (n.Scalar().find('\n') != std::string::npos) {
    out << YAML::DoubleQuoted << n.Scalar();
  } else if (reads_as_non_string(n.Scalar())) {
    out << YAML::DoubleQuoted << n.Scalar();
  } else {
    out << n.Scalar();
  }
}

YAML::Node env_var(const std::string& name, const std::string& value) {
  YAML::Node e;
  e["name"] = name;
  e["value"] = value;
  return e;
}

}  // namespace

std::string k8s_manifests(const Job& job) {
  job.validate();
  if (job.container.empty())
    throw InvalidArgumentError(
        "dtrain submit --engine k8s: Kubernetes runs containers: give --container IMAGE (the "
        "image of deploy/Dockerfile has dtrain on its PATH)");
  if (!job.notify.mail.empty())
    throw InvalidArgumentError(
        "dtrain submit --engine k8s: Kubernetes sends no mail: use --notify-command or "
        "--notify-webhook");
  const std::string& name = job.name;
  YAML::Node labels;
  labels["app.kubernetes.io/name"] = "dtrain";
  labels["dtrain.job"] = name;

  YAML::Node service;
  service["apiVersion"] = "v1";
  service["kind"] = "Service";
  service["metadata"]["name"] = name;
  service["metadata"]["labels"] = YAML::Clone(labels);
  service["spec"]["clusterIP"] = "None";  // headless: a DNS name per pod
  service["spec"]["publishNotReadyAddresses"] = plain(true);
  service["spec"]["selector"]["dtrain.job"] = name;
  YAML::Node port;
  port["name"] = "store";
  port["port"] = plain(kK8sStorePort);
  service["spec"]["ports"].push_back(port);

  YAML::Node container;
  container["name"] = "trainer";
  container["image"] = job.container;
  container["command"].push_back("/bin/bash");
  container["command"].push_back("-c");
  container["command"].push_back(pod_script(job));
  YAML::Node env;
  env.push_back(env_var("MASTER_ADDR", fmt::format("{}-0.{}", name, name)));
  env.push_back(env_var("MASTER_PORT", std::to_string(kK8sStorePort)));
  env.push_back(env_var("JOB_NAME", name));
  // Pods start as their images arrive, possibly minutes apart.
  env.push_back(env_var("DTRAIN_CONNECT_TIMEOUT", "600"));
  for (const auto& [k, v] : job.env) env.push_back(env_var(k, v));
  container["env"] = env;
  YAML::Node cport;
  cport["name"] = "store";
  cport["containerPort"] = plain(kK8sStorePort);
  container["ports"].push_back(cport);
  const int gpus = job.gpus_per_proc * job.procs_per_node;
  if (gpus > 0) container["resources"]["limits"]["nvidia.com/gpu"] = plain(gpus);
  if (job.cpus_per_proc > 0)
    container["resources"]["requests"]["cpu"] = plain(job.cpus_per_proc * job.procs_per_node);
  if (!job.memory.empty()) {
    container["resources"]["requests"]["memory"] = k8s_memory(job.memory);
    container["resources"]["limits"]["memory"] = k8s_memory(job.memory);
  }

  YAML::Node pod;
  pod["metadata"]["labels"] = YAML::Clone(labels);
  pod["spec"]["subdomain"] = name;  // pod i is NAME-i.NAME
  pod["spec"]["restartPolicy"] = "Never";
  // SIGTERM first, SIGKILL this long after: time to finish a step and write the checkpoint.
  pod["spec"]["terminationGracePeriodSeconds"] = plain(job.preemptible ? 120 : 30);
  if (!job.gpu_model.empty()) pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] = job.gpu_model;
  // Pack: the pods under one switch (a preferred pod affinity on the rack label); spread: on
  // different racks. auto leaves it to the scheduler (Kueue's topology-aware scheduling when a
  // queue is given: packed into one rack when it has room).
  if (job.nodes > 1 && job.placement != "auto") {
    YAML::Node term;
    term["weight"] = plain(100);
    term["podAffinityTerm"]["topologyKey"] = job.topology_key;
    term["podAffinityTerm"]["labelSelector"]["matchLabels"]["dtrain.job"] = name;
    pod["spec"]["affinity"][job.placement == "pack" ? "podAffinity" : "podAntiAffinity"]
       ["preferredDuringSchedulingIgnoredDuringExecution"]
           .push_back(term);
  }
  if (!job.partition.empty())
    pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] = job.topology_key;
  if (job.volcano) {
    pod["spec"]["schedulerName"] = "volcano";
    pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = name;
  }
  pod["spec"]["containers"].push_back(container);

  YAML::Node kjob;
  kjob["apiVersion"] = "batch/v1";
  kjob["kind"] = "Job";
  kjob["metadata"]["name"] = name;
  kjob["metadata"]["labels"] = YAML::Clone(labels);
  if (!job.partition.empty())
    kjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = job.partition;
  kjob["spec"]["completionMode"] = "Indexed";
  kjob["spec"]["completions"] = plain(job.nodes);
  kjob["spec"]["parallelism"] = plain(job.nodes);  // every node at once: a collective waits for all
  if (!job.time_limit.empty()) {
    long long seconds = 0;
    try {
      seconds = seconds_of(job.time_limit);
    } catch (const std::exception&) {
      throw InvalidArgumentError(
          fmt::format("dtrain submit: --time '{}' is too large", job.time_limit));
    }
    kjob["spec"]["activeDeadlineSeconds"] = plain(seconds);
  }
  // A failure of any other kind fails the Job at once: a pod made again cannot rejoin a running
  // group. Exit 75 (every rank saved at the same step for a requeue) makes the pods again, and
  // resumes, up to --max-restarts times (each time every pod exits 75, so each counts `nodes`
  // against the backoff limit). An eviction or preemption by the cluster never counts.
  const int restarts = job.preemptible ? job.max_restarts : 0;
  kjob["spec"]["backoffLimit"] = plain(restarts * job.nodes);
  YAML::Node fail_other;
  fail_other["action"] = "FailJob";
  fail_other["onExitCodes"]["containerName"] = "trainer";
  fail_other["onExitCodes"]["operator"] = "NotIn";
  fail_other["onExitCodes"]["values"].push_back(plain(Preemption::kRequeueExitCode));
  kjob["spec"]["podFailurePolicy"]["rules"].push_back(fail_other);
  if (job.preemptible) {
    YAML::Node requeue;
    requeue["action"] = "Count";
    requeue["onExitCodes"]["containerName"] = "trainer";
    requeue["onExitCodes"]["operator"] = "In";
    requeue["onExitCodes"]["values"].push_back(plain(Preemption::kRequeueExitCode));
    kjob["spec"]["podFailurePolicy"]["rules"].push_back(requeue);
    YAML::Node disruption;
    disruption["action"] = "Ignore";
    YAML::Node condition;
    condition["type"] = "DisruptionTarget";
    disruption["onPodConditions"].push_back(condition);
    kjob["spec"]["podFailurePolicy"]["rules"].push_back(disruption);
  }
  kjob["spec"]["template"] = pod;

  YAML::Emitter out;
  if (job.volcano) {  // before the pods that name it
    YAML::Node group;
    group["apiVersion"] = "scheduling.volcano.sh/v1beta1";
    group["kind"] = "PodGroup";
    group["metadata"]["name"] = name;
    group["metadata"]["labels"] = YAML::Clone(labels);
    group["spec"]["minMember"] = plain(job.nodes);  // all pods or none: gang scheduling
    if (!job.partition.empty()) group["spec"]["queue"] = job.partition;
    out << YAML::BeginDoc;
    emit(out, group);
  }
  out << YAML::BeginDoc;
  emit(out, service);
  out << YAML::BeginDoc;
  emit(out, kjob);
  return std::string("# Written by `dtrain submit --engine k8s` (`dtrain docs submit`).\n") +
         out.c_str() + "\n";
}

std::string submit_k8s(const Job& job, bool apply, bool dry_run) {
  const std::string manifests = k8s_manifests(job);
  if (dry_run) {
    std::fputs(manifests.c_str(), stdout);
    return job.name;
  }
  const std::string path = write_job_file(job.log_dir, job.name + ".yaml", manifests);
  if (!apply) {
    std::printf("wrote %s: apply it with `kubectl apply -f %s` (or dtrain submit --apply)\n",
                path.c_str(), path.c_str());
    return job.name;
  }
  const ShellOutput o = run_shell("kubectl apply -f " + shell_quote(path));
  if (o.status != 0)
    throw InvalidArgumentError(fmt::format(
        "dtrain submit: kubectl apply -f {} failed (exit {}): {}", path, o.status, o.text));
  std::printf("submitted job %s to Kubernetes: %d pod(s) x %d rank(s); manifests %s\n%s",
              job.name.c_str(), job.nodes, job.procs_per_node, path.c_str(), o.text.c_str());
  return job.name;
}

namespace {

void check_name(const std::string& name) {
  if (!std::regex_match(name, std::regex("[a-z0-9]([-a-z0-9]*[a-z0-9])?")))
    throw InvalidArgumentError(fmt::format("dtrain: '{}' is not a job name", name));
}

void kubectl(const std::string& args, const char* what) {
  const ShellOutput o = run_shell("kubectl " + args);
  std::fputs(o.text.c_str(), stdout);
  if (o.status != 0)
    throw InvalidArgumentError(
        fmt::format("dtrain {}: kubectl {} failed (exit {})", what, args, o.status));
}

}  // namespace

void k8s_jobs() { kubectl("get jobs -l dtrain.job -o wide", "jobs"); }

void k8s_logs(const std::string& name) {
  check_name(name);
  kubectl(fmt::format("logs -l dtrain.job={} --prefix --tail=-1 --max-log-requests=64", name),
          "logs");
}

void k8s_cancel(const std::string& name) {
  check_name(name);
  kubectl(fmt::format("delete job,service -l dtrain.job={}", name), "cancel");
  // A Volcano PodGroup, where the cluster has Volcano; nothing to say where it has not.
  run_shell(fmt::format(
      "kubectl delete podgroups.scheduling.volcano.sh -l dtrain.job={} --ignore-not-found", name));
}

}  // namespace dtrain::submit
