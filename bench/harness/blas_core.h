// Runs OpenBLAS on the kernels this CPU supports. OpenBLAS reads OPENBLAS_CORETYPE only when it loads, so
// when the core it chose is a generic fallback for this CPU (blas::preferred_core), the program sets the
// variable and re-executes itself, before MPI starts (the launcher sees one process all along). A user's own
// OPENBLAS_CORETYPE is respected, and STRATA_OPENBLAS_CORE=keep keeps whatever OpenBLAS chose.
#pragma once

#include <string>

namespace strata {

// Call first in main, before MPI_Init. Returns only when no re-execution is needed (or it failed, which is
// reported on stderr and leaves the library's own choice).
void run_openblas_on_the_right_core(char** argv);

struct BlasCoreChoice {
  std::string at_load;  // the core OpenBLAS chose by itself (before any re-execution)
  std::string running;  // the core running now
  std::string how;      // "OpenBLAS's own detection", "OPENBLAS_CORETYPE=SKYLAKEX set by Strata ...", ...
};
BlasCoreChoice blas_core_choice();

}  // namespace strata
