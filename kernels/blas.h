// The CPU BLAS (OpenBLAS) as Strata uses it: thread count set per rank by the program (never left to the
// environment, which would start one BLAS thread per core in every rank), its build description for the
// results, and the core type it should run on this CPU.
//
// OpenBLAS picks its kernels by CPU model when it loads. A model newer than the library (Debian's 0.3.21 on
// Intel family 6 model 207, for one) falls back to generic Prescott (SSE3) kernels that run 5-6x below
// the machine; OpenBLAS reads OPENBLAS_CORETYPE only at load, so the program sets it and re-executes itself
// before MPI starts (bench/harness/blas_core.h).
#pragma once

#include <string>

#include "kernels/cpu_features.h"

namespace strata::blas {

void set_threads(int threads);
int threads();
std::string config();    // e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64"
std::string version();   // e.g. "0.3.21"
std::string corename();  // the kernel family running now, e.g. "SkylakeX"
// The serial OpenBLAS build has no locking: two threads calling it at once give wrong results.
bool is_single_threaded_build();

// Vector width an OpenBLAS core's kernels use: 0 generic (SSE), 1 AVX, 2 AVX2 + FMA, 3 AVX-512; -1 for a
// name this table does not know (left alone).
int core_vector_level(const std::string& corename);
// The level `cpu` supports, on the same scale.
int cpu_vector_level(const CpuFeatures& cpu);
// The OPENBLAS_CORETYPE to ask for when the loaded core uses narrower vectors than the CPU has (a fallback);
// "" when the loaded core is right or unknown. AVX-512: SKYLAKEX (Cooperlake's kernels add only bf16 GEMM,
// which Debian's build does not export); AVX2: ZEN on AMD, HASWELL elsewhere; AVX: SANDYBRIDGE.
std::string preferred_core(const CpuFeatures& cpu, const std::string& loaded_core);

}  // namespace strata::blas
