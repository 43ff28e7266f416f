// HOST:PORT checks: ports outside the range, not numbers, or missing are errors naming the flag.
#include "base/host_port.h"

#include <gtest/gtest.h>

namespace peerserve {
namespace {

TEST(HostPortTest, AcceptsNamesAddressesAndPortsInRange) {
  for (const char* ok : {"localhost:8000", "10.0.0.7:1", "cache-3.internal:65535", "[::1]:7400"}) {
    EXPECT_TRUE(check_host_port(ok, "--decode").ok()) << ok;
  }
  EXPECT_TRUE(check_host_port("127.0.0.1:0", "--listen", /*min_port=*/0).ok());
}

TEST(HostPortTest, RefusesWhatIsNotAPortNamingTheFlag) {
  // 99999 was listened on as 34463 (modulo 65536); the others were accepted as they came.
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:abc", "127.0.0.1:", "127.0.0.1:-1",
                          "127.0.0.1:0", "127.0.0.1:80x", ":8000", "localhost", ""}) {
    const Status s = check_host_port(bad, "--decode");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--decode"), std::string::npos) << s.message();
  }
}

// The message says which part is missing ("127.0.0.1" was reported as having no host).
TEST(HostPortTest, SaysWhichPartIsMissing) {
  EXPECT_NE(check_host_port("127.0.0.1", "--listen").message().find("has no port"),
            std::string::npos);
  EXPECT_NE(check_host_port(":8000", "--listen").message().find("has no host"), std::string::npos);
  // "[::1]" was said to have "port '1]'"; "[]:80", "a b:80" and "::1:8080" passed.
  EXPECT_NE(check_host_port("[::1]", "--listen").message().find("has no port after"),
            std::string::npos);
  EXPECT_NE(check_host_port("[]:80", "--listen").message().find("has no host"), std::string::npos);
  EXPECT_NE(check_host_port("a b:80", "--listen").message().find("a space"), std::string::npos);
  EXPECT_NE(check_host_port("::1:8080", "--listen").message().find("without brackets"),
            std::string::npos);
}

}  // namespace
}  // namespace peerserve
