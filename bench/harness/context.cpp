// Implementation of the run context (see context.h).
#include "collectives/mpi_error.h"
#include "bench/harness/context.h"

#include <hdf5.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "bench/harness/cli.h"
#include "build_info.h"
#include "git_commit.h"
#include "kernels/blas.h"
#include "collectives/nccl_backend.h"
#include "kernels/cuda_info.h"

extern char** environ;

namespace strata {

std::string command_line(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    bool plain = !arg.empty() && arg.find_first_of(" \t\"'$\\") == std::string::npos;
    if (i) line += ' ';
    if (plain) {
      line += arg;
    } else {
      line += '\'';
      line += arg;
      line += '\'';
    }
  }
  return line;
}

std::string cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

namespace {

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

std::string hostname() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  STRATA_MPI_CHECK(MPI_Get_processor_name(name, &length));
  return std::string(name, static_cast<size_t>(length));
}

std::string getenv_or(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// How the ranks were started: Slurm's srun, an mpirun (Open MPI, MPICH/Hydra), or a lone process.
std::string detect_launcher() {
  if (std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_PROCID") && !std::getenv("OMPI_COMM_WORLD_SIZE"))
    return "srun";
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return std::getenv("SLURM_JOB_ID") ? "mpirun (in Slurm job)" : "mpirun";
  if (std::getenv("PMI_RANK") || std::getenv("PMIX_RANK")) return std::getenv("SLURM_JOB_ID") ? "srun" : "mpiexec";
  return "singleton";
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  STRATA_MPI_CHECK(MPI_Get_library_version(text, &length));
  std::string version(text, static_cast<size_t>(length));
  while (!version.empty() && (version.back() == '\n' || version.back() == '\0')) version.pop_back();
  return version;
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::string load_average() {
  double loads[3] = {0, 0, 0};
  if (getloadavg(loads, 3) != 3) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", loads[0], loads[1], loads[2]);
  return text;
}

}  // namespace

RunContext collect_context(int argc, const char* const* argv, const std::string& device) {
  RunContext ctx;
  MPI_Comm world = MPI_COMM_WORLD;
  int rank = world_rank();
  ctx.n_ranks = world_size();

  // Nodes: ranks sharing memory, numbered in the order of their lowest world rank.
  const std::vector<int> node_of_rank = shared_memory_node_of_rank();
  ctx.n_nodes = *std::max_element(node_of_rank.begin(), node_of_rank.end()) + 1;
  Comm node = split_shared_memory(world);

  std::vector<int> cpus = affinity_cpus();
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  ctx.self.rank = rank;
  ctx.self.host = hostname();
  ctx.self.node_index = node_of_rank[static_cast<size_t>(rank)];
  ctx.self.local_rank = node.rank();
  ctx.self.ranks_on_node = node.size();
  ctx.self.affinity = cpu_list(cpus);
  ctx.self.device = device;

  // Oversubscribed: more ranks on a node than CPUs online there.
  int over = ctx.self.ranks_on_node > online ? 1 : 0, any_over = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&over, &any_over, 1, MPI_INT, MPI_MAX, world));
  ctx.oversubscribed = any_over != 0;

  // Gather the placements as tab-separated lines.
  std::string mine = std::to_string(ctx.self.node_index) + "\t" + std::to_string(ctx.self.local_rank) + "\t" +
                     std::to_string(ctx.self.ranks_on_node) + "\t" + ctx.self.host + "\t" + ctx.self.affinity +
                     "\t" + ctx.self.device;
  std::vector<std::string> lines = gather_strings(world, mine);
  std::string load = load_average();
  std::vector<std::string> loads = gather_strings(world, load);
  // Measured after the load average was read, so that figure shows the machine as the job found it.
  ctx.machine = node_machine(world);
  ctx.blas_core = blas_core_choice();
  std::vector<std::string> machines =
      gather_strings(world, ctx.self.local_rank == 0 ? to_json(ctx.machine.description).dump() : std::string());
  if (rank != 0) {
    ctx.ranks = {ctx.self};
    return ctx;
  }

  std::vector<std::string> node_hosts(static_cast<size_t>(ctx.n_nodes));
  std::vector<int> per_node(static_cast<size_t>(ctx.n_nodes), 0);
  std::vector<std::string> node_loads(static_cast<size_t>(ctx.n_nodes));
  for (int r = 0; r < ctx.n_ranks; ++r) {
    std::vector<std::string> f = split(lines[static_cast<size_t>(r)], '\t');
    f.resize(6);
    RankPlacement p{r, f[3], std::stoi(f[0]), std::stoi(f[1]), std::stoi(f[2]), f[4], f[5]};
    ctx.ranks.push_back(p);
    per_node[static_cast<size_t>(p.node_index)]++;
    if (p.local_rank == 0) {
      node_hosts[static_cast<size_t>(p.node_index)] = p.host;
      node_loads[static_cast<size_t>(p.node_index)] = loads[static_cast<size_t>(r)];
    }
  }
  bool even = std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; });
  for (size_t n = 0; n < per_node.size(); ++n)
    ctx.ranks_per_node += (n ? "," : "") + std::to_string(per_node[n]);  // e.g. "2,1"
  if (even) ctx.ranks_per_node = std::to_string(per_node[0]);

  auto& a = ctx.run_attrs;
  a["command_line"] = command_line(argc, argv);
  a["launcher"] = detect_launcher();
  a["slurm_job_id"] = getenv_or("SLURM_JOB_ID");
  a["slurm_nodelist"] = getenv_or("SLURM_JOB_NODELIST", getenv_or("SLURM_NODELIST"));
  a["slurm_tasks_per_node"] = getenv_or("SLURM_TASKS_PER_NODE");
  a["n_nodes"] = std::to_string(ctx.n_nodes);
  a["n_ranks"] = std::to_string(ctx.n_ranks);
  a["ranks_per_node"] = ctx.ranks_per_node;
  a["hosts"] = nlohmann::json(node_hosts).dump();

  auto& e = ctx.env;
  e["hosts"] = a["hosts"];
  e["load_average_at_start"] = nlohmann::json(node_loads).dump();  // per node: 1, 5, 15 minutes
  e["cpus_online"] = std::to_string(online);
  e["oversubscribed"] = ctx.oversubscribed ? "yes" : "no";
  e["mpi_library"] = mpi_library_version();
  e["mpi_cuda_aware"] = mpi_cuda_awareness();
  e["hdf5"] = hdf5_version();
  e["blas_config"] = blas::config();
  e["blas_corename"] = blas::corename();
  e["blas_threads_per_rank"] = std::to_string(blas::threads());
  e["cpu_model"] = ctx.machine.description.cpu.model_name;
  nlohmann::json all_nodes = nlohmann::json::array();
  for (const std::string& m : machines)
    if (!m.empty()) all_nodes.push_back(nlohmann::json::parse(m));
  add_machine_env(e, ctx.machine, ctx.blas_core, all_nodes.dump());
  e["compiler"] = STRATA_BUILD_COMPILER;
  e["cxx_flags"] = STRATA_BUILD_CXX_FLAGS;
  e["build_type"] = STRATA_BUILD_TYPE;
  e["sanitizers"] = STRATA_BUILD_SANITIZE;
  e["git_commit"] = STRATA_GIT_COMMIT;
  e["command_line"] = a["command_line"];
#ifdef STRATA_HAVE_CUDA
  e["cuda_architectures"] = STRATA_BUILD_CUDA_ARCHITECTURES;
  for (const auto& [name, value] : cuda::versions()) e[name] = value;
  e["nccl"] = coll::nccl_version();
#else
  e["cuda_runtime"] = "not built";
#endif
  for (char** var = environ; *var; ++var) {
    std::string entry = *var;
    // Slurm's job description, and the knobs that choose MPI's and NCCL's algorithms and transports.
    bool recorded = entry.rfind("SLURM_", 0) == 0 || entry.rfind("OMPI_MCA_", 0) == 0 || entry.rfind("NCCL_", 0) == 0 ||
                    entry.rfind("UCX_", 0) == 0;
    if (!recorded) continue;
    auto eq = entry.find('=');
    e[entry.substr(0, eq)] = eq == std::string::npos ? "" : entry.substr(eq + 1);
  }
  return ctx;
}

}  // namespace strata
