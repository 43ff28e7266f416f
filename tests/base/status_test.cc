#include "base/status.h"

#include <gtest/gtest.h>

namespace peerserve {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value " + std::to_string(v) + " must be > 0");
  return v;
}

Result<int> twice(int v) {
  PS_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Status, OkAndError) {
  EXPECT_TRUE(ok_status().ok());
  Status s = not_found("tensor 'a.weight'").with_context("model.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.to_string(), "NotFound: model.safetensors: tensor 'a.weight'");
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(*twice(3), 6);
  auto r = twice(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("-1"), std::string::npos);
}

}  // namespace
}  // namespace peerserve
