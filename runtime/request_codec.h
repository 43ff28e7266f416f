// The wire form of EngineRequest and RequestOutput, for handing requests to the engine of
// another rank and getting its outputs back (runtime/data_parallel_router.h).
//
// Every field is encoded; decoding checks bounds, enum ranges and lengths and returns
// DataLoss naming what was wrong, so a corrupt message never becomes a bad request.
#pragma once

#include <cstddef>
#include <vector>

#include "base/byte_io.h"
#include "base/status.h"
#include "runtime/request.h"

namespace peerserve {

void encode_request(const EngineRequest& request, ByteWriter& out);
Result<EngineRequest> decode_request(ByteReader& in);

void encode_output(const RequestOutput& output, ByteWriter& out);
Result<RequestOutput> decode_output(ByteReader& in);

}  // namespace peerserve
