// Unit tests of the output checks every program runs before it writes (bench/harness/output_files.h): an output is never
// an input or another output, under any name of the file, and a file written whole never replaces an HDF5 file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "bench/harness/check.h"
#include "bench/harness/output_files.h"
#include "results/h5.h"
#include "results/schema.h"
#include "results/writer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
struct Folder {
  fs::path path;
  Folder() {
    char pattern[] = "/tmp/strata-outputs-XXXXXX";
    path = mkdtemp(pattern);
    h5::silence_library_errors();
  }
  ~Folder() { fs::remove_all(path); }
  std::string file(const std::string& name, const std::string& text = "") const {
    const std::string name_path = (path / name).string();
    if (!text.empty()) std::ofstream(name_path) << text;
    return name_path;
  }
};

std::string refusal(const std::vector<FileArg>& inputs, const std::vector<FileArg>& appended,
                    const std::vector<FileArg>& replaced) {
  try {
    check_outputs(inputs, appended, replaced);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(OutputFiles, AnOutputIsNeverAnInputUnderAnyName) {
  Folder folder;
  const std::string input = folder.file("in.json", "{}\n");
  fs::create_hard_link(input, folder.path / "hard.json");
  fs::create_symlink(input, folder.path / "soft.json");
  for (const std::string& name : {input, folder.file("hard.json"), folder.file("soft.json"),
                                  (folder.path / "." / "in.json").string()}) {
    const std::string message = refusal({{"--system", input, ""}}, {}, {{"-o/--output", name, "JSON"}});
    EXPECT_NE(message.find("-o/--output " + name + " is also an input (--system " + input + ")"), std::string::npos)
        << message;
  }
  EXPECT_NE(refusal({{"FILE", input, ""}}, {{"-O/--output", input, ""}}, {}).find("is also an input"), std::string::npos);
  EXPECT_EQ(refusal({{"--system", input, ""}}, {}, {{"-o/--output", folder.file("new.json"), "JSON"}}), "");
  EXPECT_EQ(refusal({{"--base", "", ""}}, {{"-O/--output", "", ""}}, {{"--timeline", "", "a trace"}}), "");
}

TEST(OutputFiles, TwoOutputsNeverShareAFile) {
  Folder folder;
  const std::string out = folder.file("same");
  const std::string message = refusal({}, {{"-O/--output", out, ""}}, {{"--timeline", out, "a trace"}});
  EXPECT_NE(message.find("--timeline " + out + " and -O/--output " + out + " are the same file"), std::string::npos)
      << message;
}

TEST(OutputFiles, AFileWrittenWholeNeverReplacesAnHdf5File) {
  Folder folder;
  const std::string results = folder.file("r.h5");
  {
    ResultsWriter writer(results, "run", {{"benchmark", "unit"}, {"n_ranks", "1"}, {"n_nodes", "1"}, {"launcher", "none"},
                                          {"start_utc", "2026-01-01T00:00:00Z"}});
    writer.finish(schema::kStatusOk);
  }
  const std::string message = refusal({}, {}, {{"--timeline", results, "a Chrome trace"}});
  EXPECT_NE(message.find("--timeline " + results + " is an existing HDF5 file"), std::string::npos) << message;
  EXPECT_NE(message.find("a Chrome trace"), std::string::npos) << message;
  EXPECT_EQ(refusal({}, {{"-O/--output", results, ""}}, {}), "");  // appending to it is the writer's to judge
}

TEST(OutputFiles, AFileWrittenWholeNeedsAWritablePlace) {
  Folder folder;
  EXPECT_NE(refusal({}, {}, {{"--timeline", folder.path.string(), "a trace"}}).find("is a directory"), std::string::npos);
  EXPECT_NE(refusal({}, {}, {{"--timeline", folder.file("no/such/t.json"), "a trace"}}).find("does not exist"),
            std::string::npos);
  EXPECT_NE(refusal({}, {}, {{"--timeline", "/proc/strata-t.json", "a trace"}}).find("is not writable"),
            std::string::npos);
}
