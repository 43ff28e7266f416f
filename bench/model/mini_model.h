// The mini test preset as the model benches' default checkpoint: written once to
// $TMPDIR/peerserve_bench_mini and reused by later runs.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "base/status.h"
#include "model/checkpoint/test_model.h"

namespace peerserve::bench {

inline std::string default_mini_model_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/peerserve_bench_mini";
}

// Writes the mini preset to `dir` unless a checkpoint (config.json) is already there.
inline Status ensure_mini_model(const std::string& dir) {
  if (std::filesystem::exists(dir + "/config.json")) return ok_status();
  std::fprintf(stderr, "writing the mini test model to %s ...\n", dir.c_str());
  TestModelOptions options;
  options.preset = TestModelPreset::kMini;
  return write_test_model(dir, options);
}

}  // namespace peerserve::bench
