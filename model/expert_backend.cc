#include "model/expert_backend.h"

namespace peerserve {

Status ExpertBackend::run(const RoutedTokens& tokens, Call& call, std::span<float> out) {
  PS_RETURN_IF_ERROR(dispatch(tokens, call));
  PS_RETURN_IF_ERROR(compute(call));
  return combine(call, out);
}

}  // namespace peerserve
