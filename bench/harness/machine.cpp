// Implementation of the per-node machine description (see machine.h).
#include "bench/harness/machine.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "collectives/mpi.h"
#include "build_info.h"
#include "kernels/blas.h"

namespace strata {

namespace {

using nlohmann::json;

// 2: the peak, the clock and the GEMM probe are the best of their trials (1: the median). The fields are those of
// format 1, which results files written before still hold and calibrate still reads; the cache key holds the format,
// so a cached format-1 description is measured again.
constexpr int kFormat = 2;
constexpr int kOldestReadFormat = 1;
constexpr double kCacheLifetimeSeconds = 24 * 3600;

// `failure` is written for the reader; it is derived again from the figures, the clock and the CPU on reading.
json peak_json(const PeakFigure& p) {
  return {{"one_core", p.one_core}, {"all_cores", p.all_cores}, {"cores", p.cores}, {"kernel", p.kernel},
          {"failure", p.failure}};
}

PeakFigure peak_from(const json& j) {
  return {j.at("one_core").get<double>(), j.at("all_cores").get<double>(), j.at("cores").get<int>(),
          j.at("kernel").get<std::string>(), ""};
}

CpuFeatures cpu_from(const json& j) {
  CpuFeatures cpu;
  cpu.vendor = j.at("vendor").get<std::string>();
  cpu.model_name = j.at("model_name").get<std::string>();
  cpu.family = j.at("family").get<int>();
  cpu.model = j.at("model").get<int>();
  std::istringstream flags(j.at("flags").get<std::string>());
  for (std::string flag; flags >> flag;) {
    bool* field = flag == "sse2"          ? &cpu.sse2
                  : flag == "avx"         ? &cpu.avx
                  : flag == "avx2"        ? &cpu.avx2
                  : flag == "fma"         ? &cpu.fma
                  : flag == "avx512f"     ? &cpu.avx512f
                  : flag == "avx512dq"    ? &cpu.avx512dq
                  : flag == "avx512bw"    ? &cpu.avx512bw
                  : flag == "avx512vl"    ? &cpu.avx512vl
                  : flag == "avx512_bf16" ? &cpu.avx512_bf16
                  : flag == "avx512_fp16" ? &cpu.avx512_fp16
                  : flag == "amx_bf16"    ? &cpu.amx_bf16
                  : flag == "neon"        ? &cpu.neon
                  : flag == "hypervisor"  ? &cpu.hypervisor
                                          : nullptr;
    if (field) *field = true;
  }
  return cpu;
}

std::string utc_text(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// A stable 64-bit hash (FNV-1a), so cache names do not depend on the standard library's std::hash.
std::string fnv1a_hex(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

// Everything a cached description depends on: another CPU, library, build or job measures again.
std::string cache_key(const CpuFeatures& cpu) {
  std::string key = "format " + std::to_string(kFormat) + "|" + host_name() + "|" + cpu.model_name + "|" +
                    std::to_string(cpu.family) + "/" + std::to_string(cpu.model) + "|" + cpu.flags_text() + "|" +
                    blas::config() + "|" + blas::corename();
  for (cpu_gemm::Backend b : cpu_gemm::available_backends()) key += "|" + cpu_gemm::library(b) + " " + cpu_gemm::kernel(b);
  key += std::string("|") + STRATA_BUILD_TYPE + "|" + STRATA_BUILD_SANITIZE;
  if (const char* job = std::getenv("SLURM_JOB_ID")) key += std::string("|slurm job ") + job;
  return key;
}

std::string cache_folder() {
  if (const char* dir = std::getenv("STRATA_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/strata";
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/strata";
  return "/tmp/strata-cache-" + std::to_string(getuid());
}

// The node leader's answer: the description wrapped with where it came from, or an error to rethrow.
json describe_this_node() {
  const std::string mode = std::getenv("STRATA_MACHINE_CACHE") ? std::getenv("STRATA_MACHINE_CACHE") : "";
  const CpuFeatures cpu = detect_cpu_features();
  const std::string key = cache_key(cpu);
  const std::string path = machine_cache_path(cpu);
  const std::time_t now = std::time(nullptr);
  if (mode != "off" && mode != "refresh") {
    std::ifstream in(path);
    if (in) {
      try {
        json cached = json::parse(in);
        const double age = static_cast<double>(now - cached.at("measured_epoch").get<std::time_t>());
        if (cached.at("key").get<std::string>() == key && age >= 0 && age < kCacheLifetimeSeconds) {
          machine_from_json(cached.at("machine"));  // a malformed entry is measured again below
          cached["source"] = "cache " + path;
          return cached;
        }
      } catch (const std::exception&) {
        // Unreadable or from another format: measure again and replace it.
      }
    }
  }
  json entry = {{"key", key},
                {"measured_epoch", now},
                {"measured_utc", utc_text(now)},
                {"machine", to_json(measure_machine())},
                {"source", "measured now"}};
  if (mode != "off") {
    std::error_code error;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
    const std::string temporary = path + ".tmp." + std::to_string(getpid());
    std::ofstream out(temporary);
    out << entry.dump(1) << "\n";
    out.close();
    if (!out || std::rename(temporary.c_str(), path.c_str()) != 0) {
      std::remove(temporary.c_str());
      entry["source"] = "measured now (cache " + path + " not writable)";
    } else {
      entry["source"] = "measured now, cached in " + path;
    }
  }
  return entry;
}

// A barrier whose waiting ranks sleep instead of spinning, so they leave the cores to the node's
// measurement.
void sleeping_barrier(MPI_Comm comm) {
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibarrier(comm, &request));
  for (int done = 0;;) {
    STRATA_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

}  // namespace

json to_json(const MachineDescription& m) {
  json gemm = json::array();
  for (const auto& g : m.gemm)
    gemm.push_back({{"backend", cpu_gemm::name(g.backend)}, {"library", g.library}, {"kernel", g.kernel},
                    {"fp32_rate", g.fp32_rate}});
  const auto& t = m.topology;
  return {
      {"format", kFormat},
      {"cpu",
       {{"vendor", m.cpu.vendor}, {"model_name", m.cpu.model_name}, {"family", m.cpu.family}, {"model", m.cpu.model},
        {"flags", m.cpu.flags_text()}}},
      {"topology",
       {{"packages", t.packages}, {"numa_nodes", t.numa_nodes}, {"cores", t.cores},
        {"hardware_threads", t.hardware_threads}, {"l1d_bytes", t.l1d_bytes}, {"l2_bytes", t.l2_bytes},
        {"l3_bytes", t.l3_bytes}, {"l3_instances", t.l3_instances}, {"one_cpu_per_core", t.one_cpu_per_core},
        {"source", t.source}}},
      {"peak",
       {{"units", "FLOP/s"},
        {"method", "best of trials of independent FMA (bf16: dot-product) chains, one thread per core"},
        {"fp32", peak_json(m.fp32)},
        {"fp64", peak_json(m.fp64)},
        {"bf16", peak_json(m.bf16)}}},
      {"clock", {{"imul_chain_hz", m.clock_hz}, {"agrees_with_fp32_peak", m.clock_agrees}}},
      {"memory",
       {{"units", "B/s"},
        {"convention", "STREAM byte counts: copy 16 B, triad 24 B per element; median of trials"},
        {"array_bytes", m.memory.array_bytes},
        {"cores", m.memory.cores},
        {"copy", {{"one_core", m.memory.copy.one_core}, {"all_cores", m.memory.copy.all_cores}}},
        {"triad", {{"one_core", m.memory.triad.one_core}, {"all_cores", m.memory.triad.all_cores}}}}},
      {"gemm",
       {{"probe_size", m.gemm_probe_size},
        {"units", "FLOP/s"},
        {"backends", gemm},
        {"default", cpu_gemm::name(m.default_gemm)},
        {"rule", "the fastest FP32 rate on a probe_size^3 GEMM, one thread, best of rounds of every library in turn; "
                 "fp64 always openblas"}}},
      {"measure_seconds", m.measure_seconds},
  };
}

MachineDescription machine_from_json(const json& j) {
  try {
    if (const int format = j.at("format").get<int>(); format < kOldestReadFormat || format > kFormat)
      throw std::runtime_error("format " + j.at("format").dump());
    MachineDescription m;
    m.cpu = cpu_from(j.at("cpu"));
    const json& t = j.at("topology");
    m.topology.packages = t.at("packages").get<int>();
    m.topology.numa_nodes = t.at("numa_nodes").get<int>();
    m.topology.cores = t.at("cores").get<int>();
    m.topology.hardware_threads = t.at("hardware_threads").get<int>();
    m.topology.l1d_bytes = t.at("l1d_bytes").get<int64_t>();
    m.topology.l2_bytes = t.at("l2_bytes").get<int64_t>();
    m.topology.l3_bytes = t.at("l3_bytes").get<int64_t>();
    m.topology.l3_instances = t.at("l3_instances").get<int>();
    m.topology.one_cpu_per_core = t.at("one_cpu_per_core").get<std::vector<int>>();
    m.topology.source = t.at("source").get<std::string>();
    const json& p = j.at("peak");
    m.fp32 = peak_from(p.at("fp32"));
    m.fp64 = peak_from(p.at("fp64"));
    m.bf16 = peak_from(p.at("bf16"));
    m.clock_hz = j.at("clock").at("imul_chain_hz").get<double>();
    judge_peaks(m);
    const json& mem = j.at("memory");
    m.memory.array_bytes = mem.at("array_bytes").get<int64_t>();
    m.memory.cores = mem.at("cores").get<int>();
    m.memory.copy = {mem.at("copy").at("one_core").get<double>(), mem.at("copy").at("all_cores").get<double>()};
    m.memory.triad = {mem.at("triad").at("one_core").get<double>(), mem.at("triad").at("all_cores").get<double>()};
    const json& g = j.at("gemm");
    m.gemm_probe_size = g.at("probe_size").get<int64_t>();
    for (const json& b : g.at("backends")) {
      auto backend = cpu_gemm::parse_backend(b.at("backend").get<std::string>());
      if (!backend) throw std::runtime_error("unknown GEMM backend " + b.at("backend").dump());
      m.gemm.push_back({*backend, b.at("library").get<std::string>(), b.at("kernel").get<std::string>(),
                        b.at("fp32_rate").get<double>()});
    }
    auto default_backend = cpu_gemm::parse_backend(g.at("default").get<std::string>());
    if (!default_backend) throw std::runtime_error("unknown default GEMM backend " + g.at("default").dump());
    m.default_gemm = *default_backend;
    m.measure_seconds = j.at("measure_seconds").get<double>();
    return m;
  } catch (const json::exception& e) {
    throw std::runtime_error(std::string("machine description: ") + e.what());
  }
}

std::string machine_cache_path(const CpuFeatures& cpu) {
  return cache_folder() + "/machine-" + host_name() + "-" + fnv1a_hex(cache_key(cpu)) + ".json";
}

NodeMachine node_machine(MPI_Comm world) {
  Comm node = split_shared_memory(world);
  std::string text;
  if (node.rank() == 0) {
    try {
      text = describe_this_node().dump();
    } catch (const std::exception& e) {
      text = json{{"error", e.what()}}.dump();
    }
  }
  sleeping_barrier(node.get());
  text = broadcast_string(node.get(), text);
  json entry = json::parse(text);
  if (entry.contains("error"))
    throw RuntimeError("measuring the machine failed: " + entry.at("error").get<std::string>());
  return {machine_from_json(entry.at("machine")), entry.at("source").get<std::string>(),
          entry.at("measured_utc").get<std::string>()};
}

void add_machine_env(std::map<std::string, std::string>& env, const NodeMachine& node, const BlasCoreChoice& core,
                     const std::string& all_nodes_json) {
  const MachineDescription& m = node.description;
  env["cpu_vendor"] = m.cpu.vendor;
  env["cpu_family_model"] = std::to_string(m.cpu.family) + "/" + std::to_string(m.cpu.model);
  env["cpu_flags"] = m.cpu.flags_text();
  env["cores_per_node"] = std::to_string(m.topology.cores);
  env["hardware_threads_per_node"] = std::to_string(m.topology.hardware_threads);
  env["numa_nodes"] = std::to_string(m.topology.numa_nodes);
  env["cache_l1d_bytes"] = std::to_string(m.topology.l1d_bytes);
  env["cache_l2_bytes"] = std::to_string(m.topology.l2_bytes);
  env["cache_l3_bytes"] = std::to_string(m.topology.l3_bytes);
  env["cache_l3_instances"] = std::to_string(m.topology.l3_instances);
  env["topology_source"] = m.topology.source;
  for (const auto& [name, peak] : {std::pair{"fp32", &m.fp32}, {"fp64", &m.fp64}, {"bf16", &m.bf16}}) {
    env[std::string("peak_") + name + "_one_core"] = number(peak->one_core);
    env[std::string("peak_") + name + "_all_cores"] = number(peak->all_cores);
    env[std::string("peak_") + name + "_kernel"] = peak->kernel;
    env[std::string("peak_") + name + "_check"] = peak_check_text(m, *peak);
  }
  env["cpu_fma_units"] = fma_units(m.cpu).text();
  env["clock_imul_chain_hz"] = number(m.clock_hz);
  env["clock_agrees_with_fp32_peak"] = m.clock_agrees ? "yes" : "no";
  env["memory_copy_one_core"] = number(m.memory.copy.one_core);
  env["memory_copy_all_cores"] = number(m.memory.copy.all_cores);
  env["memory_triad_one_core"] = number(m.memory.triad.one_core);
  env["memory_triad_all_cores"] = number(m.memory.triad.all_cores);
  env["memory_array_bytes"] = std::to_string(m.memory.array_bytes);
  env["blas_library"] = cpu_gemm::library(cpu_gemm::Backend::openblas);
  env["blas_core_at_load"] = core.at_load;
  env["blas_core_choice"] = core.how;
  for (const auto& g : m.gemm) {
    env["gemm_" + cpu_gemm::name(g.backend) + "_library"] = g.library;
    env["gemm_" + cpu_gemm::name(g.backend) + "_kernel"] = g.kernel;
    env["gemm_" + cpu_gemm::name(g.backend) + "_fp32_rate"] = number(g.fp32_rate);
  }
  env["gemm_probe_size"] = std::to_string(m.gemm_probe_size);
  env["gemm_default_backend"] = cpu_gemm::name(m.default_gemm);
  env["machine_source"] = node.source;
  env["machine_measured_utc"] = node.measured_utc;
  env["machine_json"] = all_nodes_json;
}

std::string peak_check_text(const MachineDescription& m, const PeakFigure& peak) {
  if (!peak.known()) return "n/a: " + missing_peak_reason(m.cpu, peak);
  const PeakPrecision precision = &peak == &m.fp64 ? PeakPrecision::fp64 : &peak == &m.bf16 ? PeakPrecision::bf16
                                                                                             : PeakPrecision::fp32;
  const PeakCheck check = check_peak(precision, m.cpu, peak.one_core, m.clock_hz);
  return (check.agrees ? "agrees: " : "FAILED: ") + check.text;
}

std::string missing_peak_reason(const CpuFeatures& cpu, const PeakFigure& peak) {
  if (peak.known()) return "";
  if (cpu.avx512f || cpu.avx2 || cpu.neon) return "this CPU has no AVX-512 BF16 dot-product unit";
  return "this CPU has no vector unit Strata has a peak kernel for";
}

std::string peak_source(const PeakFigure& peak, int threads) {
  if (!peak.known()) return "unknown: this CPU has no kernel to measure this precision's peak";
  if (!peak.failure.empty()) return "unknown: the measured peak is a " + peak.failure;
  char text[256];
  if (threads <= 1 || peak.all_cores <= 0)
    std::snprintf(text, sizeof text, "measured: %s, one core, %.1f GFLOP/s%s", peak.kernel.c_str(), peak.one_core / 1e9,
                  threads > 1 ? (" x " + std::to_string(threads) + " threads").c_str() : "");
  else
    std::snprintf(text, sizeof text, "measured: %s, all %d cores at once, %.1f GFLOP/s per core x %d threads",
                  peak.kernel.c_str(), peak.cores, peak.all_cores / peak.cores / 1e9, std::min(threads, peak.cores));
  return text;
}

std::string machine_summary(const NodeMachine& node, const BlasCoreChoice& core) {
  const MachineDescription& m = node.description;
  char line[512];
  std::string text;
  std::snprintf(line, sizeof line, "# machine: %s (%s family %d model %d), %d cores; %s, measured %s\n",
                m.cpu.model_name.c_str(), m.cpu.vendor.c_str(), m.cpu.family, m.cpu.model, m.topology.cores,
                node.source.c_str(), node.measured_utc.c_str());
  text += line;
  auto figure = [&](const char* label, const PeakFigure& p) {
    if (!p.known()) return std::string(label) + " n/a (" + missing_peak_reason(m.cpu, p) + ")";
    char text[160];
    std::snprintf(text, sizeof text, "%s %.1f GFLOP/s one core, %.1f all cores%s", label, p.one_core / 1e9,
                  p.all_cores / 1e9, p.usable() ? "" : " (FAILED its check, not used)");
    return std::string(text);
  };
  text += "# peak (measured, " + m.fp32.kernel + "): " + figure("FP32", m.fp32) + "; " + figure("FP64", m.fp64) + "; " +
          figure("BF16", m.bf16) + "\n";
  text += "# peak check: FP32 " + peak_check_text(m, m.fp32) + "\n";
  for (const PeakFigure* p : {&m.fp64, &m.bf16})
    if (p->known() && !p->usable()) text += "# peak check: " + std::string(p == &m.fp64 ? "FP64 " : "BF16 ") + peak_check_text(m, *p) + "\n";
  std::snprintf(line, sizeof line,
                "# memory (STREAM bytes, %lld MiB arrays): copy %.1f GB/s one core, %.1f all cores; triad %.1f / %.1f\n",
                static_cast<long long>(m.memory.array_bytes >> 20), m.memory.copy.one_core / 1e9,
                m.memory.copy.all_cores / 1e9, m.memory.triad.one_core / 1e9, m.memory.triad.all_cores / 1e9);
  text += line;
  std::snprintf(line, sizeof line, "# BLAS: %s, core %s (%s)\n", blas::config().c_str(), core.running.c_str(),
                core.how.c_str());
  text += line;
  std::string rates;
  for (const auto& g : m.gemm) {
    char rate[160];
    std::snprintf(rate, sizeof rate, "%s%s %s (%s) %.1f GFLOP/s", rates.empty() ? "" : "; ",
                  cpu_gemm::name(g.backend).c_str(), g.library.c_str(), g.kernel.c_str(), g.fp32_rate / 1e9);
    rates += rate;
  }
  std::snprintf(line, sizeof line, "# CPU GEMM, FP32 %lld^3 one thread: %s; default %s (the fastest)\n",
                static_cast<long long>(m.gemm_probe_size), rates.c_str(), cpu_gemm::name(m.default_gemm).c_str());
  text += line;
  return text;
}

}  // namespace strata
