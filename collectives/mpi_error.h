// MPI errors of the collectives layer: every MPI call goes through STRATA_MPI_CHECK, so a failure names
// the call, the file and the line, with the library's own error string. Requires MPI_ERRORS_RETURN on the
// communicator (set on MPI_COMM_WORLD at start-up; split communicators inherit it).
#pragma once

#include <mpi.h>

#include <stdexcept>

namespace strata::coll {

struct MpiError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace strata::coll

#define STRATA_MPI_CHECK(call)                                                          \
  do {                                                                                       \
    const int strata_mpi_rc_ = (call);                                                      \
    if (strata_mpi_rc_ != MPI_SUCCESS) ::strata::coll::throw_mpi_error(strata_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
