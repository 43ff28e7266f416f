// finish_reason_name lives in the scheduler (runtime/scheduler.cc), which the request
// parser's fuzzer does not link; the parser only names it for responses, which the fuzzer
// does not build.
#include "runtime/request.h"

namespace peerserve {

std::string_view finish_reason_name(FinishReason) {
  return "fuzz";
}

}  // namespace peerserve
