#include "apps/ep_options.h"

#include <vector>

namespace peerserve {

void add_ep_options(CLI::App* command, EpCli* cli) {
  // The options that only mean something across ranks (--eplb-* have their own messages).
  std::vector<CLI::Option*> across_ranks;
  CLI::Option* ep =
      command
          ->add_option(
              "--ep", cli->ep,
              "Expert-parallel ranks: run as 'mpirun -np N peerserve <command> --ep N ...'; "
              "each rank loads 1/N of the routed experts (docs/expert_parallelism.md)")
          ->check(CLI::Range(1, 4096))
          ->capture_default_str();
  across_ranks.push_back(
      command
          ->add_option(
              "--ep-dispatch-dtype", cli->dispatch_dtype,
              "How tokens travel to their experts' ranks: int8 (per-token scale), bf16, or "
              "fp32 (bitwise equal to one process)")
          ->check(CLI::IsMember({"int8", "bf16", "fp32"}))
          ->needs(ep)  // without --ep there is one process: it would be ignored
          ->capture_default_str());
  across_ranks.push_back(
      command
          ->add_option("--ep-transport", cli->windows,
                       "How the ranks reach each other's exchange buffers: auto = shared memory "
                       "when every rank is on one host, else MPI one-sided puts; network = MPI "
                       "puts even on one host (the cross-host path; mpirun's --mca options pick "
                       "the transport, e.g. '--mca osc pt2pt --mca btl self,tcp')")
          ->check(CLI::IsMember({"auto", "network"}))
          ->needs(ep)
          ->capture_default_str());
  across_ranks.push_back(
      command
          ->add_option("--ep-timeout-ms", cli->peer_timeout_ms,
                       "A peer rank silent for this long is reported lost and the job ends")
          ->check(CLI::Range(100, 3600000))
          ->needs(ep)
          ->capture_default_str());
  across_ranks.push_back(
      command
          ->add_option(
              "--ep-load-timeout-ms", cli->load_timeout_ms,
              "How long a rank waits for the others to finish loading (the model at "
              "start-up, the experts it newly holds at a rebalance) or to reach the end of "
              "the job before it reports them lost; loading is slower and more uneven than "
              "an exchange")
          ->check(CLI::Range(100, 86400000))
          ->needs(ep)
          ->capture_default_str());
  across_ranks.push_back(
      command
          ->add_option("--ep-split-rows", cli->split_rows,
                       "Split the attention projections, dense MLPs and shared experts over the "
                       "ranks (tensor parallel) in steps where no rank brings more rows than this; "
                       "0 = never (docs/expert_parallelism.md)")
          ->check(CLI::Range(0, 1 << 16))
          ->needs(ep)
          ->capture_default_str());
  command
      ->add_option("--eplb-interval", cli->eplb_interval,
                   "Rebalance the experts over the ranks every N steps from the loads counted "
                   "since the last rebalance (online EPLB; 0 = never)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->needs(ep)
      ->capture_default_str();
  command
      ->add_option("--eplb-redundant-experts", cli->eplb_redundant_experts,
                   "Extra expert slots per MoE layer for copies of the hottest experts, placed "
                   "at each rebalance (needs --eplb-interval); --ep must divide the experts, so "
                   "this must be a multiple of --ep too. Copies let a lone request's experts "
                   "spread over the ranks "
                   "(docs/expert_parallelism.md: mini EP=2 batch 1 +10-19%) at the cost of "
                   "their memory")
      ->check(CLI::Range(0, 1 << 16))
      ->needs(ep)
      ->capture_default_str();
  command->parse_complete_callback([cli, across_ranks] {
    // Copies are only placed by a rebalance: without one the slots would stay empty, silently.
    if (cli->eplb_redundant_experts > 0 && cli->eplb_interval == 0) {
      throw CLI::ValidationError("--eplb-redundant-experts " +
                                 std::to_string(cli->eplb_redundant_experts) +
                                 ": copies are placed when the experts are rebalanced; add "
                                 "--eplb-interval STEPS");
    }
    // Without expert parallelism there is nothing to rebalance: ignored, silently.
    if (cli->eplb_interval > 0 && cli->ep == 1) {
      throw CLI::ValidationError(
          "--eplb-interval " + std::to_string(cli->eplb_interval) +
          ": experts are rebalanced over expert-parallel ranks; it needs --ep N with N > 1 (one "
          "process holds every expert)");
    }
    // --ep 1 is one process: an exchange option given with it would be ignored, silently.
    for (const CLI::Option* option : across_ranks) {
      if (cli->ep == 1 && option->count() > 0) {
        throw CLI::ValidationError(option->get_name() +
                                   ": applies to the exchange between expert-parallel ranks; it "
                                   "needs --ep N with N > 1 (--ep 1 is one process)");
      }
    }
  });
}

}  // namespace peerserve
