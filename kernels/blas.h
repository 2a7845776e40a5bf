// The CPU BLAS as Strata uses it: thread count set per rank by the program (never left to the environment,
// which would start one BLAS thread per core in every rank), and its build description for the results.
#pragma once

#include <string>

namespace strata::blas {

void set_threads(int threads);
int threads();
std::string config();    // e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64"
std::string corename();  // the kernel family chosen at run time, e.g. "Cooperlake"
// The serial OpenBLAS build has no locking: two threads calling it at once give wrong results.
bool is_single_threaded_build();

}  // namespace strata::blas
