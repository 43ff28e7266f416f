// Names of the filters, tests, global functions and methods the interpreter implements;
// the parser rejects all others up front.
#pragma once

#include <string_view>

namespace peerserve::jinja {

bool is_supported_filter(std::string_view name);
bool is_supported_test(std::string_view name);
bool is_supported_function(std::string_view name);
bool is_supported_method(std::string_view name);

}  // namespace peerserve::jinja
