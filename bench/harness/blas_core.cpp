// Implementation of the OpenBLAS core choice (see blas_core.h).
#include "bench/harness/blas_core.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/blas.h"
#include "kernels/cpu_features.h"

namespace strata {

namespace {
// Set by the first execution for the second: the core OpenBLAS had chosen by itself.
constexpr const char* kCoreAtLoad = "STRATA_OPENBLAS_CORE_AT_LOAD";
}  // namespace

void run_openblas_on_the_right_core(char** argv) {
  if (std::getenv(kCoreAtLoad) || std::getenv("OPENBLAS_CORETYPE")) return;  // already chosen
  const char* keep = std::getenv("STRATA_OPENBLAS_CORE");
  if (keep && std::strcmp(keep, "keep") == 0) return;
  // Tests reach the re-execution on a CPU that OpenBLAS knows by naming the core it "chose".
  const char* pretend = std::getenv("STRATA_TEST_OPENBLAS_CORE_AT_LOAD");
  const std::string loaded = pretend && *pretend ? pretend : blas::corename();
  const std::string wanted = blas::preferred_core(detect_cpu_features(), loaded);
  if (wanted.empty()) return;
  setenv("OPENBLAS_CORETYPE", wanted.c_str(), 1);
  setenv(kCoreAtLoad, loaded.c_str(), 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "strata: warning: could not re-execute with OPENBLAS_CORETYPE=%s (%s); OpenBLAS runs its %s kernels\n",
               wanted.c_str(), std::strerror(errno), loaded.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kCoreAtLoad);
}

BlasCoreChoice blas_core_choice() {
  BlasCoreChoice choice;
  choice.running = blas::corename();
  const char* at_load = std::getenv(kCoreAtLoad);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  if (at_load && coretype) {
    choice.at_load = at_load;
    choice.how = std::string("OPENBLAS_CORETYPE=") + coretype + " set by Strata: OpenBLAS had chosen " + at_load +
                 ", a generic fallback for this CPU";
  } else if (coretype) {
    choice.at_load = choice.running;
    choice.how = std::string("OPENBLAS_CORETYPE=") + coretype + " set by the user";
  } else {
    choice.at_load = choice.running;
    choice.how = "OpenBLAS's own detection";
  }
  return choice;
}

}  // namespace strata
