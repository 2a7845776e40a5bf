// Errors of the results layer. A file or path the caller cannot use (missing, not HDF5, another schema, a
// damaged file) is a BadResultsFile, a std::invalid_argument: the programs report it as bad input (exit 2).
// HDF5 failing underneath is a ResultsError. STRATA_H5_CHECK, private to this layer, names the call, file and
// line of every failed HDF5 call.
#pragma once

#include <stdexcept>
#include <string>

namespace strata {

struct BadResultsFile : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct ResultsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_h5_failure(const char* call, const char* file, int line) {
  throw ResultsError(std::string("HDF5 call failed: ") + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace strata

// Negative herr_t or hid_t means failure; the HDF5 error stack is printed by the library when enabled.
#define STRATA_H5_CHECK(call)                                                              \
  ([&]() {                                                                                 \
    auto strata_h5_rc_ = (call);                                                           \
    if (strata_h5_rc_ < 0) ::strata::throw_h5_failure(#call, __FILE__, __LINE__);          \
    return strata_h5_rc_;                                                                  \
  }())
