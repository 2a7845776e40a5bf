// What this CPU is and which vector instructions it has, as a plain value: everything that chooses a kernel
// or a BLAS core type reads this struct, so unit tests can hand it any CPU (Intel or AMD, with or without
// AVX-512) while only one kind of machine is at hand.
#pragma once

#include <string>

namespace strata {

struct CpuFeatures {
  std::string vendor;      // "GenuineIntel", "AuthenticAMD", "ARM", ... (cpuid vendor string)
  std::string model_name;  // /proc/cpuinfo "model name"
  int family = 0;          // x86: cpuid display family and model (family 6 model 207: Emerald Rapids);
  int model = 0;           // Arm: the CPU implementer and part of /proc/cpuinfo (0x41 0xd40: Neoverse V1)
  bool hypervisor = false; // running under a hypervisor, which may present another CPU model than the host's
  bool sse2 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512dq = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;  // vdpbf16ps: bf16 pairs multiplied and summed into fp32
  bool avx512_fp16 = false;
  bool amx_bf16 = false;
  bool neon = false;

  bool is_intel() const { return vendor == "GenuineIntel"; }
  bool is_amd() const { return vendor == "AuthenticAMD"; }
  // The AVX-512 subset that every AVX-512 BLAS kernel (SkylakeX and later) relies on.
  bool avx512_core() const { return avx512f && avx512dq && avx512bw && avx512vl; }
  // AMD Zen 4 executes 512-bit operations on 256-bit pipes: AVX-512 brings no more FLOP per cycle than AVX2.
  bool double_pumped_avx512() const { return is_amd() && family == 0x19 && avx512f; }
  std::string flags_text() const;  // e.g. "avx2 fma avx512f avx512bw avx512vl avx512dq avx512_bf16"
};

// The running CPU, from cpuid and /proc/cpuinfo.
CpuFeatures detect_cpu_features();

// The widest FMA vector unit the peak kernels can use on `cpu`, in FP32 lanes: 16 (AVX-512), 8 (AVX2 + FMA),
// 4 (SSE2 or NEON, 128-bit).
int fp32_vector_lanes(const CpuFeatures& cpu);
// A name for it, e.g. "AVX-512 FMA".
std::string vector_unit_name(const CpuFeatures& cpu);

}  // namespace strata
