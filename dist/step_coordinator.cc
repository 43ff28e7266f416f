#include "dist/step_coordinator.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace peerserve::dist {

Result<StepAgreement> StepCoordinator::agree(int64_t tokens, bool stop,
                                             std::span<const std::byte> mail, uint64_t proposal) {
  if (mail.size() > kMaxMailBytes) {
    return invalid_argument("step mail of " + std::to_string(mail.size()) +
                            " bytes is over the limit of " + std::to_string(kMaxMailBytes));
  }
  // Per rank: has work, tokens, stop, mail length, proposal.
  constexpr size_t kFields = 5;
  const int64_t mine[kFields] = {tokens > 0 ? 1 : 0, tokens, stop ? 1 : 0,
                                 static_cast<int64_t>(mail.size()), static_cast<int64_t>(proposal)};
  const int size = comm_->size();
  std::vector<int64_t>& all = numbers_;  // reused: an agreement without mail allocates nothing
  all.resize(kFields * static_cast<size_t>(size));
  PS_RETURN_IF_ERROR(comm_->allgather(std::as_bytes(std::span(mine)),
                                      std::as_writable_bytes(std::span(all)), timeout_));
  StepAgreement agreement;
  int64_t longest = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* fields = &all[kFields * static_cast<size_t>(r)];
    // A peer's numbers are trusted as much as its code (same binary), but a corrupt mail
    // length must not turn into a huge allocation.
    if (fields[3] < 0 || static_cast<uint64_t>(fields[3]) > kMaxMailBytes) {
      return data_loss("rank " + std::to_string(r) + " announced step mail of " +
                       std::to_string(fields[3]) + " bytes");
    }
    agreement.ranks_with_work += fields[0];
    agreement.tokens += fields[1];
    agreement.stop = agreement.stop || fields[2] > 0;
    longest = std::max(longest, fields[3]);
  }
  if (longest > 0) {
    const size_t letter = static_cast<size_t>(longest);
    std::vector<std::byte> padded(letter);
    if (!mail.empty()) std::memcpy(padded.data(), mail.data(), mail.size());
    std::vector<std::byte> gathered(letter * static_cast<size_t>(size));
    PS_RETURN_IF_ERROR(comm_->allgather(padded, gathered, timeout_));
    agreement.mail.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const auto length = static_cast<size_t>(all[kFields * static_cast<size_t>(r) + 3]);
      const std::byte* begin = gathered.data() + letter * static_cast<size_t>(r);
      agreement.mail[static_cast<size_t>(r)].assign(begin, begin + length);
    }
  }
  agreement.leader_proposal = static_cast<uint64_t>(all[4]);
  agreement.step = agreement.ranks_with_work > 0;
  agreement.step_index = steps_;
  if (agreement.step) ++steps_;
  return agreement;
}

}  // namespace peerserve::dist
