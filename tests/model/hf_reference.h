// Runs tests/model/hf_reference.py (numpy transcriptions of Hugging Face's
// modeling_deepseek.py pieces) with Debian's /usr/bin/python3.
#pragma once

#include <nlohmann/json.hpp>

namespace peerserve::testing {

// Sends `request` to the script and returns its JSON answer; aborts the test binary with a
// message if python3 or numpy is missing.
nlohmann::json run_hf_reference(const nlohmann::json& request);

}  // namespace peerserve::testing
