#include "plan/profiles/json_fields.h"

#include <cmath>

namespace peerserve::plan {
namespace {

const nlohmann::json& empty_object() {
  static const nlohmann::json kEmpty = nlohmann::json::object();
  return kEmpty;
}

std::string describe(double value) {
  nlohmann::json j = value;
  return j.dump();
}

}  // namespace

JsonFields::JsonFields(const nlohmann::json& object, std::string path)
    : JsonFields(&object, std::move(path), "", std::make_shared<std::vector<std::string>>()) {
  if (!object.is_object()) {
    errors_->push_back(source_ + ": expected a JSON object, got " +
                       std::string(object.type_name()));
    object_ = &empty_object();
  }
}

JsonFields::JsonFields(const nlohmann::json* object, std::string source, std::string prefix,
                       std::shared_ptr<std::vector<std::string>> errors)
    : object_(object),
      source_(std::move(source)),
      prefix_(std::move(prefix)),
      errors_(std::move(errors)) {}

std::string JsonFields::field_path(std::string_view key) const {
  return source_ + ": " + prefix_ + std::string(key);
}

const nlohmann::json* JsonFields::find(std::string_view key) const {
  auto it = object_->find(std::string(key));
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(std::string_view key) const {
  return find(key) != nullptr;
}

void JsonFields::add_error(std::string_view key, std::string message) {
  // "path = value, expected ..." for bad values, "path: missing ..." otherwise.
  const bool value = message.rfind("= ", 0) == 0;
  errors_->push_back(field_path(key) + (value ? " " : ": ") + message);
}

std::optional<double> JsonFields::number(std::string_view key, std::string_view what,
                                         bool required) {
  const nlohmann::json* value = find(key);
  if (value == nullptr) {
    if (required) add_error(key, "missing, expected " + std::string(what));
    return std::nullopt;
  }
  if (!value->is_number()) {
    add_error(key, "= " + value->dump() + ", expected a number (" + std::string(what) + ")");
    return std::nullopt;
  }
  const double v = value->get<double>();
  if (!std::isfinite(v)) {
    add_error(key, "is not finite, expected " + std::string(what));
    return std::nullopt;
  }
  return v;
}

double JsonFields::positive(std::string_view key, std::string_view what) {
  auto v = number(key, what, /*required=*/true);
  if (v && *v <= 0.0) {
    add_error(key, "= " + describe(*v) + ", expected " + std::string(what) + " > 0");
    return 0.0;
  }
  return v.value_or(0.0);
}

double JsonFields::non_negative(std::string_view key, std::string_view what) {
  auto v = number(key, what, /*required=*/true);
  if (v && *v < 0.0) {
    add_error(key, "= " + describe(*v) + ", expected " + std::string(what) + " >= 0");
    return 0.0;
  }
  return v.value_or(0.0);
}

double JsonFields::fraction(std::string_view key, std::string_view what) {
  auto v = number(key, what, /*required=*/true);
  if (v && (*v <= 0.0 || *v > 1.0)) {
    add_error(key,
              "= " + describe(*v) + ", expected " + std::string(what) + " as a fraction in (0, 1]");
    return 0.0;
  }
  return v.value_or(0.0);
}

int JsonFields::positive_int(std::string_view key, std::string_view what) {
  auto v = number(key, what, /*required=*/true);
  if (v && (*v < 1.0 || std::floor(*v) != *v || *v > 1e9)) {
    add_error(key,
              "= " + describe(*v) + ", expected " + std::string(what) + " as a whole number >= 1");
    return 0;
  }
  return v ? static_cast<int>(*v) : 0;
}

int JsonFields::non_negative_int(std::string_view key, std::string_view what) {
  auto v = number(key, what, /*required=*/true);
  if (v && (*v < 0.0 || std::floor(*v) != *v || *v > 1e9)) {
    add_error(key,
              "= " + describe(*v) + ", expected " + std::string(what) + " as a whole number >= 0");
    return 0;
  }
  return v ? static_cast<int>(*v) : 0;
}

std::optional<double> JsonFields::optional_positive(std::string_view key, std::string_view what) {
  if (!has(key)) return std::nullopt;
  const double v = positive(key, what);
  return v > 0.0 ? std::optional<double>(v) : std::nullopt;
}

std::optional<double> JsonFields::optional_non_negative(std::string_view key,
                                                        std::string_view what) {
  if (!has(key)) return std::nullopt;
  return non_negative(key, what);
}

std::optional<int> JsonFields::optional_non_negative_int(std::string_view key,
                                                         std::string_view what) {
  if (!has(key)) return std::nullopt;
  return non_negative_int(key, what);
}

std::string JsonFields::string(std::string_view key, std::string_view what) {
  const nlohmann::json* value = find(key);
  if (value == nullptr || !value->is_string()) {
    add_error(key, value == nullptr
                       ? "missing, expected " + std::string(what)
                       : "= " + value->dump() + ", expected a string (" + std::string(what) + ")");
    return {};
  }
  return value->get<std::string>();
}

std::optional<std::string> JsonFields::optional_string(std::string_view key) {
  const nlohmann::json* value = find(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_string()) {
    add_error(key, "= " + value->dump() + ", expected a string");
    return std::nullopt;
  }
  return value->get<std::string>();
}

JsonFields JsonFields::object(std::string_view key) {
  const nlohmann::json* value = find(key);
  const std::string prefix = prefix_ + std::string(key) + ".";
  if (value == nullptr || !value->is_object()) {
    add_error(key, value == nullptr ? "missing, expected an object"
                                    : "expected an object, got " + std::string(value->type_name()));
    return JsonFields(&empty_object(), source_, prefix, errors_);
  }
  return JsonFields(value, source_, prefix, errors_);
}

std::optional<JsonFields> JsonFields::optional_object(std::string_view key) {
  if (!has(key)) return std::nullopt;
  return object(key);
}

void JsonFields::reject_unknown_keys(std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : object_->items()) {
    bool known = false;
    for (std::string_view a : allowed) known = known || key == a;
    if (known) continue;
    std::string list;
    for (std::string_view a : allowed) {
      if (!list.empty()) list += ", ";
      list += a;
    }
    add_error(key, "unknown field, expected one of: " + list);
  }
}

Status JsonFields::status() const {
  if (errors_->empty()) return ok_status();
  std::string message;
  for (size_t i = 0; i < errors_->size(); ++i) {
    if (i > 0) message += "; ";
    message += (*errors_)[i];
  }
  return invalid_argument(message);
}

}  // namespace peerserve::plan
