// The identity of a checkpoint's weights, for keys of caches shared between engines (a KV
// block is only valid for the exact weights that produced it; kv/kv_namespace.h).
//
// Reading every weight byte would cost seconds per GiB at start-up, so the fingerprint
// covers each *.safetensors file's name, size and header (tensor names, dtypes, shapes,
// offsets) plus 16 windows of 4 KiB spread evenly over its data: two checkpoints of the
// same architecture with different weights (another seed, another fine-tune) differ in
// sampled bytes with overwhelming probability. Users who publish weights under a version
// name can pass that instead (serve --kv-model-id).
#pragma once

#include <string>

#include "base/status.h"

namespace peerserve {

// 16 hex digits; NotFound when `model_dir` has no *.safetensors file, IoError on a read
// failure.
Result<std::string> checkpoint_fingerprint(const std::string& model_dir);

}  // namespace peerserve
