// Typed, validated reads of JSON objects for profile files. Every problem is recorded with
// its JSON path and what was expected ("h100.json: efficiency.gemm = 1.7, expected a fraction
// in (0, 1]"), reading continues, and status() reports all of them at once.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace peerserve::plan {

class JsonFields {
 public:
  // `path` names the object in messages, e.g. "data/hardware/h100.json".
  JsonFields(const nlohmann::json& object, std::string path);

  bool has(std::string_view key) const;

  // Required numbers. `what` says what the value means, for the error message.
  double positive(std::string_view key, std::string_view what);       // finite, > 0
  double non_negative(std::string_view key, std::string_view what);   // finite, >= 0
  double fraction(std::string_view key, std::string_view what);       // in (0, 1]
  int positive_int(std::string_view key, std::string_view what);      // integer >= 1
  int non_negative_int(std::string_view key, std::string_view what);  // integer >= 0

  // Optional numbers: nullopt when absent or null; validated like the required ones.
  std::optional<double> optional_positive(std::string_view key, std::string_view what);
  std::optional<double> optional_non_negative(std::string_view key, std::string_view what);
  std::optional<int> optional_non_negative_int(std::string_view key, std::string_view what);

  std::string string(std::string_view key, std::string_view what);
  std::optional<std::string> optional_string(std::string_view key);

  // A nested object; absent or not an object records an error and returns an empty reader.
  JsonFields object(std::string_view key);
  std::optional<JsonFields> optional_object(std::string_view key);
  const nlohmann::json& json() const { return *object_; }

  // Records every key not in `allowed` (catches misspelt optional fields).
  void reject_unknown_keys(std::initializer_list<std::string_view> allowed);

  // Records a problem found by the caller (e.g. a cross-field check).
  void add_error(std::string_view key, std::string message);

  // Ok, or InvalidArgument listing every recorded problem.
  Status status() const;

 private:
  JsonFields(const nlohmann::json* object, std::string source, std::string prefix,
             std::shared_ptr<std::vector<std::string>> errors);
  const nlohmann::json* find(std::string_view key) const;
  std::optional<double> number(std::string_view key, std::string_view what, bool required);
  std::string field_path(std::string_view key) const;

  const nlohmann::json* object_;
  std::string source_;  // the file or document, e.g. "h100.json"
  std::string prefix_;  // dotted path of this object inside it, e.g. "efficiency."
  std::shared_ptr<std::vector<std::string>> errors_;  // shared with nested readers
};

}  // namespace peerserve::plan
