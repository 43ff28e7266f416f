// Byte sizes on the command line: units, case, overflow and junk.
#include "apps/byte_size.h"

#include <gtest/gtest.h>

namespace peerserve {
namespace {

TEST(ByteSizeTest, NumbersAndBinaryUnits) {
  EXPECT_EQ(*parse_byte_size("--x", "1073741824"), 1073741824u);
  EXPECT_EQ(*parse_byte_size("--x", "512MiB"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("--x", "512m"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("--x", "4G"), 4ull << 30);
  EXPECT_EQ(*parse_byte_size("--x", "64k"), 64ull << 10);
  EXPECT_EQ(*parse_byte_size("--x", "2TB"), 2ull << 40);
  EXPECT_EQ(*parse_byte_size("--x", "0"), 0u);
}

TEST(ByteSizeTest, OverflowAndJunkAreErrorsNamingTheFlag) {
  for (const char* bad : {"", "M", "12X", "1.5G", "-1", "99999999999999999999999999",
                          "18446744073709551615k", "17179869184G"}) {
    const Result<uint64_t> r = parse_byte_size("--kv-cache-memory", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--kv-cache-memory"), std::string::npos);
  }
  EXPECT_EQ(*parse_byte_size("--x", "18446744073709551615"), 18446744073709551615ull);
}

}  // namespace
}  // namespace peerserve
