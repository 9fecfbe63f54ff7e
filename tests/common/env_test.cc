// The environment table: parsing, defaults, and docs/env.md listing every variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/env.h"
#include "common/log_level.h"
#include "dtrain/error.h"
#include "dtrain/tensor.h"

namespace dtrain {
namespace {

TEST(Env, DefaultsAndParsing) {
  ::unsetenv("DTRAIN_TIMEOUT");
  EXPECT_EQ(env::get_seconds(env::kTimeout).count(), 300'000);
  ::setenv("DTRAIN_TIMEOUT", "1.5", 1);
  EXPECT_EQ(env::get_seconds(env::kTimeout).count(), 1500);
  ::setenv("DTRAIN_TIMEOUT", "soon", 1);
  try {
    env::get_seconds(env::kTimeout);
    FAIL() << "a non-number was accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("DTRAIN_TIMEOUT"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("soon"), std::string::npos) << e.what();
  }
  // Numbers that would overflow into "timed out after 0.0 s" or an instant deadline.
  for (const char* bad : {"inf", "nan", "-inf", "1e300", "-1"}) {
    ::setenv("DTRAIN_TIMEOUT", bad, 1);
    try {
      env::get_seconds(env::kTimeout);
      ADD_FAILURE() << "DTRAIN_TIMEOUT=" << bad << " was accepted";
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("DTRAIN_TIMEOUT"), std::string::npos) << e.what();
    }
  }
  ::setenv("DTRAIN_TIMEOUT", "31536000", 1);  // a year is the most
  EXPECT_EQ(env::get_seconds(env::kTimeout).count(), int64_t{31536000} * 1000);
  ::unsetenv("DTRAIN_TIMEOUT");
  ::setenv("RANK", "12x", 1);
  EXPECT_THROW(env::get_int(env::kRank), InvalidArgumentError);
  ::setenv("RANK", "12", 1);
  EXPECT_EQ(env::get_int(env::kRank).value(), 12);
  ::unsetenv("RANK");
  EXPECT_FALSE(env::get_int(env::kRank).has_value());
}

TEST(Env, EveryVariableIsDocumented) {
  std::ifstream f(std::string(DTRAIN_SOURCE_DIR) + "/docs/env.md");
  ASSERT_TRUE(f.good()) << "docs/env.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& v : env::all())
    EXPECT_NE(doc.find("`" + std::string(v.name) + "`"), std::string::npos)
        << v.name << " is read by dtrain but not listed in docs/env.md (regenerate it with "
        << "`dtrain env --markdown`)";
}

TEST(Env, LogLevelsInAnyCaseAndUnknownOnesRefused) {
  EXPECT_EQ(log::parse_level("INFO"), spdlog::level::info);
  EXPECT_EQ(log::parse_level("Debug"), spdlog::level::debug);
  EXPECT_EQ(log::parse_level("warning"), spdlog::level::warn);
  EXPECT_EQ(log::parse_level("WARN"), spdlog::level::warn);
  EXPECT_EQ(log::parse_level("error"), spdlog::level::err);
  EXPECT_EQ(log::parse_level("off"), spdlog::level::off);
  EXPECT_FALSE(log::parse_level("verbose").has_value());
  EXPECT_FALSE(log::parse_level("").has_value());
}

// `dtrain env` shows that the token is set, never its value; an unknown log level is named.
TEST(Env, TheEnvCommandHidesTheTokenAndNamesABadLogLevel) {
  const std::string cmd = fmt::format(
      "DTRAIN_AUTH_TOKEN=s3cr3t-value DTRAIN_LOG_LEVEL=Chatty {}/dtrain env 2>&1", DTRAIN_BIN_DIR);
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_EQ(out.find("s3cr3t"), std::string::npos) << out;
  EXPECT_NE(out.find("(set, 12 characters)"), std::string::npos) << out;
  EXPECT_NE(out.find("DTRAIN_LOG_LEVEL is 'Chatty', which names no level"), std::string::npos)
      << out;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(element_size(DType::kBF16), 2u);
  EXPECT_EQ(element_size(DType::kI64), 8u);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_EQ(to_string(parse_dtype("bf16")), "bf16");
  EXPECT_THROW(parse_dtype("f12"), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain
