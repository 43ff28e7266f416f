// A progress bar on stderr while a checkpoint loads (commands that load a model use it).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <unistd.h>

#include "model/deepseek_model.h"

namespace peerserve {

// callback() suits ModelOptions::progress / CheckpointOptions::progress: on a terminal it
// draws "loading [#####.....]  42%  1.2 / 2.9 GB" at most ten times a second; elsewhere (a
// log file, a pipe) it stays silent until finish(), which prints the final line once (at 100%
// of what was read, with the checkpoint's size when some tensors were never read, e.g. a
// skipped MTP layer).
class LoadProgressBar {
 public:
  explicit LoadProgressBar(const char* label = "loading") { state_->label = label; }
  std::function<void(uint64_t, uint64_t)> callback() {
    return [state = state_](uint64_t done, uint64_t total) { state->draw(done, total, false); };
  }
  void finish() { state_->draw(state_->done, state_->total, true); }
  // The load failed: end the bar's line on a terminal (the error follows), claim nothing.
  void abandon() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->finished) return;
    state_->finished = true;
    if (state_->on_terminal && state_->done > 0) std::fprintf(stderr, "\n");
  }

 private:
  struct State {
    void draw(uint64_t done_in, uint64_t total_in, bool final) {
      std::lock_guard<std::mutex> lock(mutex);  // the loader reads tensors on several threads
      done = std::max(done, done_in);
      total = total_in;
      if (total == 0 || finished) return;
      if (!final && !on_terminal) return;
      const auto now = std::chrono::steady_clock::now();
      if (!final && now - last < std::chrono::milliseconds(100)) return;
      last = now;
      constexpr int kWidth = 30;
      // The end is 100% of what was read: some tensors may never be (a skipped MTP layer),
      // and a bar stopping at 67% looks like a load cut short. The checkpoint's size follows.
      const double fraction = final ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
      char bar[kWidth + 1];
      for (int i = 0; i < kWidth; ++i) bar[i] = i < static_cast<int>(fraction * kWidth) ? '#' : '.';
      bar[kWidth] = '\0';
      if (final && done < total) {
        std::fprintf(stderr,
                     "%s%s [%s] 100%%  %.2f GB (of %.2f GB in the checkpoint; the rest "
                     "is not used)\n",
                     on_terminal ? "\r" : "", label, bar, done / 1e9, total / 1e9);
        finished = true;
        std::fflush(stderr);
        return;
      }
      std::fprintf(stderr, "%s%s [%s] %3d%%  %.2f / %.2f GB", on_terminal ? "\r" : "", label, bar,
                   static_cast<int>(fraction * 100.0), done / 1e9, total / 1e9);
      if (final) {
        std::fprintf(stderr, "\n");
        finished = true;
      }
      std::fflush(stderr);
    }
    std::mutex mutex;
    const char* label = "loading";
    bool on_terminal = isatty(fileno(stderr)) != 0;
    std::chrono::steady_clock::time_point last{};
    uint64_t done = 0, total = 0;
    bool finished = false;
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// DeepseekModel::load with a LoadProgressBar on stderr (replaces options.progress).
inline Result<std::unique_ptr<DeepseekModel>> load_model_showing_progress(const std::string& dir,
                                                                          ModelOptions options) {
  LoadProgressBar progress;
  options.progress = progress.callback();
  auto model = DeepseekModel::load(dir, options);
  if (model.ok()) {
    progress.finish();
  } else {
    progress.abandon();
  }
  return model;
}

}  // namespace peerserve
