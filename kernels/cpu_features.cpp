// Implementation of CPU feature detection (see cpu_features.h).
#include "kernels/cpu_features.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <cstring>
#include <fstream>

namespace strata {

namespace {

std::string cpuinfo_field(const std::string& key) {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  while (std::getline(info, line))
    if (line.rfind(key, 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "";
}

}  // namespace

std::string CpuFeatures::flags_text() const {
  std::string text;
  auto add = [&](bool present, const char* name) {
    if (!present) return;
    if (!text.empty()) text += ' ';
    text += name;
  };
  add(sse2, "sse2"), add(avx, "avx"), add(avx2, "avx2"), add(fma, "fma"), add(avx512f, "avx512f");
  add(avx512dq, "avx512dq"), add(avx512bw, "avx512bw"), add(avx512vl, "avx512vl");
  add(avx512_bf16, "avx512_bf16"), add(avx512_fp16, "avx512_fp16"), add(amx_bf16, "amx_bf16"), add(neon, "neon");
  add(hypervisor, "hypervisor");
  return text;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures cpu;
  cpu.model_name = cpuinfo_field("model name");
#if defined(__x86_64__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __get_cpuid(0, &eax, &ebx, &ecx, &edx);
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4), std::memcpy(vendor + 4, &edx, 4), std::memcpy(vendor + 8, &ecx, 4);
  cpu.vendor = vendor;
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const unsigned base_family = (eax >> 8) & 0xf, base_model = (eax >> 4) & 0xf;
  cpu.family = static_cast<int>(base_family + (base_family == 0xf ? (eax >> 20) & 0xff : 0));
  cpu.model = static_cast<int>(base_model + (base_family == 0x6 || base_family == 0xf ? ((eax >> 16) & 0xf) << 4 : 0));
  // __builtin_cpu_supports also checks that the OS saves the wider registers (XGETBV), which cpuid alone
  // does not say.
  __builtin_cpu_init();
  cpu.sse2 = __builtin_cpu_supports("sse2");
  cpu.avx = __builtin_cpu_supports("avx");
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.fma = __builtin_cpu_supports("fma");
  cpu.avx512f = __builtin_cpu_supports("avx512f");
  cpu.avx512dq = __builtin_cpu_supports("avx512dq");
  cpu.avx512bw = __builtin_cpu_supports("avx512bw");
  cpu.avx512vl = __builtin_cpu_supports("avx512vl");
  cpu.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  cpu.avx512_fp16 = __builtin_cpu_supports("avx512fp16");
  cpu.hypervisor = (ecx >> 31) & 1;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    cpu.amx_bf16 = (edx >> 22) & 1;
  }
#elif defined(__aarch64__)
  cpu.vendor = "ARM";
  cpu.neon = true;
  cpu.family = static_cast<int>(std::strtol(cpuinfo_field("CPU implementer").c_str(), nullptr, 0));
  cpu.model = static_cast<int>(std::strtol(cpuinfo_field("CPU part").c_str(), nullptr, 0));
#endif
  if (cpu.model_name.empty()) cpu.model_name = cpu.vendor.empty() ? "unknown" : cpu.vendor;
  return cpu;
}

int fp32_vector_lanes(const CpuFeatures& cpu) {
  if (cpu.avx512f) return 16;
  if (cpu.avx2 && cpu.fma) return 8;
  return 4;
}

std::string vector_unit_name(const CpuFeatures& cpu) {
  if (cpu.avx512f) return "AVX-512 FMA";
  if (cpu.avx2 && cpu.fma) return "AVX2 FMA";
  if (cpu.neon) return "NEON FMA";
  return "SSE2 multiply + add";
}

}  // namespace strata
