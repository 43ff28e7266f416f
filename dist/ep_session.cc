#include "dist/ep_session.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/ep_expert_backend.h"
#include "dist/expert_placement.h"
#include "dist/expert_rebalance.h"
#include "dist/expert_weights_store.h"
#include "dist/mpi_communicator.h"
#include "dist/tensor_parallel_backend.h"
#include "model/expert_load_recorder.h"
#include "model/model_config.h"

namespace peerserve {
namespace {

// Physical memory, or the cgroup's limit (a container's) when that is lower.
double usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  double bytes = pages > 0 && page_bytes > 0
                     ? static_cast<double>(pages) * static_cast<double>(page_bytes)
                     : 0.0;
  std::ifstream limit("/sys/fs/cgroup/memory.max");  // cgroup v2; "max" when unlimited
  double cgroup = 0;
  if (limit >> cgroup && cgroup > 0 && (bytes == 0 || cgroup < bytes)) bytes = cgroup;
  return bytes;
}

// The size of the job when started by OpenMPI's mpirun, 0 otherwise.
int mpirun_world_size() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size == nullptr ? 0 : std::atoi(size);
}

std::vector<int> moe_layers_of(const ModelConfig& config, bool with_mtp) {
  std::vector<int> layers;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (config.is_moe_layer(l)) layers.push_back(static_cast<int>(l));
  }
  if (with_mtp && config.num_nextn_predict_layers > 0) {
    layers.push_back(static_cast<int>(config.num_hidden_layers));
  }
  return layers;
}

}  // namespace

struct EpSession::Impl {
  // Builds the expert-parallel backend for `placement` (collective) and installs it.
  Status install_placement(DeepseekModel& model, dist::ExpertPlacement new_placement);
  // At an agreed step: rebalances when the interval says so (every rank at the same step).
  Status maybe_rebalance(DeepseekModel& model, const dist::StepAgreement& agreement);
  // Rebalances from the loads counted since the last rebalance (collective); `step` for the log.
  Status rebalance(DeepseekModel& model, int64_t step);
  // Collective: returns once every rank has loaded `what` (within cli.load_timeout_ms).
  Status wait_for_loads(const char* what);

  EpCli cli;
  std::string model_dir;
  std::unique_ptr<dist::MpiCommunicator> comm;  // null when inert
  std::unique_ptr<dist::StepCoordinator> coordinator;
  std::optional<dist::ExpertPlacement> placement;
  std::unique_ptr<dist::ExpertWeightsStore> store;
  std::shared_ptr<const dist::ExpertWeightsStore::Set> experts;  // this rank's, for placement
  // Wraps the EP backend; replaced by each rebalance, under counts_mutex (expert_load_totals
  // reads it from other threads).
  std::shared_ptr<ExpertLoadRecorder> recorder;
  std::mutex counts_mutex;
  std::vector<int64_t> banked_counts;           // what earlier rebalances took from their recorders
  dist::EpExpertBackend* ep_backend = nullptr;  // owned by recorder
  // The last agreement's counts (ExpertExchange::set_step), for each new EP backend.
  int64_t step_ranks_with_work = 0;
  int64_t step_tokens = 0;
  dist::DispatchDtype dtype = dist::DispatchDtype::kInt8;
  int64_t max_rows = 0;
  int64_t last_rebalance_step = 0;
  bool stopped = false;
};

EpSession::EpSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EpSession::~EpSession() = default;

Result<std::unique_ptr<EpSession>> EpSession::start(const EpCli& cli) {
  auto impl = std::make_unique<Impl>();
  impl->cli = cli;
  PS_ASSIGN_OR_RETURN(impl->dtype, dist::parse_dispatch_dtype(cli.dispatch_dtype));
  PS_ASSIGN_OR_RETURN(const dist::MpiWindows windows, dist::parse_mpi_windows(cli.windows));
  const int world = mpirun_world_size();
  if (cli.ep <= 1) {
    if (world > 1) {
      return invalid_argument("started by mpirun with " + std::to_string(world) +
                              " processes but --ep is 1: pass --ep " + std::to_string(world));
    }
    return std::unique_ptr<EpSession>(new EpSession(std::move(impl)));
  }
  if (world != cli.ep) {
    return invalid_argument("--ep " + std::to_string(cli.ep) + " needs " + std::to_string(cli.ep) +
                            " processes, but " +
                            (world == 0 ? std::string("this one was not started by mpirun")
                                        : "mpirun started " + std::to_string(world)) +
                            ": run 'mpirun -np " + std::to_string(cli.ep) +
                            " peerserve <command> --ep " + std::to_string(cli.ep) + " ...'");
  }
  PS_ASSIGN_OR_RETURN(impl->comm, dist::MpiCommunicator::init(nullptr, nullptr, windows));
  impl->comm->set_teardown_timeout(std::chrono::milliseconds(cli.load_timeout_ms));
  if (impl->comm->size() != cli.ep) {
    return invalid_argument("--ep " + std::to_string(cli.ep) + " but the MPI world has " +
                            std::to_string(impl->comm->size()) + " ranks");
  }
  impl->coordinator = std::make_unique<dist::StepCoordinator>(
      impl->comm.get(), std::chrono::milliseconds(cli.peer_timeout_ms));
  return std::unique_ptr<EpSession>(new EpSession(std::move(impl)));
}

int EpSession::report_start_error(const Status& status) {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank == nullptr || std::string(rank) == "0") {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    std::fflush(stderr);
  } else {
    // mpirun ends the whole job at the first non-zero exit: were another rank to exit
    // first, rank 0 could be killed before it reports. The wait ends with the job.
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  return 1;
}

bool EpSession::distributed() const {
  return impl_->comm != nullptr;
}
int EpSession::rank() const {
  return impl_->comm ? impl_->comm->rank() : 0;
}
int EpSession::size() const {
  return impl_->comm ? impl_->comm->size() : 1;
}

Status EpSession::plan_experts(const std::string& model_dir, ModelOptions* options) {
  if (!distributed()) return ok_status();
  const Status status = plan_experts_here(model_dir, options);
  // Every rank reads its own copy of the checkpoint (on its own host, across machines): one
  // can fail where the others do not. Agree before anyone loads, or the others wait for that
  // rank's load until --ep-load-timeout-ms (half an hour by default). A rank that failed
  // says why; then every rank ends with the error (rank 0 prints it).
  std::vector<int64_t> failed = {status.ok() ? 0 : 1};
  PS_RETURN_IF_ERROR(impl_->comm->allreduce(failed, dist::ReduceOp::kSum,
                                            std::chrono::milliseconds(impl_->cli.load_timeout_ms)));
  if (failed[0] == 0) return ok_status();
  // Every rank failed: alike (a bad flag, the same folder everywhere); rank 0 says it once.
  if (static_cast<int>(failed[0]) == size()) return status;
  if (!status.ok() && !leader()) {
    std::fprintf(stderr, "error: rank %d of %d: %s\n", rank(), size(), status.message().c_str());
    std::fflush(stderr);
  }
  if (!status.ok()) return status;
  return Status(status.ok() ? StatusCode::kUnavailable : status.code(),
                std::to_string(failed[0]) + " of " + std::to_string(size()) +
                    " ranks could not plan their experts from " + model_dir +
                    " (their errors above)");
}

Status EpSession::plan_experts_here(const std::string& model_dir, ModelOptions* options) {
  PS_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir + "/config.json"));
  PS_ASSIGN_OR_RETURN(
      dist::ExpertPlacement placement,
      dist::ExpertPlacement::contiguous(moe_layers_of(config, options->load_mtp),
                                        static_cast<int>(config.n_routed_experts), size()));
  const int physical =
      static_cast<int>(config.n_routed_experts) + impl_->cli.eplb_redundant_experts;
  if ((impl_->cli.eplb_interval > 0 || impl_->cli.eplb_redundant_experts > 0) &&
      physical % size() != 0) {
    return invalid_argument("--eplb-redundant-experts " +
                            std::to_string(impl_->cli.eplb_redundant_experts) +
                            ": must be a multiple of --ep " + std::to_string(size()) +
                            " (every rank holds the same number of expert slots, and --ep "
                            "divides the " +
                            std::to_string(config.n_routed_experts) + " experts)");
  }
  impl_->placement = std::move(placement);
  impl_->model_dir = model_dir;
  // The session reads this rank's experts itself (ExpertWeightsStore), so that a rebalance
  // can change them; the model loads everything else.
  options->routed_experts = [](int64_t) { return std::vector<int32_t>{}; };
  return ok_status();
}

Status EpSession::Impl::wait_for_loads(const char* what) {
  const Status status = comm->barrier(std::chrono::milliseconds(cli.load_timeout_ms));
  if (status.ok()) return status;
  return Status(status.code(), "rank " + std::to_string(comm->rank()) +
                                   " waited for every rank to finish loading " + what +
                                   " (--ep-load-timeout-ms " + std::to_string(cli.load_timeout_ms) +
                                   "): " + status.message());
}

Status EpSession::Impl::install_placement(DeepseekModel& model,
                                          dist::ExpertPlacement new_placement) {
  const ModelConfig& config = model.config();
  const int64_t layers = config.num_hidden_layers + 1;
  PS_ASSIGN_OR_RETURN(
      auto new_experts,
      store->load(new_placement, comm->rank(), layers, [&](int64_t layer, MlpWeights& expert) {
        return model.prepare_routed_expert(layer, expert);
      }));
  // The backend's window is made by a collective under the peer timeout.
  PS_RETURN_IF_ERROR(wait_for_loads("its routed experts"));
  dist::EpExpertBackendOptions o;
  o.communicator = comm.get();
  o.placement = new_placement;
  o.local_experts_by_layer = new_experts->spans();
  o.dispatch_dtype = dtype;
  o.max_tokens_per_rank = static_cast<int>(max_rows);
  o.hidden_size = config.hidden_size;
  o.top_k = static_cast<int>(config.num_experts_per_tok);
  o.precision = model.options().gemm_precision == GemmPrecision::kFp32
                    ? kernels::ActivationPrecision::kFp32
                    : kernels::ActivationPrecision::kBf16;
  o.pool = nullptr;
  o.peer_timeout = std::chrono::milliseconds(cli.peer_timeout_ms);
  PS_ASSIGN_OR_RETURN(auto backend, dist::EpExpertBackend::create(std::move(o)));
  ep_backend = backend.get();
  ep_backend->set_step(static_cast<int>(step_ranks_with_work), step_tokens);
  // The shared experts' placement (TensorParallelBackend) needs them in split steps only.
  ep_backend->count_experts_up_to(cli.split_rows);
  auto next =
      std::make_shared<ExpertLoadRecorder>(std::move(backend), layers, config.n_routed_experts);
  model.set_expert_backend(next);
  {
    std::lock_guard<std::mutex> lock(counts_mutex);
    recorder = std::move(next);
  }
  // The old backend is gone with the model's reference; its experts can go too.
  experts = std::move(new_experts);
  store->trim(*experts);
  placement = std::move(new_placement);
  return ok_status();
}

Status EpSession::Impl::maybe_rebalance(DeepseekModel& model,
                                        const dist::StepAgreement& agreement) {
  // Not on the agreement that ends the run: the experts would be read for no step after it.
  if (cli.eplb_interval <= 0 || !agreement.step || agreement.stop) return ok_status();
  if (agreement.step_index - last_rebalance_step < cli.eplb_interval) return ok_status();
  last_rebalance_step = agreement.step_index;
  return rebalance(model, agreement.step_index);
}

Status EpSession::Impl::rebalance(DeepseekModel& model, int64_t step) {
  const auto timeout = std::chrono::milliseconds(cli.peer_timeout_ms);
  std::vector<int64_t> counts;
  {
    // Taken and banked under one lock: a /metrics read between the two would miss them.
    std::lock_guard<std::mutex> lock(counts_mutex);
    counts = recorder->take();
    add_expert_counts(banked_counts, counts);
  }
  PS_ASSIGN_OR_RETURN(
      dist::Rebalance rebalance,
      dist::rebalance_experts(*comm, counts, *placement, cli.eplb_redundant_experts, timeout));
  if (!rebalance.changed()) {
    if (comm->rank() == 0) {
      std::fprintf(stderr,
                   "eplb: step %lld: kept the placement: max/mean expert pairs per rank (EPLB "
                   "model) %.3f over %lld pairs, which a new one would not lower\n",
                   static_cast<long long>(step), rebalance.before_max_over_mean,
                   static_cast<long long>(rebalance.pairs));
    }
    return ok_status();
  }
  const int64_t read_before = store->experts_read();
  PS_RETURN_IF_ERROR(install_placement(model, std::move(rebalance.placement)));
  if (comm->rank() == 0) {
    std::fprintf(
        stderr,
        "eplb: step %lld: max/mean expert pairs per rank (EPLB model) %.3f -> %.3f over %lld pairs "
        "(%d redundant experts; rank 0 read %lld experts)\n",
        static_cast<long long>(step), rebalance.before_max_over_mean, rebalance.after_max_over_mean,
        static_cast<long long>(rebalance.pairs), cli.eplb_redundant_experts,
        static_cast<long long>(store->experts_read() - read_before));
  }
  return ok_status();
}

std::vector<int64_t> EpSession::expert_load_totals() const {
  std::lock_guard<std::mutex> lock(impl_->counts_mutex);
  std::vector<int64_t> total = impl_->banked_counts;
  if (impl_->recorder) add_expert_counts(total, impl_->recorder->counts());
  return total;
}

Status EpSession::install(DeepseekModel& model, int64_t max_rows) {
  if (!distributed()) return ok_status();
  PS_RETURN_IF_ERROR(impl_->wait_for_loads("the model"));
  PS_ASSIGN_OR_RETURN(impl_->store, dist::ExpertWeightsStore::open(impl_->model_dir));
  impl_->max_rows = max_rows;
  const ModelConfig& config = model.config();
  dist::TensorParallelOptions split;
  split.communicator = impl_->comm.get();
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    dist::ReplicatedLayerWeights& weights = split.layers.emplace_back();
    if (const DecoderLayerWeights* l = model.decoder_layer(layer); l != nullptr) {
      weights.attention = &l->attention;
      if (l->dense_mlp) weights.mlp = &*l->dense_mlp;
      if (l->moe && l->moe->shared) {
        weights.mlp = &*l->moe->shared;
        weights.shared_expert = true;
      }
    }
  }
  // The shared expert goes where this step's routed experts are fewest, from what each
  // rank's dispatch of the layer just sent (the EP backend is installed after this one).
  split.routed_experts = [impl = impl_.get()](int64_t layer, std::span<int32_t> out) {
    if (impl->ep_backend == nullptr) return false;
    const dist::ExpertExchange::DispatchLoad load = impl->ep_backend->last_dispatch_load();
    if (load.layer != layer || load.experts_per_rank.size() != out.size()) return false;
    std::copy(load.experts_per_rank.begin(), load.experts_per_rank.end(), out.begin());
    return true;
  };
  split.routed_intermediate = config.moe_intermediate_size;
  split.lm_head = model.lm_head();
  split.hidden_size = config.hidden_size;
  split.max_rows_per_rank = impl_->cli.split_rows;
  split.peer_timeout = std::chrono::milliseconds(impl_->cli.peer_timeout_ms);
  // A quarter of the memory this process may use, shared by the ranks on this host: the
  // option allows 65,536 rows, for which V3's LM head slices alone would want tens of GiB
  // per rank (allocated at start, then killed or thrown). A rank over it aborts the job.
  const int host_ranks = impl_->comm->shared_memory_windows() ? impl_->comm->size() : 1;
  split.max_buffer_bytes = 0.25 * usable_memory_bytes() / host_ranks;
  auto created = dist::TensorParallelBackend::create(std::move(split));
  if (!created.ok()) {
    if (created.status().code() != StatusCode::kResourceExhausted) return created.status();
    return resource_exhausted("--ep-split-rows " + std::to_string(impl_->cli.split_rows) + ": " +
                              created.status().message() + " (a quarter of the memory, shared by " +
                              std::to_string(host_ranks) +
                              " rank(s) on this host); lower it, or 0 to never split");
  }
  auto tensor_parallel = std::move(created).value();
  if (impl_->comm->rank() == 0 && impl_->cli.split_rows > 0) {
    std::fprintf(stderr,
                 "ep: the attention projections, dense MLPs and shared experts of %d of %lld "
                 "layers%s run split over %d ranks in steps where each rank brings <= %d rows\n",
                 tensor_parallel->split_layers(), static_cast<long long>(config.num_hidden_layers),
                 tensor_parallel->splits_lm_head() ? " and the LM head" : "", impl_->comm->size(),
                 impl_->cli.split_rows);
  }
  if (impl_->comm->rank() == 0) {
    std::fprintf(stderr, "ep: %d ranks exchange tokens through %s\n", impl_->comm->size(),
                 impl_->comm->shared_memory_windows()
                     ? "shared memory (every rank on one host)"
                     : "MPI one-sided puts (the transport mpirun's --mca options pick)");
  }
  model.set_replicated_weights_backend(std::move(tensor_parallel));
  return impl_->install_placement(model, *impl_->placement);
}

Result<dist::StepAgreement> EpSession::agree(int64_t rows, bool stop,
                                             std::span<const std::byte> mail, uint64_t proposal) {
  if (!distributed()) {
    dist::StepAgreement a;
    a.step = rows > 0;
    a.stop = stop;
    a.tokens = rows;
    a.leader_proposal = proposal;
    a.ranks_with_work = rows > 0 ? 1 : 0;
    if (!mail.empty()) a.mail.emplace_back(mail.begin(), mail.end());
    return a;
  }
  PS_ASSIGN_OR_RETURN(dist::StepAgreement a, impl_->coordinator->agree(rows, stop, mail, proposal));
  impl_->step_ranks_with_work = a.ranks_with_work;
  impl_->step_tokens = a.tokens;
  if (impl_->ep_backend != nullptr) {
    impl_->ep_backend->set_step(static_cast<int>(a.ranks_with_work), a.tokens);
  }
  return a;
}

Result<dist::StepAgreement> EpSession::agree_and_rebalance(DeepseekModel& model, int64_t rows,
                                                           bool stop,
                                                           std::span<const std::byte> mail,
                                                           uint64_t proposal) {
  PS_ASSIGN_OR_RETURN(dist::StepAgreement a, agree(rows, stop, mail, proposal));
  if (distributed()) PS_RETURN_IF_ERROR(impl_->maybe_rebalance(model, a));
  return a;
}

Status EpSession::rebalance_experts(DeepseekModel& model) {
  if (!distributed()) return ok_status();
  return impl_->rebalance(model, impl_->coordinator->steps());
}

Status EpSession::forward(DeepseekModel& model, std::span<const SequenceChunk> chunks,
                          LatentKvCache& cache, ForwardState& state, ForwardOutput* out) {
  if (distributed()) {
    int64_t rows = 0;
    for (const SequenceChunk& c : chunks) rows += static_cast<int64_t>(c.tokens.size());
    PS_RETURN_IF_ERROR(agree_and_rebalance(model, rows).status());
  }
  return model.forward(chunks, cache, state, out);
}

Status EpSession::finish() {
  if (!distributed() || impl_->stopped) return ok_status();
  impl_->stopped = true;
  return agree(0, /*stop=*/true).status();
}

Status EpSession::follow(DeepseekModel& model, LatentKvCache& cache) {
  auto state = model.new_forward_state();
  ForwardOutput out;
  return follow(model, [&] { return model.forward({}, cache, *state, &out); });
}

Status EpSession::follow(DeepseekModel& model, const std::function<Status()>& empty_step) {
  if (!distributed()) return ok_status();
  while (true) {
    PS_ASSIGN_OR_RETURN(dist::StepAgreement a, agree_and_rebalance(model, 0));
    if (a.step) PS_RETURN_IF_ERROR(empty_step());
    if (a.stop) return ok_status();
  }
}

int EpSession::fail(const Status& status, bool everywhere) {
  if (!distributed()) {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  }
  if (everywhere) {
    if (leader()) std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "error: rank %d of %d: %s\n", rank(), size(), status.message().c_str());
  std::fflush(stderr);
  impl_->comm->abort(1);
}

}  // namespace peerserve
