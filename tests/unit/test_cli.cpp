// Unit tests of flag parsing, shape parsing and FLOP counts (bench/cli.h, kernels/gemm.h).
#include <gtest/gtest.h>

#include "bench/check.h"
#include "bench/cli.h"
#include "kernels/gemm.h"

using namespace strata;

namespace {
bool parse(Cli& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  return cli.parse(static_cast<int>(args.size()), args.data());
}
}  // namespace

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
  EXPECT_EQ(cli.resolved_json(), R"({"iters": 3, "max-time": 0.5, "name": "abc", "quiet": false})");
}

TEST(Cli, BadInputNamesTheProblem) {
  int iters = 1;
  std::string backend = "cpu";
  Cli cli("prog", "test");
  cli.option("iters", 'n', "", iters, 1);
  cli.choice("backend", 0, "", backend, {"cpu", "cuda"});
  auto message = [&](std::vector<const char*> args) {
    try {
      parse(cli, args);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"--bogus"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(message({"-z"}).find("unknown flag -z"), std::string::npos);
  EXPECT_NE(message({"--iters"}).find("needs a value"), std::string::npos);
  EXPECT_NE(message({"--iters", "ten"}).find("expected an integer"), std::string::npos);
  EXPECT_NE(message({"--iters", "0"}).find("between 1"), std::string::npos);
  EXPECT_NE(message({"--iters", "-3"}).find("between 1"), std::string::npos);
  EXPECT_NE(message({"--backend", "tpu"}).find("expected one of cpu|cuda"), std::string::npos);
  EXPECT_NE(message({"stray"}).find("unexpected argument"), std::string::npos);
}

TEST(Cli, HelpReturnsFalse) {
  Cli cli("prog", "test");
  testing::internal::CaptureStdout();
  EXPECT_FALSE(parse(cli, {"--help"}));
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: prog"), std::string::npos);
}

TEST(Cli, Sizes) {
  EXPECT_EQ(parse_bytes("8", "x"), 8);
  EXPECT_EQ(parse_bytes("1K", "x"), 1024);
  EXPECT_EQ(parse_bytes("64M", "x"), 64LL << 20);
  EXPECT_EQ(parse_bytes("2G", "x"), 2LL << 30);
  EXPECT_THROW(parse_bytes("-1K", "x"), UsageError);
  EXPECT_THROW(parse_bytes("1T", "x"), UsageError);
  EXPECT_THROW(parse_bytes("", "x"), UsageError);
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
    EXPECT_THROW(gemm::parse_shape(bad), UsageError) << bad;
  }
}

TEST(GemmShape, PresetsFollowMegatronSplits) {
  auto shapes = gemm::preset_shapes("gpt3-1.3b", 2048, 2);  // hidden 2048
  ASSERT_EQ(shapes.size(), 4u);
  EXPECT_EQ(shapes[0].source, "gpt3-1.3b/qkv");
  EXPECT_EQ(shapes[0].shape.text(), "2048x3072x2048");  // column-parallel: N = 3h / tp
  EXPECT_EQ(shapes[1].shape.text(), "2048x2048x1024");  // row-parallel: K = h / tp
  EXPECT_EQ(shapes[2].shape.text(), "2048x4096x2048");  // 4h / tp
  EXPECT_EQ(shapes[3].shape.text(), "2048x2048x4096");
  EXPECT_THROW(gemm::preset_shapes("gpt5", 2048, 1), UsageError);
  EXPECT_THROW(gemm::preset_shapes("gpt2-small", 2048, 7), UsageError);
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
