#include "tokenizer/jinja/builtins.h"

#include <set>

namespace peerserve::jinja {
namespace {

const std::set<std::string_view> kFilters = {
    "length", "count",  "string", "trim",       "upper",      "lower",   "default",    "d",
    "join",   "first",  "last",   "list",       "tojson",     "replace", "capitalize", "title",
    "items",  "int",    "float",  "abs",        "round",      "reverse", "sort",       "unique",
    "safe",   "select", "reject", "selectattr", "rejectattr", "map"};
const std::set<std::string_view> kTests = {
    "defined",  "undefined",   "none",  "string",  "number",  "mapping", "iterable",
    "sequence", "boolean",     "true",  "false",   "integer", "float",   "odd",
    "even",     "divisibleby", "eq",    "equalto", "ne",      "lt",      "le",
    "gt",       "ge",          "==",    "!=",      "<",       "<=",      ">",
    ">=",       "in",          "lower", "upper",   "sameas",  "callable"};
const std::set<std::string_view> kFunctions = {"raise_exception", "namespace", "range", "dict",
                                               "strftime_now"};
const std::set<std::string_view> kMethods = {"strip",    "lstrip", "rstrip", "split",  "startswith",
                                             "endswith", "upper",  "lower",  "title",  "capitalize",
                                             "replace",  "items",  "keys",   "values", "get"};

}  // namespace

bool is_supported_filter(std::string_view name) {
  return kFilters.count(name) > 0;
}
bool is_supported_test(std::string_view name) {
  return kTests.count(name) > 0;
}
bool is_supported_function(std::string_view name) {
  return kFunctions.count(name) > 0;
}
bool is_supported_method(std::string_view name) {
  return kMethods.count(name) > 0;
}

}  // namespace peerserve::jinja
