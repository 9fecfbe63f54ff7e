// The one table of environment variables dtrain reads. Each is declared here once, with its
// default and a line of help; `dtrain env` prints the table and docs/env.md is checked against it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace dtrain::env {

struct Var {
  std::string_view name;
  std::string_view default_value;  // "" = unset by default
  std::string_view help;
};

// X(identifier, NAME, default, help)
#define DTRAIN_ENV_VARS(X)                                                                         \
  X(kRank, "RANK", "", "This process's global rank (torchrun convention; set by `dtrain run`).")   \
  X(kWorldSize, "WORLD_SIZE", "", "Number of processes in the job.")                               \
  X(kLocalRank, "LOCAL_RANK", "", "Rank of this process on its node.")                             \
  X(kLocalWorldSize, "LOCAL_WORLD_SIZE", "", "Number of processes on this node.")                  \
  X(kOmpNumThreads, "OMP_NUM_THREADS", "",                                                         \
    "LibTorch and OpenBLAS threads per process; unset: the CPUs it is bound to, else cores / "     \
    "local ranks.")                                                                                \
  X(kNodeRank, "NODE_RANK", "", "Index of this node in the job.")                                  \
  X(kGroupRank, "GROUP_RANK", "",                                                                  \
    "Index of this node in the job as torchrun names it (NODE_RANK wins when both are set).")      \
  X(kGroupWorldSize, "GROUP_WORLD_SIZE", "",                                                       \
    "Number of nodes in the job (set by `dtrain run`, as torchrun does).")                         \
  X(kRestartCount, "DTRAIN_RESTART_COUNT", "0",                                                    \
    "Restarts after failures so far, set for the workers by elastic `dtrain run` (0 in the first " \
    "round); resume from your checkpoint when above 0.")                                           \
  X(kTorchelasticRestartCount, "TORCHELASTIC_RESTART_COUNT", "0",                                  \
    "torchrun's name for DTRAIN_RESTART_COUNT, set alongside it.")                                 \
  X(kTorchelasticMaxRestarts, "TORCHELASTIC_MAX_RESTARTS", "",                                     \
    "The job's --max-restarts (0 when not elastic), set for the workers by `dtrain run`.")         \
  X(kTorchelasticRunId, "TORCHELASTIC_RUN_ID", "",                                                 \
    "The job's --rdzv-id (DTRAIN_JOB_ID when not elastic), set for the workers by `dtrain run`.")  \
  X(kTorchelasticUseAgentStore, "TORCHELASTIC_USE_AGENT_STORE", "",                                \
    "True for the workers of `dtrain run`: torch's init_process_group then connects to the "       \
    "launcher's store on MASTER_PORT (which speaks torch's protocol too), as under torchrun, "     \
    "instead of hosting its own.")                                                                 \
  X(kCommitDir, "DTRAIN_COMMIT_DIR", "",                                                           \
    "A node-local directory in memory (/dev/shm) for in-memory commits, created for its workers "  \
    "by elastic `dtrain run` and removed when it exits; the node's lowest local rank commits "     \
    "there (train_fashion_mnist --commit-every).")                                                 \
  X(kMasterAddr, "MASTER_ADDR", "",                                                                \
    "Host of the rendezvous store. Unset under mpirun: rank 0 publishes its store through MPI "    \
    "when the program links the MPI backend, 127.0.0.1 on one node otherwise (`dtrain docs "       \
    "deploy`).")                                                                                   \
  X(kMasterPort, "MASTER_PORT", "29500", "Port of the rendezvous store.")                          \
  X(kOmpiRank, "OMPI_COMM_WORLD_RANK", "", "Rank under OpenMPI's mpirun.")                         \
  X(kOmpiSize, "OMPI_COMM_WORLD_SIZE", "", "World size under OpenMPI's mpirun.")                   \
  X(kOmpiLocalRank, "OMPI_COMM_WORLD_LOCAL_RANK", "", "Local rank under OpenMPI's mpirun.")        \
  X(kOmpiLocalSize, "OMPI_COMM_WORLD_LOCAL_SIZE", "", "Local size under OpenMPI's mpirun.")        \
  X(kOmpiNodeRank, "OMPI_COMM_WORLD_NODE_RANK", "", "Node rank under OpenMPI's mpirun.")           \
  X(kPmiRank, "PMI_RANK", "", "Rank under a PMI launcher (MPICH, Intel MPI).")                     \
  X(kPmiSize, "PMI_SIZE", "", "World size under a PMI launcher.")                                  \
  X(kMpiLocalRankId, "MPI_LOCALRANKID", "",                                                        \
    "Local rank under a PMI launcher (MPICH Hydra, Intel MPI).")                                   \
  X(kMpiLocalNRanks, "MPI_LOCALNRANKS", "",                                                        \
    "Number of processes on this node under a PMI launcher.")                                      \
  X(kSlurmProcId, "SLURM_PROCID", "", "Rank of a Slurm task.")                                     \
  X(kSlurmNTasks, "SLURM_NTASKS", "", "Number of tasks of a Slurm step.")                          \
  X(kSlurmLocalId, "SLURM_LOCALID", "", "Local rank of a Slurm task on its node.")                 \
  X(kSlurmNodeId, "SLURM_NODEID", "", "Node index of a Slurm task.")                               \
  X(kSlurmNodeList, "SLURM_JOB_NODELIST", "",                                                      \
    "Slurm's compressed host list; its first host is the master.")                                 \
  X(kSlurmTasksPerNode, "SLURM_TASKS_PER_NODE", "", "Slurm's tasks per node, e.g. 4(x2),3.")       \
  X(kSlurmStepNodeList, "SLURM_STEP_NODELIST", "",                                                 \
    "The hosts of an srun step (wins over SLURM_JOB_NODELIST: a step may use part of the job's "   \
    "nodes).")                                                                                     \
  X(kSlurmStepTasksPerNode, "SLURM_STEP_TASKS_PER_NODE", "",                                       \
    "An srun step's tasks per node (wins over SLURM_TASKS_PER_NODE).")                             \
  X(kJobCompletionIndex, "JOB_COMPLETION_INDEX", "",                                               \
    "Pod index of a Kubernetes Indexed Job (the rank).")                                           \
  X(kTfConfig, "TF_CONFIG", "",                                                                    \
    "TensorFlow's cluster JSON; the task index in the worker list is the rank.")                   \
  X(kGpuTopology, "DTRAIN_GPU_TOPOLOGY", "",                                                       \
    "A file holding this node's `nvidia-smi topo -m` output, read by `dtrain run "                 \
    "--gpus-per-proc` instead of running nvidia-smi.")                                             \
  X(kProgressDir, "DTRAIN_PROGRESS_DIR", "",                                                       \
    "Set by `dtrain run --metrics-port`: where each rank's ProgressReporter leaves its latest "    \
    "step report (rank<r>.progress) for the launcher's Prometheus endpoint.")                      \
  X(kQueueDir, "DTRAIN_QUEUE_DIR", "",                                                             \
    "The queue of `dtrain submit --engine local` (default ~/.local/state/dtrain/queue).")          \
  X(kJobId, "DTRAIN_JOB_ID", "dtrain",                                                             \
    "Job identity checked in every handshake; connections of other jobs are refused.")             \
  X(kAuthToken, "DTRAIN_AUTH_TOKEN", "",                                                           \
    "Shared secret: when set, every store and data connection must prove it (HMAC-SHA256 "         \
    "challenge-response).")                                                                        \
  X(kTimeout, "DTRAIN_TIMEOUT", "300",                                                             \
    "Default timeout in seconds of every operation of a process group.")                           \
  X(kConnectTimeout, "DTRAIN_CONNECT_TIMEOUT", "60",                                               \
    "Seconds allowed for rendezvous: reaching the store and connecting to every peer.")            \
  X(kSocketAddr, "DTRAIN_SOCKET_ADDR", "",                                                         \
    "Address this process publishes for its peers (default: the local address that routes to the " \
    "store).")                                                                                     \
  X(kSpinUs, "DTRAIN_SPIN_US", "50",                                                               \
    "Microseconds a waiting thread busy-polls before it sleeps (0 = never spin).")                 \
  X(kTransport, "DTRAIN_TRANSPORT", "auto",                                                        \
    "auto: shared memory between ranks on one host, TCP otherwise; tcp: TCP only; shm: like "      \
    "auto, but failing to set up shared memory is an error.")                                      \
  X(kCma, "DTRAIN_CMA", "1",                                                                       \
    "Shared memory: move large messages in one copy with cross-memory attach (process_vm_readv) "  \
    "where permitted; 0 = always through the ring.")                                               \
  X(kDirectClaims, "DTRAIN_DIRECT_CLAIMS", "1",                                                    \
    "Shared memory, `direct` all-reduce: the ranks take chunks from a counter they share, so "     \
    "that a rank with a core to itself takes more of the work; 0 = each rank reduces its own 1/N " \
    "slice.")                                                                                      \
  X(kAgentStore, "DTRAIN_AGENT_STORE", "0",                                                        \
    "1 when the launcher hosts the store at MASTER_ADDR:MASTER_PORT; 0 makes rank 0 host it.")     \
  X(kBackend, "DTRAIN_BACKEND", "native",                                                          \
    "Backend of every process group: native, gloo, mpi (under mpirun) or nccl (see "               \
    "`dtrain docs backends`).")                                                                    \
  X(kAlgo, "DTRAIN_ALGO", "",                                                                      \
    "Force collective algorithms: `ring`, or per collective "                                      \
    "`allreduce=halving_doubling,broadcast=tree` (`dtrain docs algorithms`).")                     \
  X(kCostFile, "DTRAIN_COST_FILE", "",                                                             \
    "The cost model's link constants, as `dtrain bench allreduce --calibrate FILE` writes them "   \
    "(`dtrain docs scaling`); a file that is missing or corrupt is reported and the links are "    \
    "measured "                                                                                    \
    "at start-up instead.")                                                                        \
  X(kRack, "DTRAIN_RACK", "",                                                                      \
    "The rack (switch) of this process's host, for the topology-aware collectives (wins over "     \
    "DTRAIN_TOPOLOGY).")                                                                           \
  X(kTopology, "DTRAIN_TOPOLOGY", "",                                                              \
    "A JSON file {\"racks\": {\"RACK\": [\"HOST or ADDRESS\", ...]}} saying which hosts share a "  \
    "rack (`dtrain docs algorithms`).")                                                            \
  X(kCostAlphaUs, "DTRAIN_COST_ALPHA_US", "",                                                      \
    "Cost model: microseconds per message (overrides the file).")                                  \
  X(kCostBetaGbps, "DTRAIN_COST_BETA_GBPS", "",                                                    \
    "Cost model: GB/s on the wire (overrides the file).")                                          \
  X(kCostGammaGbps, "DTRAIN_COST_GAMMA_GBPS", "",                                                  \
    "Cost model: GB/s of reduction (overrides the file).")                                         \
  X(kStragglerSeconds, "DTRAIN_STRAGGLER_SECONDS", "10",                                           \
    "Report interval of waits: a collective (lowest waiting rank: who has not arrived), the "      \
    "rendezvous (rank 0: who has not registered), reaching the store. 0 = silent.")                \
  X(kFlightRecorder, "DTRAIN_FLIGHT_RECORDER", "2000",                                             \
    "Calls each thread that calls keeps in the flight recorder (collectives and point to point; "  \
    "rounded up to a power of two), dumped on a failure, a timeout or SIGUSR2 for `dtrain "        \
    "doctor`. 0 = off.")                                                                           \
  X(kFlightDir, "DTRAIN_FLIGHT_DIR", "",                                                           \
    "Where flight records are dumped (rank<r>.json); set by `dtrain run`. Unset: "                 \
    "$TMPDIR/dtrain-flight.")                                                                      \
  X(kLive, "DTRAIN_LIVE", "0",                                                                     \
    "Set to 1 for the workers by `dtrain run --live`: when a peer dies, programs that support "    \
    "live recovery (train_fashion_mnist, dtrain::LiveWorld) re-form their group without it and "   \
    "go on instead of failing.")                                                                   \
  X(kLiveReplacement, "DTRAIN_LIVE_REPLACEMENT", "0",                                              \
    "Set to 1 by `dtrain run --live --replace N` for a worker started in a dead one's place: it "  \
    "asks the live workers to take it in at their next step boundary and receives the training "   \
    "state from them.")                                                                            \
  X(kLiveSpare, "DTRAIN_LIVE_SPARE", "",                                                           \
    "Set by `dtrain run --live --spares K` to a spare's number (1, 2, ...): started ahead with "   \
    "no place, it builds what it can and waits until its launcher gives it a dead worker's rank, " \
    "then joins as a replacement does.")                                                           \
  X(kSampleLog, "DTRAIN_SAMPLE_LOG", "",                                                           \
    "train_fashion_mnist's --sample-log when the flag is not given: a file to which every rank "   \
    "appends `epoch index step restart` per trained sample; set by `dtrain chaos`, which counts "  \
    "samples lost and repeated from it.")                                                          \
  X(kHangSeconds, "DTRAIN_HANG_SECONDS", "60",                                                     \
    "`dtrain run` calls a job stuck when a rank has waited in a call this long with no rank "      \
    "completing one: it dumps every rank's flight record, prints `dtrain doctor`'s diagnosis and " \
    "stops the job. 0 = never.")                                                                   \
  X(kTimeline, "DTRAIN_TIMELINE", "",                                                              \
    "Chrome-trace events of DDP and the distributed optimizer: trace.json makes rank r write "     \
    "trace.rank<r>.json.")                                                                         \
  X(kCycleTimeMs, "DTRAIN_CYCLE_TIME_MS", "1",                                                     \
    "Python, `dtrain.torch` (Horovod's API): how often the coordinator looks for ready tensors, "  \
    "0.01 to 1000 ms (`HOROVOD_CYCLE_TIME` when unset).")                                          \
  X(kFusionThreshold, "DTRAIN_FUSION_THRESHOLD", "67108864",                                       \
    "Python, `dtrain.torch`: bytes per fused all-reduce buffer, up to 1 TiB "                      \
    "(`HOROVOD_FUSION_THRESHOLD` when unset).")                                                    \
  X(kStallTimeout, "DTRAIN_STALL_TIMEOUT", "60",                                                   \
    "Python, `dtrain.torch`: seconds (0.001 to a day) a tensor may be ready on some ranks and "    \
    "missing on others before every rank fails naming it (`HOROVOD_STALL_SHUTDOWN_TIME_SECONDS` "  \
    "when unset).")                                                                                \
  X(kRole, "DTRAIN_ROLE", "",                                                                      \
    "Parameter-server jobs: worker, server or scheduler (set by `dtrain run --servers`).")         \
  X(kNumServers, "DTRAIN_NUM_SERVERS", "", "Parameter-server jobs: number of server processes.")   \
  X(kNumWorkers, "DTRAIN_NUM_WORKERS", "",                                                         \
    "Parameter-server jobs: number of workers (default WORLD_SIZE).")                              \
  X(kPsIndex, "DTRAIN_PS_INDEX", "",                                                               \
    "Parameter-server jobs: this server's index (workers use RANK).")                              \
  X(kPsCheckpointDir, "DTRAIN_PS_CHECKPOINT_DIR", "",                                              \
    "Parameter servers write checkpoints of their tables to DIR/server-<index>/.")                 \
  X(kPsCheckpointEvery, "DTRAIN_PS_CHECKPOINT_EVERY", "0",                                         \
    "Seconds between a parameter server's scheduled checkpoints (0 = only on request).")           \
  X(kPsRestore, "DTRAIN_PS_RESTORE", "0",                                                          \
    "1: a parameter server starts from the newest good checkpoint in its directory.")              \
  X(kDmlcRole, "DMLC_ROLE", "", "ps-lite / BytePS: worker, server or scheduler.")                  \
  X(kDmlcNumServer, "DMLC_NUM_SERVER", "", "ps-lite / BytePS: number of servers.")                 \
  X(kDmlcNumWorker, "DMLC_NUM_WORKER", "", "ps-lite / BytePS: number of workers.")                 \
  X(kDmlcRootUri, "DMLC_PS_ROOT_URI", "",                                                          \
    "ps-lite / BytePS: the scheduler's address (dtrain hosts its store there).")                   \
  X(kDmlcRootPort, "DMLC_PS_ROOT_PORT", "", "ps-lite / BytePS: the scheduler's port.")             \
  X(kLogLevel, "DTRAIN_LOG_LEVEL", "info", "trace, debug, info, warn, error or off.")

#define DTRAIN_ENV_DECLARE(id, name, def, help) inline constexpr Var id{name, def, help};
DTRAIN_ENV_VARS(DTRAIN_ENV_DECLARE)
#undef DTRAIN_ENV_DECLARE

// Every variable of the table, in declaration order.
std::span<const Var> all();

// The raw value, or nullopt when unset (an empty value counts as unset).
std::optional<std::string> raw(const Var& var);
// The value, or the variable's default.
std::string get_string(const Var& var);
// Parsed values; a value that does not parse throws InvalidArgumentError naming the variable.
std::optional<int64_t> get_int(const Var& var);
double get_double(const Var& var);
bool get_bool(const Var& var);
std::chrono::milliseconds get_seconds(const Var& var);

// Parses an integer from a named source; used for environment values and flags alike.
int64_t parse_int(std::string_view source, std::string_view text);
// `s` seconds from a named source (a variable or a flag) as a duration: InvalidArgumentError
// naming the source unless it is finite and from 0 to a year.
std::chrono::milliseconds seconds(std::string_view source, double s);

}  // namespace dtrain::env
