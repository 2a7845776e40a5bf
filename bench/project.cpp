// strata-project: the projection layer's programs, one subcommand each (`strata-project COMMAND ...`).
//   calibrate FILE... -o system.json   a system description fitted from Strata's result files
//   search --system FILE --model M --gpus N --global-batch B   configurations ranked by predicted step time
// Runs on one process without MPI: it reads files and computes. Bad input (flags, files that are not Strata
// results, a description with a bad field, runs that cannot give a whole description) prints one message and
// exits 2 without touching the output; any other failure exits 1.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/calibration_input.h"
#include "bench/check.h"
#include "bench/cli.h"
#include "bench/project_search.h"
#include "bench/system_json.h"
#include "project/calibrate.h"
#include "results/h5.h"

namespace {

using namespace strata;

// The output must be writable as a file: refused before anything is read, so a typo costs nothing.
void check_output(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw UsageError("-o/--output FILE is required: where to write the system description");
  if (fs::is_directory(path)) throw UsageError("output " + path + " is a directory");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent)) throw UsageError("output folder " + parent.string() + " does not exist");
}

std::string utc_date() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

int calibrate(int argc, char** argv) {
  std::vector<std::string> files;
  std::string output, name, base_path, device = "auto";
  bool quiet = false;
  Cli cli("strata-project calibrate",
          "A system description (JSON, project/SYSTEM.md) fitted from strata-gemm, strata-attention, "
          "strata-collective and strata-interference result files.");
  cli.positionals("FILE", "Strata result files (HDF5); every usable run of them is read", files, 1);
  cli.option("output", 'o', "the system description to write (JSON); left untouched on any error", output);
  cli.option("name", 0, "the description's name (default: host, device and date)", name);
  cli.option("base", 0, "a system description (e.g. a spec sheet's) whose figures stand in for what the files do "
             "not measure, each marked as not measured", base_path);
  cli.choice("device", 0, "which device the description is of: the GPU when a GEMM run used one (auto), or say",
             device, {"auto", "cpu", "cuda"});
  cli.flag("quiet", 'q', "print only errors", quiet);
  if (!cli.parse(argc, argv)) return 0;
  check_output(output);
  std::optional<project::System> base;
  if (!base_path.empty()) base = read_system(base_path);

  CalibrationFiles read = read_calibration_input(files, device);
  read.input.name = !name.empty() ? name
                                  : (read.host.empty() ? "" : read.host + ": ") + read.input.device_name +
                                        ", calibrated " + utc_date();
  const project::Calibration result = project::calibrate(read.input, base ? &*base : nullptr, base_path);
  if (!quiet) {
    std::printf("# strata-project calibrate: %s (%s)\n", read.summary.c_str(), read.input.provenance.c_str());
    for (const std::string& note : read.notes) std::printf("# note: %s\n", note.c_str());
    std::printf("# residual: RMS of (fit - measured) / measured over the sizes or points fitted\n");
    for (const std::string& line : result.report) std::printf("%s\n", line.c_str());
  }
  if (!result.missing.empty()) {
    std::string message = "the result files cannot give a whole system description:";
    for (const std::string& missing : result.missing) message += "\n  - " + missing;
    message += "\n  add the runs named, or pass --base FILE (a description whose figures stand in, each marked as "
               "not measured)";
    throw UsageError(message);
  }
  write_system(output, result.system);
  if (!quiet) std::printf("# system description: %s\n", output.c_str());
  return 0;
}

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int, char**);
};

// predict and validate join here.
const Command kCommands[] = {
    {"calibrate", "fit a system description from result files", calibrate},
    {"search", "rank training configurations by predicted step time", project_search},
};

std::string usage() {
  std::string text = "usage: strata-project COMMAND [options]   (strata-project COMMAND --help for its options)\n"
                     "commands:\n";
  for (const Command& c : kCommands) text += "  " + std::string(c.name) + "  " + c.summary + "\n";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  strata::h5::silence_library_errors();
  if (argc < 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::fputs(usage().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  for (const Command& command : kCommands) {
    if (name != command.name) continue;
    try {
      return command.run(argc - 1, argv + 1);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "strata-project %s: error: %s\n", command.name, e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata-project %s: failed: %s\n", command.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "strata-project: error: unknown command '%s'\n%s", name.c_str(), usage().c_str());
  return 2;
}
