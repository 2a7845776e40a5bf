// Implementation of the token file reader (see token_file.h).
#include "bench/harness/token_file.h"

#include <filesystem>
#include <fstream>

#include "bench/harness/check.h"

namespace strata {

std::vector<uint16_t> read_token_file(const std::string& path) {
  constexpr int32_t kMagic = 20240520, kVersion = 1;
  if (std::filesystem::is_directory(path)) throw UsageError("token file " + path + " is a directory, not an llm.c token file");
  if (!std::filesystem::exists(path)) throw UsageError("token file " + path + " does not exist");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot open token file " + path);
  int32_t header[256] = {};
  if (!in.read(reinterpret_cast<char*>(header), sizeof header))
    throw UsageError("token file " + path + " is shorter than its 1024-byte header");
  if (header[0] != kMagic)
    throw UsageError("token file " + path + " has magic " + std::to_string(header[0]) + ", not llm.c's " +
                     std::to_string(kMagic));
  if (header[1] != kVersion)
    throw UsageError("token file " + path + " has version " + std::to_string(header[1]) + "; this reader knows version 1");
  if (header[2] <= 0) throw UsageError("token file " + path + " declares " + std::to_string(header[2]) + " tokens");
  std::vector<uint16_t> tokens(static_cast<std::size_t>(header[2]));
  if (!in.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t))))
    throw UsageError("token file " + path + " declares " + std::to_string(header[2]) + " tokens but holds " +
                     std::to_string(in.gcount() / 2));
  return tokens;
}

}  // namespace strata
