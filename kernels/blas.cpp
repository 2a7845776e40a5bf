// Implementation of the BLAS controls (see blas.h), for OpenBLAS.
#include "kernels/blas.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>

namespace strata::blas {

void set_threads(int threads) { openblas_set_num_threads(threads); }
int threads() { return openblas_get_num_threads(); }
std::string config() { return openblas_get_config(); }
std::string corename() { return openblas_get_corename(); }
bool is_single_threaded_build() { return openblas_get_parallel() == 0; }

std::string version() {
  // The configuration string starts "OpenBLAS 0.3.21 ...".
  const std::string text = config();
  const std::string prefix = "OpenBLAS ";
  if (text.rfind(prefix, 0) != 0) return "unknown";
  return text.substr(prefix.size(), text.find(' ', prefix.size()) - prefix.size());
}

int core_vector_level(const std::string& corename) {
  std::string core = corename;
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  // OpenBLAS's DYNAMIC_ARCH core names (driver/others/dynamic.c), grouped by the widest vectors their kernels use.
  static const char* const generic[] = {"katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2",
                                        "penryn", "dunnington", "nehalem", "opteron", "opteron_sse3", "barcelona",
                                        "bobcat", "nano", "unknown"};
  static const char* const avx[] = {"sandybridge", "bulldozer", "piledriver"};
  static const char* const avx2[] = {"haswell", "steamroller", "excavator", "zen", "skylake"};
  static const char* const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  for (const char* name : generic) if (core == name) return 0;
  for (const char* name : avx) if (core == name) return 1;
  for (const char* name : avx2) if (core == name) return 2;
  for (const char* name : avx512) if (core == name) return 3;
  return -1;
}

int cpu_vector_level(const CpuFeatures& cpu) {
  if (cpu.avx512_core()) return 3;
  if (cpu.avx2 && cpu.fma) return 2;
  if (cpu.avx) return 1;
  return 0;
}

std::string preferred_core(const CpuFeatures& cpu, const std::string& loaded_core) {
  const int loaded = core_vector_level(loaded_core);
  const int wanted = cpu_vector_level(cpu);
  if (loaded < 0 || loaded >= wanted) return "";
  switch (wanted) {
    case 3: return "SKYLAKEX";
    case 2: return cpu.is_amd() ? "ZEN" : "HASWELL";
    case 1: return "SANDYBRIDGE";
    default: return "";
  }
}

}  // namespace strata::blas
