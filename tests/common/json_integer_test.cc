// Integers from outside JSON: only JSON integers within the type's range; a floating-point number
// (which nlohmann's get<int>() would convert, with undefined behaviour out of range) or a value
// out of range throws the library's own exceptions, which callers already turn into messages.
#include <gtest/gtest.h>

#include "common/json_integer.h"

namespace dtrain {
namespace {

using nlohmann::json;

TEST(JsonInteger, TakesIntegersInRangeOnly) {
  EXPECT_EQ(json_integer<int>(json::parse("7")), 7);
  EXPECT_EQ(json_integer<int>(json::parse("-3")), -3);
  EXPECT_EQ(json_integer<uint64_t>(json::parse("18446744073709551615")), UINT64_MAX);
  EXPECT_EQ(json_integer<int>(json::parse(R"({"a": 1})"), "b", -1), -1);
  EXPECT_THROW(json_integer<int>(json::parse("2.2222222222222222222222e23")), json::type_error);
  EXPECT_THROW(json_integer<int>(json::parse("1.0")), json::type_error);
  EXPECT_THROW(json_integer<int>(json::parse("\"7\"")), json::type_error);
  EXPECT_THROW(json_integer<int>(json::parse("2147483648")), json::out_of_range);
  EXPECT_THROW(json_integer<uint32_t>(json::parse("-1")), json::out_of_range);
  EXPECT_THROW(json_integer<int>(json::parse(R"({"server": 1e300})"), "server", -1),
               json::type_error);
}

}  // namespace
}  // namespace dtrain
