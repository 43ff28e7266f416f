#include "runtime/data_parallel_router.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/byte_io.h"
#include "base/check.h"
#include "model/expert_load_recorder.h"
#include "runtime/engine_metrics_codec.h"
#include "runtime/request_codec.h"

namespace peerserve {
namespace {

enum class Command : uint8_t { kSubmit = 1, kAbort = 2 };
// Opens the metrics report after a rank's outputs.
constexpr uint8_t kReportTag = 0x52;

}  // namespace

DataParallelRouter::DataParallelRouter(int rank, int size, Agree agree, size_t max_letter_bytes)
    : rank_(rank),
      size_(size),
      agree_(std::move(agree)),
      outstanding_seqs_(static_cast<size_t>(size), 0),
      outstanding_tokens_(static_cast<size_t>(size), 0),
      routed_total_(static_cast<size_t>(size), 0),
      max_letter_bytes_(max_letter_bytes),
      remote_metrics_(static_cast<size_t>(size)),
      remote_expert_counts_(static_cast<size_t>(size)) {
  PS_CHECK(size >= 1 && rank >= 0 && rank < size) << "rank " << rank << " of " << size;
}

std::vector<std::byte> DataParallelRouter::take_letter(Outbox* box) const {
  std::vector<std::byte> out;
  if (box->ends.empty()) return out;
  const size_t room =
      max_letter_bytes_ > sizeof(uint64_t) ? max_letter_bytes_ - sizeof(uint64_t) : 0;
  size_t records = static_cast<size_t>(std::upper_bound(box->ends.begin(), box->ends.end(), room) -
                                       box->ends.begin());
  records = std::max<size_t>(records, 1);
  const size_t bytes = box->ends[records - 1];
  out.reserve(sizeof(uint64_t) + bytes);
  ByteWriter(&out).put<uint64_t>(records);
  out.insert(out.end(), box->body.begin(), box->body.begin() + static_cast<ptrdiff_t>(bytes));
  box->body.erase(box->body.begin(), box->body.begin() + static_cast<ptrdiff_t>(bytes));
  box->ends.erase(box->ends.begin(), box->ends.begin() + static_cast<ptrdiff_t>(records));
  for (size_t& end : box->ends) end -= bytes;
  return out;
}

void DataParallelRouter::attach(Engine* engine) {
  engine_ = engine;
}

bool DataParallelRouter::running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !done_ && engine_ != nullptr && engine_->running();
}

bool DataParallelRouter::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

Status DataParallelRouter::wait_until_done() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return done_; });
  return done_status_;
}

void DataParallelRouter::mark_done(Status status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    done_ = true;
    done_status_ = std::move(status);
  }
  done_cv_.notify_all();
}

void DataParallelRouter::break_group(const Status& why) {
  const Status broken = unavailable("a step failed on rank " + std::to_string(rank_) +
                                    ", so the ranks are out of lock-step: " + why.message());
  end_remote(FinishReason::kError, unavailable("expert-parallel group lost: " + broken.message()));
  mark_done(broken);
}

std::vector<int64_t> DataParallelRouter::outstanding() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_seqs_;
}

EngineMetricsSnapshot DataParallelRouter::metrics() const {
  EngineMetricsSnapshot total = engine_->metrics();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& remote : remote_metrics_) {
    if (remote) add_engine_metrics(total, *remote);
  }
  return total;
}

std::vector<int64_t> DataParallelRouter::expert_counts() const {
  std::vector<int64_t> total = expert_counts_ ? expert_counts_() : std::vector<int64_t>();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const std::vector<int64_t>& remote : remote_expert_counts_) add_expert_counts(total, remote);
  return total;
}

std::vector<int64_t> DataParallelRouter::routed_total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return routed_total_;
}

Result<RequestId> DataParallelRouter::submit(EngineRequest request, OutputSink sink) {
  PS_CHECK(engine_ != nullptr) << "DataParallelRouter::submit before attach";
  if (rank_ != 0) return unavailable("requests are answered by rank 0 only");
  PS_RETURN_IF_ERROR(engine_->validate(request));
  // Another rank gets it as mail; a request too large for one letter runs here instead.
  std::vector<std::byte> encoded;
  if (size_ > 1) {
    ByteWriter out(&encoded);
    encode_request(request, out);
  }
  constexpr size_t kRecordHead = sizeof(uint8_t) + sizeof(int32_t) + sizeof(uint64_t);
  const bool mailable = encoded.size() + kRecordHead + sizeof(uint64_t) <= max_letter_bytes_;
  RequestId id = 0;
  int target = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) {
      return unavailable(done_status_.ok() ? std::string("the server is stopping")
                                           : done_status_.message());
    }
    // Another rank's engine would refuse a request over its waiting-queue limit after the
    // client was told it was accepted. Its waiting sequences are among its unfinished ones,
    // which this count bounds (it drops only when the finish reaches rank 0), so a rank is a
    // candidate while that count stays within the limit. Rank 0's own engine always is: it
    // answers for its queue at once, with the 429 a full group gives.
    const int64_t limit = engine_->options().scheduler.max_waiting_seqs;
    for (int r = 1; r < size_ && mailable; ++r) {
      const auto key = [&](int k) {
        return std::tuple(outstanding_seqs_[k], outstanding_tokens_[k], k);
      };
      if (outstanding_seqs_[r] + request.params.n > limit) continue;
      if (key(r) < key(target)) target = r;
    }
    id = next_id_++;
    Routed routed;
    routed.rank = target;
    routed.n = request.params.n;
    routed.prompt_tokens = static_cast<int64_t>(request.prompt_tokens.size());
    routed.sink = std::move(sink);
    routed.choice_finished.assign(static_cast<size_t>(routed.n), false);
    outstanding_seqs_[target] += routed.n;
    outstanding_tokens_[target] += routed.prompt_tokens;
    ++routed_total_[target];
    routed_.emplace(id, std::move(routed));
    if (target != 0) {
      ByteWriter out(&commands_.body);
      out.put<uint8_t>(static_cast<uint8_t>(Command::kSubmit));
      out.put<int32_t>(target);
      out.put<uint64_t>(id);
      commands_.body.insert(commands_.body.end(), encoded.begin(), encoded.end());
      commands_.ends.push_back(commands_.body.size());
      return id;
    }
  }
  // Rank 0's own engine. Its sink may run before submit() returns, so the entry exists first.
  Result<RequestId> engine_id = engine_->submit(std::move(request), [this, id](RequestOutput out) {
    const Status delivered = deliver(0, id, std::move(out));
    PS_CHECK(delivered.ok()) << delivered.to_string();  // rank 0's own engine
  });
  bool abort_now = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = routed_.find(id);
    if (!engine_id.ok()) {
      if (it != routed_.end()) release(id);
      return engine_id.status();
    }
    if (it != routed_.end()) {
      it->second.engine_id = *engine_id;
      abort_now = it->second.abort_requested;
    }
  }
  if (abort_now) engine_->abort(*engine_id);
  return id;
}

void DataParallelRouter::abort(RequestId id) {
  RequestId engine_id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = routed_.find(id);
    if (it == routed_.end()) return;
    Routed& routed = it->second;
    if (routed.rank != 0) {
      ByteWriter out(&commands_.body);
      out.put<uint8_t>(static_cast<uint8_t>(Command::kAbort));
      out.put<int32_t>(routed.rank);
      out.put<uint64_t>(id);
      commands_.ends.push_back(commands_.body.size());
      return;
    }
    routed.abort_requested = true;  // if submit() has not learnt the engine's id yet
    engine_id = routed.engine_id;
  }
  if (engine_id != 0) engine_->abort(engine_id);
}

void DataParallelRouter::release(RequestId id) {
  auto it = routed_.find(id);
  if (it == routed_.end()) return;
  const Routed& routed = it->second;
  outstanding_seqs_[routed.rank] -= routed.n;
  outstanding_tokens_[routed.rank] -= routed.prompt_tokens;
  routed_.erase(it);
}

Status DataParallelRouter::deliver(int from_rank, RequestId id, RequestOutput output) {
  OutputSink sink;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = routed_.find(id);
    if (it == routed_.end()) return ok_status();  // already ended here (group stopped or broke)
    Routed& routed = it->second;
    if (routed.rank != from_rank) {
      return data_loss("output of request " + std::to_string(id) + " from rank " +
                       std::to_string(from_rank) + ", which rank " + std::to_string(routed.rank) +
                       " hosts");
    }
    for (const ChoiceDelta& choice : output.choices) {
      if (choice.index < 0 || choice.index >= routed.n) {
        return data_loss("output of request " + std::to_string(id) + " for choice " +
                         std::to_string(choice.index) + " of " + std::to_string(routed.n));
      }
    }
    for (const ChoiceDelta& choice : output.choices) {
      if (choice.finish_reason) routed.choice_finished[static_cast<size_t>(choice.index)] = true;
    }
    if (output.finished) {
      sink = std::move(routed.sink);
      release(id);
    } else {
      sink = routed.sink;
    }
  }
  output.request_id = id;
  if (sink) sink(std::move(output));
  return ok_status();
}

void DataParallelRouter::end_remote(FinishReason reason, const Status& error) {
  std::vector<std::pair<OutputSink, RequestOutput>> ended;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RequestId> ids;
    for (const auto& [id, routed] : routed_) {
      if (routed.rank != 0) ids.push_back(id);
    }
    for (RequestId id : ids) {
      Routed& routed = routed_.at(id);
      RequestOutput out;
      out.request_id = id;
      for (int32_t i = 0; i < routed.n; ++i) {
        if (routed.choice_finished[static_cast<size_t>(i)]) continue;
        ChoiceDelta delta;
        delta.index = i;
        delta.finish_reason = reason;
        out.choices.push_back(std::move(delta));
      }
      out.finished = true;
      out.error = error;
      ended.emplace_back(std::move(routed.sink), std::move(out));
      release(id);
    }
    commands_ = {};
  }
  for (auto& [sink, out] : ended) {
    if (sink) sink(std::move(out));
  }
}

Status DataParallelRouter::finish() {
  if (rank_ != 0 || done()) return ok_status();
  end_remote(FinishReason::kAbort, ok_status());
  Result<dist::StepAgreement> last = agree_(0, /*stop=*/true, {});
  mark_done(last.status());
  return last.status();
}

Result<bool> DataParallelRouter::lockstep(int64_t rows) {
  {
    // The group stopped or broke: nothing to agree with any more, and nothing can step.
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_)
      return done_status_.ok() ? unavailable("the expert-parallel group has stopped")
                               : done_status_;
  }
  return rank_ == 0 ? lead(rows) : follow(rows);
}

Status DataParallelRouter::attach_constraint(EngineRequest& request) const {
  const std::string& pattern = request.params.structured_output_pattern;
  if (pattern.empty() || request.params.sampling.constraint) return ok_status();
  if (!compile_) {
    return invalid_argument("rank " + std::to_string(rank_) +
                            " cannot compile structured outputs (no constraint compiler)");
  }
  PS_ASSIGN_OR_RETURN(request.params.sampling.constraint, compile_(pattern));
  return ok_status();
}

Result<bool> DataParallelRouter::lead(int64_t rows) {
  std::vector<std::byte> mail;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mail = take_letter(&commands_);
  }
  Result<dist::StepAgreement> agreement = agree_(rows, false, mail);
  Status broken;
  if (agreement.ok()) {
    // Outputs of the other ranks' engines.
    for (size_t r = 1; r < agreement->mail.size() && broken.ok(); ++r) {
      if (agreement->mail[r].empty()) continue;
      ByteReader in(agreement->mail[r]);
      const uint64_t count = in.get_count(sizeof(uint64_t));
      // Decoded first, delivered after the report below is stored: a client that sees its
      // request finish then reads /metrics counting it.
      std::vector<std::pair<uint64_t, RequestOutput>> outputs;
      for (uint64_t i = 0; i < count && broken.ok(); ++i) {
        const auto id = in.get<uint64_t>();
        Result<RequestOutput> output = decode_output(in);
        if (!output.ok()) {
          broken = data_loss("rank " + std::to_string(r) + ": " + output.status().message());
        } else {
          outputs.emplace_back(id, std::move(output).value());
        }
      }
      if (broken.ok() && in.ok() && !in.at_end()) {  // that rank's report
        const auto tag = in.get<uint8_t>();
        Result<EngineMetricsSnapshot> metrics =
            tag == kReportTag ? decode_engine_metrics(in) : data_loss("unknown section");
        std::vector<int64_t> counts = in.get_array<int64_t>();
        if (metrics.ok() && in.ok()) {
          std::lock_guard<std::mutex> lock(mutex_);
          remote_metrics_[r] = std::move(metrics).value();
          remote_expert_counts_[r] = std::move(counts);
        } else {
          broken = data_loss("rank " + std::to_string(r) + " sent a corrupt metrics report");
        }
      }
      if (broken.ok() && (!in.ok() || !in.at_end())) {
        broken = data_loss("rank " + std::to_string(r) + " sent corrupt step mail");
      }
      for (auto& [id, output] : outputs) {
        if (!broken.ok()) break;
        if (Status delivered = deliver(static_cast<int>(r), id, std::move(output));
            !delivered.ok()) {
          broken = data_loss("rank " + std::to_string(r) + ": " + delivered.message());
        }
      }
    }
  } else {
    broken = agreement.status();
  }
  if (!broken.ok()) {
    end_remote(FinishReason::kError,
               unavailable("expert-parallel group lost: " + broken.message()));
    mark_done(broken);
    return broken;
  }
  return agreement->step;
}

Result<bool> DataParallelRouter::follow(int64_t rows) {
  std::vector<std::byte> mail;
  bool report = false;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    mail = take_letter(&outputs_);
    // After a finish, only once its output is in this letter (the counters include it).
    report = (report_due_ && outputs_.ends.empty()) || now - last_report_ >= kReportInterval;
    if (report) report_due_ = false;
  }
  if (report) {
    std::vector<std::byte> section;
    ByteWriter writer(&section);
    writer.put<uint8_t>(kReportTag);
    encode_engine_metrics(engine_->metrics(), writer);
    const std::vector<int64_t> counts = expert_counts_ ? expert_counts_() : std::vector<int64_t>();
    writer.put_array(std::span<const int64_t>(counts));
    const size_t head = mail.empty() ? sizeof(uint64_t) : 0;
    if (mail.size() + head + section.size() <= max_letter_bytes_) {
      if (head > 0) ByteWriter(&mail).put<uint64_t>(0);  // no outputs this time
      mail.insert(mail.end(), section.begin(), section.end());
      last_report_ = now;
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      report_due_ = true;  // with a later, smaller letter
    }
  }
  Result<dist::StepAgreement> agreement = agree_(rows, false, mail);
  if (!agreement.ok()) {
    mark_done(agreement.status());
    return agreement.status();
  }
  if (!agreement->mail.empty() && !agreement->mail[0].empty()) {
    ByteReader in(agreement->mail[0]);
    bool corrupt = false;
    const uint64_t count = in.get_count(1 + sizeof(int32_t) + sizeof(uint64_t));
    for (uint64_t i = 0; i < count && in.ok(); ++i) {
      const auto kind = in.get<uint8_t>();
      const auto target = in.get<int32_t>();
      const auto id = in.get<uint64_t>();
      if (kind == static_cast<uint8_t>(Command::kSubmit)) {
        Result<EngineRequest> request = decode_request(in);
        if (!request.ok()) break;
        if (target != rank_) continue;
        if (Status s = attach_constraint(*request); !s.ok()) request = s;
        // Outputs are mailed back at the next agreement. The sink runs on this engine
        // thread, as lockstep() does, so hosted_ needs no lock.
        Result<RequestId> engine_id =
            !request.ok()
                ? Result<RequestId>(request.status())
                : engine_->submit(std::move(request).value(), [this, id](RequestOutput out) {
                    if (out.finished) hosted_.erase(id);
                    std::lock_guard<std::mutex> lock(mutex_);
                    if (out.finished) report_due_ = true;
                    ByteWriter writer(&outputs_.body);
                    writer.put<uint64_t>(id);
                    encode_output(out, writer);
                    outputs_.ends.push_back(outputs_.body.size());
                  });
        if (engine_id.ok()) {
          hosted_[id].engine_id = *engine_id;
        } else {
          RequestOutput refused;
          refused.finished = true;
          refused.error = engine_id.status();
          std::lock_guard<std::mutex> lock(mutex_);
          ByteWriter writer(&outputs_.body);
          writer.put<uint64_t>(id);
          encode_output(refused, writer);
          outputs_.ends.push_back(outputs_.body.size());
        }
      } else if (kind == static_cast<uint8_t>(Command::kAbort)) {
        if (target != rank_) continue;
        auto it = hosted_.find(id);
        if (it != hosted_.end()) engine_->abort(it->second.engine_id);
      } else {
        corrupt = true;
        break;
      }
    }
    if (corrupt || !in.ok() || !in.at_end()) {
      Status corrupt = data_loss("rank 0 sent corrupt step mail");
      mark_done(corrupt);
      return corrupt;
    }
  }
  if (agreement->stop) {
    mark_done(ok_status());
    return unavailable("rank 0 stopped the expert-parallel group");
  }
  return agreement->step;
}

}  // namespace peerserve
