// Unit tests of flag parsing, shape parsing and FLOP counts (bench/harness/cli.h, kernels/gemm.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "bench/harness/check.h"
#include "bench/harness/cli.h"
#include "bench/harness/harness.h"
#include "bench/harness/shapes.h"
#include "bench/harness/watchdog.h"
#include "collectives/operation.h"
#include "train/schedule.h"

using namespace strata;

namespace {
bool parse(Cli& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return cli.parse(static_cast<int>(args.size()), args.data());
}

// The UsageError's message, or "no error".
std::string error_of(Cli& cli, std::vector<const char*> args) {
  try {
    parse(cli, args);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Cli, ChoicesComeFromTheVocabularyTheCodeParses) {
  const std::vector<std::string> schedules = names_of(train::kAllSchedules);
  ASSERT_EQ(schedules.size(), std::size(train::kAllSchedules));
  for (std::size_t i = 0; i < schedules.size(); ++i) EXPECT_EQ(*train::parse_schedule(schedules[i]), train::kAllSchedules[i]);
  EXPECT_EQ(join_names(names_of(coll::kAllOperations), ",", ","),
            "allreduce,allgather,reduce_scatter,alltoall,broadcast,reduce,sendrecv");
  EXPECT_EQ(join_names({"a", "b", "c"}), "a, b or c");
  EXPECT_EQ(join_names({"a"}), "a");
  EXPECT_EQ(join_names({}), "");
}

TEST(Cli, LongShortAndEqualsForms) {
  int iters = 1;
  double budget = 0;
  std::string name = "x";
  bool quiet = false;
  Cli cli("prog", "test");
  cli.option("iters", 'n', "", iters, 1);
  cli.option("max-time", 0, "", budget, 0.0);
  cli.option("name", 0, "", name);
  cli.flag("quiet", 'q', "", quiet);
  EXPECT_TRUE(parse(cli, {"-n", "7", "--max-time=0.5", "--name", "abc", "-q"}));
  EXPECT_EQ(iters, 7);
  EXPECT_DOUBLE_EQ(budget, 0.5);
  EXPECT_EQ(name, "abc");
  EXPECT_TRUE(quiet);
  EXPECT_TRUE(parse(cli, {"--iters=9", "--no-quiet", "-n3"}));
  EXPECT_EQ(iters, 3);
  EXPECT_FALSE(quiet);
  EXPECT_EQ(cli.resolved_json(), R"({"iters":3,"max-time":0.5,"name":"abc","quiet":false})");
}

TEST(Cli, BadInputNamesTheProblem) {
  int iters = 1;
  double budget = 0;
  bool quiet = false;
  std::string backend = "cpu";
  Cli cli("prog", "test");
  cli.option("iters", 'n', "", iters, 1);
  cli.option("max-time", 0, "", budget, 0.0);
  cli.flag("quiet", 'q', "", quiet);
  cli.choice("backend", 0, "", backend, {"cpu", "cuda"});
  auto message = [&](std::vector<const char*> args) { return error_of(cli, std::move(args)); };
  EXPECT_NE(message({"--bogus"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(message({"--bogus=3"}).find("unknown flag --bogus "), std::string::npos);
  EXPECT_NE(message({"-z"}).find("unknown flag -z"), std::string::npos);
  EXPECT_NE(message({"--iters"}).find("--iters needs a value"), std::string::npos);
  EXPECT_NE(message({"-n"}).find("--iters needs a value"), std::string::npos);
  EXPECT_NE(message({"--iters", "ten"}).find("expected an integer"), std::string::npos);
  EXPECT_NE(message({"--iters", "0"}).find("between 1"), std::string::npos);
  EXPECT_NE(message({"--iters", "-3"}).find("between 1"), std::string::npos);
  EXPECT_NE(message({"--iters=7", "--iters", "0"}).find("between 1"), std::string::npos);
  EXPECT_NE(message({"--max-time", "-1"}).find("--max-time must be at least 0, got -1"), std::string::npos);
  EXPECT_NE(message({"--quiet=maybe"}).find("invalid value 'maybe' for --quiet"), std::string::npos);
  EXPECT_NE(message({"--no-quiet=maybe"}).find("invalid value 'maybe' for --no-quiet"), std::string::npos);
  EXPECT_NE(message({"--backend", "tpu"}).find("expected one of cpu|cuda"), std::string::npos);
  EXPECT_NE(message({"--backend=tpu"}).find("invalid value 'tpu' for --backend"), std::string::npos);
  EXPECT_NE(message({"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(message({"-q", "false"}).find("unexpected argument 'false'"), std::string::npos);
}

TEST(Cli, ChoicesAndSwitchesTakeEveryForm) {
  std::string backend = "cpu";
  std::string grid_dim = "tp";
  bool quiet = false;
  int iters = 1;
  Cli cli("prog", "test");
  cli.choice("backend", 'b', "", backend, {"cpu", "cuda"});
  cli.choice("grid-dim", 0, "", grid_dim, {"", "tp", "pp", "dp"});
  cli.flag("quiet", 'q', "", quiet);
  cli.option("iters", 'n', "", iters, 1);
  EXPECT_TRUE(parse(cli, {"--backend=cuda"}));
  EXPECT_EQ(backend, "cuda");
  EXPECT_TRUE(parse(cli, {"-bcpu"}));
  EXPECT_EQ(backend, "cpu");
  // An empty value after '=' is a value, not a request to take the next argument.
  EXPECT_TRUE(parse(cli, {"--grid-dim=", "-n", "4"}));
  EXPECT_EQ(grid_dim, "");
  EXPECT_EQ(iters, 4);
  // The last of several settings of one switch or option wins, whichever spelling each uses.
  EXPECT_TRUE(parse(cli, {"--quiet", "--no-quiet", "-n", "2", "--iters=5"}));
  EXPECT_FALSE(quiet);
  EXPECT_EQ(iters, 5);
  EXPECT_TRUE(parse(cli, {"--no-quiet", "-q"}));
  EXPECT_TRUE(quiet);
  EXPECT_TRUE(parse(cli, {"--quiet=off"}));
  EXPECT_FALSE(quiet);
  EXPECT_TRUE(parse(cli, {"--no-quiet=false"}));
  EXPECT_TRUE(quiet);
  EXPECT_TRUE(parse(cli, {"-qn6"}));
  EXPECT_TRUE(quiet);
  EXPECT_EQ(iters, 6);
}

TEST(Cli, AliasesTakeEveryFormAndErrorsNameTheOption) {
  int64_t minbytes = 8;
  int warmup = 5;
  Cli cli("prog", "test");
  cli.option("minbytes", 'b', "", minbytes, 0);
  cli.option("warmup", 'w', "", warmup, 0);
  cli.alias("warmup_iters", "warmup");
  cli.alias("min-bytes", "minbytes");
  EXPECT_TRUE(parse(cli, {"--warmup_iters=3", "--min-bytes", "64"}));
  EXPECT_EQ(warmup, 3);
  EXPECT_EQ(minbytes, 64);
  EXPECT_TRUE(parse(cli, {"-w", "2", "-b", "16"}));
  EXPECT_EQ(warmup, 2);
  EXPECT_EQ(minbytes, 16);
  EXPECT_NE(error_of(cli, {"--warmup_iters=-1"}).find("--warmup must be between 0"), std::string::npos);
  EXPECT_NE(error_of(cli, {"--warmup_iters"}).find("--warmup needs a value"), std::string::npos);
  // Aliases are spellings, not options: the configuration records the declared name only.
  EXPECT_EQ(nlohmann::json::parse(cli.resolved_json()), nlohmann::json::parse(R"({"minbytes":16,"warmup":2})"));
  EXPECT_THROW(cli.alias("warmup", "minbytes"), std::runtime_error);
  EXPECT_THROW(cli.alias("w2", "nothing"), std::runtime_error);
}

TEST(Cli, ResolvedJsonRoundTripsInDeclarationOrder) {
  int iters = 20;
  int64_t bytes = int64_t{1} << 40;
  double budget = 0.1;
  std::string output = "a \"quoted\" path\\with\ttab\nand line";
  std::string backend = "cpu";
  bool quiet = true;
  Cli cli("prog", "test");
  cli.option("zeta-iters", 'n', "", iters, 1);
  cli.option("bytes", 0, "", bytes, 0);
  cli.option("max-time", 0, "", budget, 0.0);
  cli.option("output", 'O', "", output);
  cli.choice("backend", 0, "", backend, {"cpu", "cuda"});
  cli.flag("quiet", 'q', "", quiet);
  EXPECT_TRUE(parse(cli, {"--backend", "cuda"}));
  const std::string text = cli.resolved_json();
  nlohmann::ordered_json resolved = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (const auto& [key, value] : resolved.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"zeta-iters", "bytes", "max-time", "output", "backend", "quiet"}));
  EXPECT_EQ(resolved["zeta-iters"].get<int>(), 20);
  EXPECT_EQ(resolved["bytes"].get<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(resolved["max-time"].get<double>(), 0.1);  // exactly: the shortest text that reads back
  EXPECT_EQ(resolved["output"].get<std::string>(), output);
  EXPECT_EQ(resolved["backend"].get<std::string>(), "cuda");
  EXPECT_EQ(resolved["quiet"].get<bool>(), true);
}

TEST(Cli, UsageListsOptionsWithCurrentValues) {
  int warmup = 5;
  std::string backend = "cpu";
  bool quiet = false;
  Cli cli("prog", "what the program does");
  cli.option("warmup", 'w', "untimed iterations", warmup, 0);
  cli.alias("warmup_iters", "warmup");
  cli.choice("backend", 0, "where it runs", backend, {"cpu", "cuda"});
  cli.flag("quiet", 'q', "no progress", quiet);
  EXPECT_TRUE(parse(cli, {"-w", "9"}));
  const std::string text = cli.usage();
  EXPECT_NE(text.find("what the program does"), std::string::npos) << text;
  EXPECT_NE(text.find("usage: prog [options]"), std::string::npos) << text;
  EXPECT_NE(text.find("-w,--warmup,--warmup_iters N=9"), std::string::npos) << text;
  EXPECT_NE(text.find("--backend cpu|cuda=cpu"), std::string::npos) << text;
  EXPECT_NE(text.find("-q,--quiet "), std::string::npos) << text;
  EXPECT_EQ(text.find("--no-quiet"), std::string::npos) << text;  // as before: the negation is not listed
  EXPECT_NE(text.find("-h,--help"), std::string::npos) << text;
}

TEST(Cli, HelpReturnsFalse) {
  Cli cli("prog", "test");
  testing::internal::CaptureStdout();
  EXPECT_FALSE(parse(cli, {"--help"}));
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: prog"), std::string::npos);
}

// -t/--timeout, as every program takes it: seconds (strict), auto (the harness's period, not strict) or auto:S.
TEST(Cli, TimeoutTakesSecondsOrAuto) {
  HarnessOptions options;
  Cli cli("prog", "test");
  add_harness_options(cli, options);
  EXPECT_EQ(options.timeout, "auto");
  for (const char* good : {"2.5", "0", "auto", "auto:30"}) {
    EXPECT_TRUE(parse(cli, {"-t", good})) << good;
    EXPECT_EQ(options.timeout, good);
  }
  const WatchdogLimit seconds = parse_watchdog_limit("2.5", 600);
  EXPECT_DOUBLE_EQ(seconds.seconds, 2.5);
  EXPECT_TRUE(seconds.strict);
  const WatchdogLimit automatic = parse_watchdog_limit("auto", 600);
  EXPECT_DOUBLE_EQ(automatic.seconds, 600);
  EXPECT_FALSE(automatic.strict);
  const WatchdogLimit every = parse_watchdog_limit("auto:30", 600);
  EXPECT_DOUBLE_EQ(every.seconds, 30);
  EXPECT_FALSE(every.strict);
  EXPECT_DOUBLE_EQ(parse_watchdog_limit("0", 600).seconds, 0);  // no watchdog
  for (const char* bad : {"-1", "nan", "inf", "soon", "auto:0", "auto:", "auto:x", "automatic", ""}) {
    const std::string message = error_of(cli, {"--timeout", bad});
    EXPECT_NE(message.find("--timeout"), std::string::npos) << bad << ": " << message;
    EXPECT_NE(message.find(std::string("'") + bad + "'"), std::string::npos) << bad << ": " << message;
  }
}

TEST(Cli, Sizes) {
  EXPECT_EQ(parse_bytes("8", "x"), 8);
  EXPECT_EQ(parse_bytes("1K", "x"), 1024);
  EXPECT_EQ(parse_bytes("64M", "x"), 64LL << 20);
  EXPECT_EQ(parse_bytes("2G", "x"), 2LL << 30);
  EXPECT_THROW(parse_bytes("-1K", "x"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("1T", "x"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("", "x"), std::invalid_argument);
  // The whole text in the message, and a size past int64 refused rather than wrapped to a negative one.
  auto message = [](const std::string& text) {
    try {
      parse_bytes(text, "--maxbytes");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message("8.5K"), "invalid size '8.5K' for --maxbytes: a whole number of bytes, optionally with K, M or G");
  EXPECT_EQ(message("99999999999G"), "size '99999999999G' for --maxbytes is too large (at most 8 EiB)");
  EXPECT_EQ(parse_bytes("8589934591G", "x"), 8589934591LL << 30);
}

TEST(GemmShape, ParsesAndCountsFlops) {
  gemm::Shape s = gemm::parse_shape("128x256x64");
  EXPECT_EQ(s.m, 128);
  EXPECT_EQ(s.n, 256);
  EXPECT_EQ(s.k, 64);
  EXPECT_DOUBLE_EQ(s.flops(), 2.0 * 128 * 256 * 64);
  EXPECT_EQ(s.text(), "128x256x64");
}

TEST(GemmShape, RejectsMalformedAndNonPositive) {
  for (const char* bad : {"128x256", "128x256x64x2", "axbxc", "0x4x4", "4x-4x4", "4x4x", "", "4 x4x4"}) {
    EXPECT_THROW(gemm::parse_shape(bad), std::invalid_argument) << bad;
  }
}


TEST(GemmDType, Names) {
  for (const char* n : {"fp32", "fp64", "tf32", "fp16", "bf16", "fp8"}) {
    auto d = gemm::parse_dtype(n);
    ASSERT_TRUE(d.has_value()) << n;
    EXPECT_EQ(gemm::name(*d), n);
  }
  EXPECT_FALSE(gemm::parse_dtype("int4").has_value());
  EXPECT_EQ(gemm::output_bytes(gemm::DType::fp8_e4m3), 2);
}

TEST(ProgressLines, TheLastCaseAndOneAnInterval) {
  // Case 5 of 12, 3 s after the last line: not yet at a 10 s interval; at 10 s it is; every case at interval 0.
  EXPECT_FALSE(progress_line_due(5, 12, 3.0, 10));
  EXPECT_TRUE(progress_line_due(5, 12, 10.0, 10));
  EXPECT_TRUE(progress_line_due(5, 12, 0.0, 0));
  EXPECT_TRUE(progress_line_due(12, 12, 0.1, 10));  // the last case's line, however soon
  EXPECT_FALSE(progress_line_due(12, 0, 0.1, 10));  // without a known count no case is the last
  EXPECT_TRUE(progress_line_due(12, 0, 11.0, 10));
}
