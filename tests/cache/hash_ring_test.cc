// HashRing: balance, minimal movement when a member joins, independence from list order.
#include "cache/hash_ring.h"

#include <gtest/gtest.h>

#include <vector>

namespace peerserve {
namespace {

constexpr int kKeys = 100000;

PoolKey key(int i) {
  return PoolKey{"t", static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL};
}

TEST(HashRingTest, KeysSpreadEvenlyOverMembers) {
  HashRing ring(160);
  for (int m = 0; m < 4; ++m) ring.add("10.0.0." + std::to_string(m) + ":7000");
  std::vector<int> count(4, 0);
  for (int i = 0; i < kKeys; ++i) ++count[ring.owner(key(i))];
  for (int m = 0; m < 4; ++m) {
    const double share = static_cast<double>(count[m]) / kKeys;
    // 160 points per member: a share's relative spread is about 1/sqrt(160) ~ 8%.
    EXPECT_GT(share, 0.25 * 0.7) << m;
    EXPECT_LT(share, 0.25 * 1.3) << m;
  }
}

TEST(HashRingTest, AddingAMemberMovesOnlyItsShareAndOnlyToIt) {
  HashRing ring(160);
  for (int m = 0; m < 4; ++m) ring.add("10.0.0." + std::to_string(m) + ":7000");
  std::vector<size_t> before(kKeys);
  for (int i = 0; i < kKeys; ++i) before[i] = ring.owner(key(i));
  const size_t added = ring.add("10.0.0.4:7000");
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const size_t now = ring.owner(key(i));
    if (now != before[i]) {
      ++moved;
      EXPECT_EQ(now, added) << "key " << i << " moved between old members";
    }
  }
  const double fraction = static_cast<double>(moved) / kKeys;
  // Expected 1/5 of the keys; a modulo placement would move 4/5.
  EXPECT_GT(fraction, 0.2 * 0.7);
  EXPECT_LT(fraction, 0.2 * 1.3);
}

TEST(HashRingTest, PlacementDoesNotDependOnListOrder) {
  HashRing a(64), b(64);
  for (const char* m : {"h1:1", "h2:1", "h3:1"}) a.add(m);
  for (const char* m : {"h3:1", "h1:1", "h2:1"}) b.add(m);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(a.member(a.owner(key(i))), b.member(b.owner(key(i))));
}

TEST(HashRingTest, TenantIsPartOfThePosition) {
  EXPECT_NE(HashRing::position({"a", 1}), HashRing::position({"b", 1}));
  EXPECT_EQ(HashRing::position({"a", 1}), HashRing::position({"a", 1}));
}

}  // namespace
}  // namespace peerserve
