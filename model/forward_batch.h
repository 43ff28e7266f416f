// The inputs and outputs of one forward step of DeepseekModel over a ragged batch.
//
// A step runs several sequences at once. Each contributes a chunk of new tokens at
// positions [start_pos, start_pos + tokens.size()): a whole prompt, a continuation of an
// earlier prefill chunk (start_pos > 0), or one decode token. The model first writes the
// latent KV of the new tokens into the cache through the chunk's block table, then attends
// over positions [0, start_pos + tokens.size()) read back from the cache.
//
// Results for a sequence do not depend on which other sequences share the step (the GEMM
// kernels are batch-invariant), so a ragged batch equals its sequences run one at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace peerserve {

struct SequenceChunk {
  // New token ids, at positions start_pos, start_pos + 1, ... Must not be empty.
  std::span<const int32_t> tokens;
  // Number of tokens of this sequence already in the cache (their KV is reused as is).
  int64_t start_pos = 0;
  // Block ids of the sequence, in position order: position p lives in block
  // block_table[p / block_size], slot p % block_size. Must cover
  // [0, start_pos + tokens.size()). Blocks written by this chunk must not be written by
  // another chunk of the same step (shared prefix blocks that are only read are fine).
  std::span<const int32_t> block_table;
  // true: logits (and hidden states) for every new token (scoring, verification of draft
  // tokens, MTP prefill); false: only for the last new token (generation).
  bool all_logits = false;
  // true: hidden states for every new token even when logits are wanted for the last one
  // only (speculative decoding feeds every position to the MTP layer; the LM head then runs
  // on one row instead of all of them).
  bool all_hidden = false;
  // true: the tokens stand for consecutive decode steps (draft tokens under verification), so
  // attention takes the form a one-token decode at start_pos takes, whatever the chunk's
  // length. The forms agree only to ~4e-3 (AttentionForm), and verification must give the
  // rows a decode would give, bit for bit.
  bool decode_form = false;
};

// Input of the MTP (multi-token prediction) layer for one sequence. Entry i combines the
// main model's hidden state at position p = start_pos + i (ForwardOutput::hidden) with the
// embedding of the token at position p + 1 (next_tokens[i]) and predicts the token at
// p + 2. The MTP layer keeps its own KV (its own layer slot of the cache layout) at
// position p, in the same block table as the main model.
struct MtpChunk {
  std::span<const int32_t> next_tokens;  // tokens at positions p + 1; not empty
  std::span<const float> hidden;         // [next_tokens.size(), hidden_size]
  int64_t start_pos = 0;
  std::span<const int32_t> block_table;  // covers [0, start_pos + next_tokens.size())
  bool all_logits = false;
  // true: only write the MTP layer's KV at these positions; no logits and no hidden rows
  // come back for the chunk (a sequence that does not draft this step keeps its MTP KV
  // complete at the cost of eh_proj and kv_a per token).
  bool kv_only = false;
};

struct ForwardOutput {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  // [num_rows, vocab_size] fp32 logits. Sequence s owns rows
  // [row_offsets[s], row_offsets[s + 1]): one row per new token when all_logits, else one
  // row (the last new token); none for a kv_only MTP chunk.
  std::vector<float> logits;
  // num_sequences + 1 entries.
  std::vector<int64_t> row_offsets;
  // [num_hidden_rows, hidden_size]: the final hidden state that the LM head reads (after the
  // final norm), for the logits rows, and for every new token of an all_hidden chunk.
  // Sequence s owns hidden rows [hidden_row_offsets[s], hidden_row_offsets[s + 1]) (equal to
  // row_offsets unless a chunk is all_hidden without all_logits). This is the input
  // MtpChunk::hidden expects.
  std::vector<float> hidden;
  std::vector<int64_t> hidden_row_offsets;

  int64_t num_rows() const { return row_offsets.empty() ? 0 : row_offsets.back(); }
  std::span<const float> logits_row(int64_t row) const {
    return {logits.data() + row * vocab_size, static_cast<size_t>(vocab_size)};
  }
  std::span<const float> hidden_row(int64_t row) const {
    return {hidden.data() + row * hidden_size, static_cast<size_t>(hidden_size)};
  }
  // The hidden states of sequence `seq`'s rows, [rows, hidden_size].
  std::span<const float> sequence_hidden(int64_t seq) const {
    const int64_t begin = hidden_row_offsets[seq], end = hidden_row_offsets[seq + 1];
    return {hidden.data() + begin * hidden_size, static_cast<size_t>((end - begin) * hidden_size)};
  }
  // Logits of the last new token of sequence `seq`.
  std::span<const float> last_logits(int64_t seq) const {
    return logits_row(row_offsets[seq + 1] - 1);
  }
};

}  // namespace peerserve
