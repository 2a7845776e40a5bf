// Implementation of the BLAS controls (see blas.h), for OpenBLAS.
#include "kernels/blas.h"

#include <cblas.h>

namespace strata::blas {

void set_threads(int threads) { openblas_set_num_threads(threads); }
int threads() { return openblas_get_num_threads(); }
std::string config() { return openblas_get_config(); }
std::string corename() { return openblas_get_corename(); }
bool is_single_threaded_build() { return openblas_get_parallel() == 0; }

}  // namespace strata::blas
