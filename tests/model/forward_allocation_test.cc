// Steady-state steps of the model allocate nothing (docs/forward_stages.md): once a
// ForwardState's buffers have grown to a step's size, decode steps and prefill steps of
// that size make no heap allocation on the calling thread (one thread: the pool runs every
// part there). Counted by replacing the global allocation functions in this binary.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "model/deepseek_model.h"
#include "tests/dist/allocation_counter.h"
#include "tests/model/forward_test_util.h"
#include "tests/model/test_checkpoints.h"

namespace peerserve {
namespace {

using dist::testing::allocations_on_this_thread;
using testing::load_model;
using testing::make_cache;
using testing::test_tokens;
using testing::tiny_checkpoint_dir;

// Two sequences: a decode step of both, `steps` times, after `warmup` such steps; the
// allocations made by the measured steps.
int64_t allocations_of_decode_steps(DeepseekModel& model, int warmup, int steps) {
  const int64_t vocab = model.config().vocab_size;
  LatentKvCache cache = make_cache(model, 16, DType::kBF16, 16);
  const std::vector<int32_t> a = test_tokens(64, vocab, 1), b = test_tokens(64, vocab, 2);
  const std::vector<int32_t> blocks_a = {0, 1, 2, 3}, blocks_b = {4, 5, 6, 7};
  std::unique_ptr<ForwardState> state = model.new_forward_state();
  ForwardOutput out;
  // Prefills of 20 tokens, then one token per sequence per step.
  std::vector<SequenceChunk> chunks(2);
  chunks[0] = {.tokens = std::span(a).first(20), .start_pos = 0, .block_table = blocks_a};
  chunks[1] = {.tokens = std::span(b).first(20), .start_pos = 0, .block_table = blocks_b};
  EXPECT_TRUE(model.forward(chunks, cache, *state, &out).ok());
  int64_t measured = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const int64_t pos = 20 + s;
    chunks[0] = {.tokens = std::span(a).subspan(pos, 1), .start_pos = pos, .block_table = blocks_a};
    chunks[1] = {.tokens = std::span(b).subspan(pos, 1), .start_pos = pos, .block_table = blocks_b};
    const int64_t before = allocations_on_this_thread();
    const Status status = model.forward(chunks, cache, *state, &out);
    if (s >= warmup) measured += allocations_on_this_thread() - before;
    EXPECT_TRUE(status.ok()) << status.to_string();
  }
  return measured;
}

// The same two prefills (20 and 13 tokens, each returning its last row only: the last
// layer drops the others' rows) over and over, then the MTP layer over them; the
// allocations of the measured repetitions.
int64_t allocations_of_prefill_steps(DeepseekModel& model, int warmup, int steps) {
  const int64_t vocab = model.config().vocab_size;
  LatentKvCache cache = make_cache(model, 16, DType::kBF16, 16);
  const std::vector<int32_t> a = test_tokens(20, vocab, 3), b = test_tokens(13, vocab, 4);
  const std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {4};
  std::unique_ptr<ForwardState> state = model.new_forward_state();
  ForwardOutput out, mtp_out;
  const std::vector<SequenceChunk> chunks = {
      {.tokens = a, .start_pos = 0, .block_table = blocks_a, .all_hidden = true},
      {.tokens = b, .start_pos = 0, .block_table = blocks_b}};
  const int64_t hidden = model.config().hidden_size;
  std::vector<float> hidden_a(20 * hidden, 0.5f), hidden_b(13 * hidden, 0.25f);
  std::vector<MtpChunk> mtp_chunks = {
      {.next_tokens = a, .hidden = hidden_a, .start_pos = 0, .block_table = blocks_a},
      {.next_tokens = b,
       .hidden = hidden_b,
       .start_pos = 0,
       .block_table = blocks_b,
       .kv_only = true}};
  int64_t measured = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    const int64_t before = allocations_on_this_thread();
    Status status = model.forward(chunks, cache, *state, &out);
    if (status.ok() && model.has_mtp())
      status = model.forward_mtp(mtp_chunks, cache, *state, &mtp_out);
    if (s >= warmup) measured += allocations_on_this_thread() - before;
    EXPECT_TRUE(status.ok()) << status.to_string();
  }
  return measured;
}

ModelOptions one_thread(WeightQuantization quantization = WeightQuantization::kNone) {
  ModelOptions o;
  o.num_threads = 1;
  o.quantize = quantization;
  return o;
}

TEST(ForwardAllocationTest, DecodeStepsAllocateNothingOnceWarm) {
  auto model = load_model(tiny_checkpoint_dir(), one_thread());
  EXPECT_EQ(allocations_of_decode_steps(*model, 3, 10), 0);
}

TEST(ForwardAllocationTest, Int8DecodeStepsAllocateNothingOnceWarm) {
  auto model = load_model(tiny_checkpoint_dir(), one_thread(WeightQuantization::kInt8));
  EXPECT_EQ(allocations_of_decode_steps(*model, 3, 10), 0);
}

TEST(ForwardAllocationTest, PrefillAndMtpStepsOfOneShapeAllocateNothingOnceWarm) {
  auto model = load_model(tiny_checkpoint_dir(), one_thread());
  ASSERT_TRUE(model->has_mtp());
  EXPECT_EQ(allocations_of_prefill_steps(*model, 3, 5), 0);
}

TEST(ForwardAllocationTest, TheCounterSeesAllocations) {
  const int64_t before = allocations_on_this_thread();
  auto p = std::make_unique<std::vector<int>>(3);
  const int64_t after = allocations_on_this_thread();
  p.reset();
  EXPECT_GE(after - before, 2);  // the vector and its elements
}

}  // namespace
}  // namespace peerserve
