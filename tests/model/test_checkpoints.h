// Test checkpoints generated at test time with the loader's test-model writer, one folder
// per (preset, fp8) and process, removed at exit.
#pragma once

#include <string>

namespace peerserve::testing {

// Path of the tiny preset checkpoint (seed 7); written on first use.
const std::string& tiny_checkpoint_dir(bool fp8 = false);

// The shipped reference model (models/peerserve-dsv3-tiny in the source tree).
std::string shipped_model_dir();

// A fresh empty temporary folder, removed at exit.
std::string make_temp_dir(const std::string& tag);

}  // namespace peerserve::testing
