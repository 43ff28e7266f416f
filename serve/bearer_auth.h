// The OpenAI API key check shared by the server and the router: 'Authorization: Bearer KEY'
// compared in time that depends only on the lengths.
#pragma once

#include <string>

#include "serve/http_server.h"
#include "serve/openai_protocol.h"

namespace peerserve {

bool bearer_token_matches(const HttpRequest& request, const std::string& api_key);
// The 401 answer (send it with the WWW-Authenticate: Bearer header).
ApiError missing_api_key_error();

}  // namespace peerserve
