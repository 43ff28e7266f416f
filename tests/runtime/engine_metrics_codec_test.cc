// The engine metrics a rank mails to rank 0 under --ep: every field survives the trip, sums
// add up field by field, and damaged bytes are refused.
#include "runtime/engine_metrics_codec.h"

#include <gtest/gtest.h>

#include <vector>

namespace peerserve {
namespace {

// A snapshot with a distinct value in every field (so that a field dropped, swapped or read
// at the wrong place shows).
EngineMetricsSnapshot sample(int64_t base) {
  EngineMetricsSnapshot m;
  m.scheduler.num_running = static_cast<int32_t>(base + 1);
  m.scheduler.num_waiting = static_cast<int32_t>(base + 2);
  m.scheduler.num_blocks = static_cast<int32_t>(base + 3);
  m.scheduler.num_used_blocks = static_cast<int32_t>(base + 4);
  m.scheduler.num_free_blocks = static_cast<int32_t>(base + 5);
  m.scheduler.num_cached_blocks = static_cast<int32_t>(base + 6);
  m.scheduler.num_preemptions = base + 7;
  m.scheduler.pool.prefix_query_tokens = base + 8;
  m.scheduler.pool.prefix_hit_tokens = base + 9;
  m.scheduler.pool.evictions = base + 10;
  m.time_to_first_token.observe(0.003 * static_cast<double>(base + 1));
  m.inter_token_latency.observe(0.02);
  m.time_per_output_token.observe(0.5);
  m.e2e_request_latency.observe(3.0);
  m.queue_time.observe(700.0);  // the +Inf bucket
  m.prompt_tokens_total = base + 11;
  m.generation_tokens_total = base + 12;
  m.requests_finished_total = {base + 13, base + 14, base + 15, base + 16};
  m.steps_total = base + 17;
  m.batched_tokens_total = base + 18;
  m.kv_pool_enabled = base % 2 == 1;
  m.kv_pool.loads = base + 19;
  m.kv_pool.bytes_stored = base + 20;
  m.kv_pool.load_seconds_total = 0.25 * static_cast<double>(base);
  m.kv_pool.handoff_seconds_total = 1.5;
  m.kv_pool_hit_tokens = base + 21;
  m.kv_pool_load_latency.observe(0.01);
  m.spec_decode_num_speculative_tokens = static_cast<int32_t>(base % 3);
  m.spec_decode_active = base % 3 != 0;
  m.spec_decode_num_drafts = base + 22;
  m.spec_decode_num_draft_tokens = base + 23;
  m.spec_decode_num_accepted_tokens = base + 24;
  m.spec_decode_accepted_per_position[0] = base + 25;
  m.spec_decode_accepted_per_position[1] = base + 26;
  m.spec_decode_acceptance_length.observe(2.0);
  return m;
}

std::vector<std::byte> encoded(const EngineMetricsSnapshot& m) {
  std::vector<std::byte> bytes;
  ByteWriter writer(&bytes);
  encode_engine_metrics(m, writer);
  return bytes;
}

TEST(EngineMetricsCodecTest, EveryFieldSurvivesTheTrip) {
  const EngineMetricsSnapshot m = sample(5);
  const std::vector<std::byte> bytes = encoded(m);
  ByteReader in(bytes);
  Result<EngineMetricsSnapshot> back = decode_engine_metrics(in);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_TRUE(in.at_end());
  // Re-encoding gives the same bytes: nothing was lost or moved.
  EXPECT_EQ(encoded(*back), bytes);
  EXPECT_EQ(back->scheduler.num_cached_blocks, 11);
  EXPECT_EQ(back->requests_finished_total[3], 21);
  EXPECT_EQ(back->kv_pool.load_seconds_total, 1.25);
  EXPECT_EQ(back->queue_time.count(), 1u);
  EXPECT_EQ(back->queue_time.cumulative_counts().back(), 0u);  // only in +Inf
  EXPECT_EQ(back->spec_decode_accepted_per_position[1], 31);
  EXPECT_EQ(back->spec_decode_num_speculative_tokens, 2);
  EXPECT_TRUE(back->spec_decode_active);
  EXPECT_TRUE(back->kv_pool_enabled);
}

TEST(EngineMetricsCodecTest, SumsFieldByField) {
  EngineMetricsSnapshot total = sample(1);
  add_engine_metrics(total, sample(3));
  EXPECT_EQ(total.scheduler.num_running, 2 + 4);
  EXPECT_EQ(total.scheduler.pool.evictions, 11 + 13);
  EXPECT_EQ(total.prompt_tokens_total, 12 + 14);
  EXPECT_EQ(total.requests_finished_total[2], 16 + 18);
  EXPECT_EQ(total.kv_pool.load_seconds_total, 0.25 + 0.75);
  EXPECT_EQ(total.spec_decode_accepted_per_position[0], 26 + 28);
  EXPECT_EQ(total.time_to_first_token.count(), 2u);
  EXPECT_DOUBLE_EQ(total.time_to_first_token.sum(), 0.006 + 0.012);
  EXPECT_EQ(total.spec_decode_num_speculative_tokens, 1);  // max(1, 0)
  EXPECT_TRUE(total.spec_decode_active);
  EXPECT_TRUE(total.kv_pool_enabled);
}

TEST(EngineMetricsCodecTest, DamagedBytesAreRefused) {
  const std::vector<std::byte> bytes = encoded(sample(2));
  for (size_t cut : {size_t{0}, size_t{1}, bytes.size() / 2, bytes.size() - 1}) {
    ByteReader in(std::span<const std::byte>(bytes.data(), cut));
    EXPECT_FALSE(decode_engine_metrics(in).ok()) << "cut at " << cut;
  }
  // A histogram with another number of buckets (another binary's bounds), whole bytes
  // otherwise: refused as misshaped, not read into the wrong buckets.
  EngineMetricsSnapshot other = sample(2);
  other.queue_time = Histogram({1.0, 2.0});
  const std::vector<std::byte> other_bytes = encoded(other);
  ByteReader in(other_bytes);
  const Result<EngineMetricsSnapshot> misshaped = decode_engine_metrics(in);
  EXPECT_FALSE(misshaped.ok());
  EXPECT_TRUE(in.ok());  // every field was there: the refusal is the bucket count
}

}  // namespace
}  // namespace peerserve
