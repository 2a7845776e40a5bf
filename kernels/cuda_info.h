// What the CUDA side of a build and machine is: library versions for the results, device names, counts.
// Declared unconditionally; defined in cuda_info.cu when Strata is built with CUDA.
#pragma once

#include <map>
#include <string>

namespace strata::cuda {

int device_count();  // 0 when there is no driver or no GPU
// Runtime, driver, cuBLASLt and NCCL versions ("none" where unavailable).
std::map<std::string, std::string> versions();
std::string device_name(int device);
// Compute capability as major * 10 + minor (90 for H100).
int compute_capability(int device);
void set_device(int device);

}  // namespace strata::cuda
