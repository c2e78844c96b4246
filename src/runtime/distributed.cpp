// Distributed: environment parsing, the K x R layout, gradient/tie/loss collectives, parameter
// gathering, and run_distributed's failure policy. Every c10d call goes through transport/c10d.h.
#include "pipetrain/runtime/distributed.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <thread>

#include <torch/serialize.h>

#include "pipetrain/base/check.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/runtime/gradient_reducer.h"
#include "pipetrain/runtime/launcher.h"
#include "pipetrain/runtime/tensor_io.h"

namespace pipetrain {

namespace {

// Reads an integer variable; records a problem instead of throwing so all are reported at once.
std::optional<int> read_int(const char* name, bool required, std::vector<std::string>* problems) {
  const char* value = std::getenv(name);
  if (!value || !*value) {
    if (required) problems->push_back(std::string(name) + " is not set");
    return std::nullopt;
  }
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value, &end, 10);
  if (errno != 0 || *end != '\0' || parsed < 0 || parsed > 1 << 30) {
    problems->push_back(std::string(name) + "='" + value + "' is not a non-negative integer");
    return std::nullopt;
  }
  return static_cast<int>(parsed);
}

}  // namespace

// ---- environment and layout -------------------------------------------------------------------

bool DistributedEnvironment::present() {
  return std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
}

namespace {

// PIPETRAIN_STORE_SOCKET's descriptor, when it is a TCP socket listening on `port`; else -1.
int inherited_store_socket(int port) {
  const char* text = std::getenv(kStoreSocketVariable);
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1 << 20) return -1;
  int listening = 0;
  socklen_t size = sizeof(listening);
  if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 ||
      listening == 0) {
    return -1;
  }
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      address.ss_family != AF_INET ||
      ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port) != port) {
    return -1;
  }
  return static_cast<int>(fd);
}

}  // namespace

DistributedEnvironment DistributedEnvironment::from_environment() {
  std::vector<std::string> problems;
  DistributedEnvironment env;
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) {
    problems.push_back("MASTER_ADDR is not set");
  } else {
    env.master_addr = addr;
  }
  const auto port = read_int("MASTER_PORT", true, &problems);
  const auto rank = read_int("RANK", true, &problems);
  const auto world_size = read_int("WORLD_SIZE", true, &problems);
  const auto local_rank = read_int("LOCAL_RANK", false, &problems);
  const auto restart_count = read_int("TORCHELASTIC_RESTART_COUNT", false, &problems);
  // PIPETRAIN_RANKS_PER_HOST: hosts of another size than the launcher's (one launcher over
  // several simulated hosts).
  const auto local_world_size = std::getenv("PIPETRAIN_RANKS_PER_HOST")
                                    ? read_int("PIPETRAIN_RANKS_PER_HOST", false, &problems)
                                    : read_int("LOCAL_WORLD_SIZE", false, &problems);
  if (port && (*port < 1 || *port > 65535)) {
    problems.push_back("MASTER_PORT=" + std::to_string(*port) + " is not a TCP port (1..65535)");
  }
  if (world_size && *world_size < 1) problems.push_back("WORLD_SIZE must be >= 1");
  if (rank && world_size && *world_size >= 1 && *rank >= *world_size) {
    problems.push_back("RANK=" + std::to_string(*rank) +
                       " is outside 0..WORLD_SIZE-1 (WORLD_SIZE=" + std::to_string(*world_size) +
                       ")");
  }
  if (!problems.empty()) {
    std::ostringstream message;
    message << "distributed environment: ";
    for (std::size_t p = 0; p < problems.size(); ++p) message << (p ? "; " : "") << problems[p];
    message << ". Start the ranks with a launcher (pipetrain train --nproc N, torchrun) or set "
               "MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and LOCAL_RANK) for every process";
    throw BadInput(message.str());
  }
  env.master_port = *port;
  env.rank = *rank;
  env.world_size = *world_size;
  env.local_rank = local_rank.value_or(0);
  env.restart_count = restart_count.value_or(0);
  env.local_world_size = std::max(0, local_world_size.value_or(0));
  if (env.rank == 0) env.store_socket = inherited_store_socket(env.master_port);
  return env;
}

ParallelLayout ParallelLayout::for_world(int world_size, int pipeline_ranks, int tensor_parallel) {
  PIPETRAIN_CHECK_INPUT(pipeline_ranks >= 1, "pipeline ranks must be >= 1, got ", pipeline_ranks);
  PIPETRAIN_CHECK_INPUT(tensor_parallel >= 1, "tensor-parallel ranks must be >= 1, got ",
                        tensor_parallel);
  const int per_replica = pipeline_ranks * tensor_parallel;
  if (tensor_parallel == 1) {
    PIPETRAIN_CHECK_INPUT(world_size % pipeline_ranks == 0, "WORLD_SIZE=", world_size,
                          " is not a multiple of the ", pipeline_ranks,
                          " pipeline ranks: start pipeline ranks x replicas processes (e.g. "
                          "--nproc ",
                          pipeline_ranks * std::max(1, world_size / pipeline_ranks), ")");
  } else {
    PIPETRAIN_CHECK_INPUT(world_size % per_replica == 0, "WORLD_SIZE=", world_size,
                          " is not a multiple of ", pipeline_ranks, " pipeline ranks x ",
                          tensor_parallel,
                          " tensor-parallel ranks: start pipeline x tensor x data processes (e.g. "
                          "--nproc ",
                          per_replica * std::max(1, world_size / per_replica), ")");
  }
  ParallelLayout layout;
  layout.pipeline_ranks = pipeline_ranks;
  layout.tensor_parallel = tensor_parallel;
  layout.replicas = world_size / per_replica;
  return layout;
}

std::vector<int> ParallelLayout::data_parallel_ranks(int pipeline_rank, int tp_rank) const {
  std::vector<int> ranks;
  for (int d = 0; d < replicas; ++d) ranks.push_back(rank_of(d, pipeline_rank, tp_rank));
  return ranks;
}

std::vector<int> ParallelLayout::pipeline_world_ranks(int replica, int tp_rank) const {
  std::vector<int> ranks;
  for (int p = 0; p < pipeline_ranks; ++p) ranks.push_back(rank_of(replica, p, tp_rank));
  return ranks;
}

std::vector<int> ParallelLayout::tensor_parallel_ranks(int replica, int pipeline_rank) const {
  std::vector<int> ranks;
  for (int t = 0; t < tensor_parallel; ++t) ranks.push_back(rank_of(replica, pipeline_rank, t));
  return ranks;
}

std::vector<int> ParallelLayout::consecutive_replica_ranks(int replica, int size, int pipeline_rank,
                                                           int tp_rank) const {
  std::vector<int> ranks;
  const int first = replica / size * size;
  for (int d = first; d < first + size; ++d) ranks.push_back(rank_of(d, pipeline_rank, tp_rank));
  return ranks;
}

std::vector<int> ParallelLayout::expert_parallel_ranks(int replica, int pipeline_rank,
                                                       int tp_rank) const {
  return consecutive_replica_ranks(replica, expert_parallel, pipeline_rank, tp_rank);
}

std::vector<int> ParallelLayout::context_parallel_ranks(int replica, int pipeline_rank,
                                                        int tp_rank) const {
  return consecutive_replica_ranks(replica, context_parallel, pipeline_rank, tp_rank);
}

std::vector<int> ParallelLayout::expert_data_parallel_ranks(int replica, int pipeline_rank,
                                                            int tp_rank) const {
  std::vector<int> ranks;
  for (int d = replica % expert_parallel; d < replicas; d += expert_parallel) {
    ranks.push_back(rank_of(d, pipeline_rank, tp_rank));
  }
  return ranks;
}

// ---- Distributed ------------------------------------------------------------------------------

Distributed::Distributed(const DistributedEnvironment& environment,
                         const DistributedOptions& options)
    : local_rank_(environment.local_rank) {
  const int tensor_parallel = options.tensor_parallel();
  PIPETRAIN_CHECK_INPUT(tensor_parallel >= 1, "tensor_parallel must be >= 1, got ",
                        tensor_parallel);
  const int pipeline_ranks = options.pipeline_ranks() > 0
                                 ? options.pipeline_ranks()
                                 : std::max(1, environment.world_size / tensor_parallel);
  layout_ = ParallelLayout::for_world(environment.world_size, pipeline_ranks, tensor_parallel);
  PIPETRAIN_CHECK_INPUT(
      options.expert_parallel() >= 1 && layout_.replicas % options.expert_parallel() == 0,
      "expert_parallel ", options.expert_parallel(), " must be 1 or more and divide the ",
      layout_.replicas, " data-parallel replicas");
  layout_.expert_parallel = options.expert_parallel();
  PIPETRAIN_CHECK_INPUT(
      options.context_parallel() >= 1 && layout_.replicas % options.context_parallel() == 0,
      "context_parallel ", options.context_parallel(), " must be 1 or more and divide the ",
      layout_.replicas, " replicas (data x context parallel)");
  PIPETRAIN_CHECK_INPUT(options.context_parallel() == 1 || options.expert_parallel() == 1,
                        "context_parallel ", options.context_parallel(), " with expert_parallel ",
                        options.expert_parallel(), ": not built yet; one of them must be 1");
  layout_.context_parallel = options.context_parallel();
  RendezvousOptions rendezvous;
  rendezvous.master_addr = environment.master_addr;
  rendezvous.master_port = environment.master_port;
  rendezvous.rank = environment.rank;
  rendezvous.world_size = environment.world_size;
  rendezvous.attempt = environment.restart_count;
  rendezvous.ranks_per_host = environment.local_world_size;
  // The inherited socket serves one store: the first world of the process takes it.
  static std::atomic<bool> socket_taken{false};
  if (environment.store_socket >= 0 && !socket_taken.exchange(true)) {
    rendezvous.listen_socket = environment.store_socket;
  }
  rendezvous.timeout = options.timeout();
  rendezvous.backend = options.backend() == "auto" ? comm_backend_for_device(options.device())
                                                   : parse_comm_backend(options.backend());
  if (options.device().is_cuda()) {
    rendezvous.cuda_device =
        options.device().has_index() ? options.device().index() : environment.local_rank;
  }
  world_ = C10dWorld::connect(rendezvous);
  // A group is made by its members only (C10dWorld::new_group), named uniquely in the world.
  const std::string tp_suffix = tensor_parallel > 1 ? "/" + std::to_string(tp_rank()) : "";
  if (layout_.replicas > 1) {
    data_parallel_ = world_->new_group("dp/" + std::to_string(pipeline_rank()) + tp_suffix,
                                       layout_.data_parallel_ranks(pipeline_rank(), tp_rank()));
  }
  if (tensor_parallel > 1) {
    tensor_parallel_ =
        world_->new_group("tp/" + std::to_string(replica()) + "/" + std::to_string(pipeline_rank()),
                          layout_.tensor_parallel_ranks(replica(), pipeline_rank()));
  }
  if (layout_.expert_parallel > 1) {
    const int e = layout_.expert_parallel;
    const std::string where = std::to_string(pipeline_rank()) + tp_suffix;
    expert_parallel_ =
        world_->new_group("ep/" + where + "/" + std::to_string(replica() / e),
                          layout_.expert_parallel_ranks(replica(), pipeline_rank(), tp_rank()));
    if (options.expert_parallel_second_lane()) {
      expert_parallel_second_ =
          world_->new_group("ep-lane1/" + where + "/" + std::to_string(replica() / e),
                            layout_.expert_parallel_ranks(replica(), pipeline_rank(), tp_rank()));
    }
    if (layout_.replicas > e) {
      expert_data_parallel_ = world_->new_group(
          "edp/" + where + "/" + std::to_string(replica() % e),
          layout_.expert_data_parallel_ranks(replica(), pipeline_rank(), tp_rank()));
    }
  }
  context_parallel_.ulysses = options.context_parallel_ulysses();
  context_parallel_.overlap = options.context_parallel_overlap();
  if (layout_.context_parallel > 1) {
    const int c = layout_.context_parallel;
    context_parallel_.group = world_->new_group(
        "cp/" + std::to_string(pipeline_rank()) + tp_suffix + "/" + std::to_string(replica() / c),
        layout_.context_parallel_ranks(replica(), pipeline_rank(), tp_rank()));
  }
}

Distributed::~Distributed() = default;

int Distributed::rank() const {
  return world_->rank();
}
int Distributed::world_size() const {
  return world_->world_size();
}

std::unique_ptr<C10dTransport> Distributed::make_transport(
    const std::vector<int>& stage_pipeline_rank, torch::Device device,
    std::chrono::milliseconds receive_timeout) {
  std::vector<int> stage_world_rank;
  for (std::size_t j = 0; j < stage_pipeline_rank.size(); ++j) {
    const int p = stage_pipeline_rank[j];
    PIPETRAIN_CHECK_INPUT(p >= 0 && p < layout_.pipeline_ranks, "stage ", j,
                          " is placed on pipeline rank ", p, " but the job has ",
                          layout_.pipeline_ranks,
                          " pipeline ranks: start one process per pipeline rank and replica");
    stage_world_rank.push_back(layout_.rank_of(replica(), p, tp_rank()));
  }
  C10dTransportOptions options;
  options.device = device;
  options.timeout = receive_timeout;
  return std::make_unique<C10dTransport>(world_, std::move(stage_world_rank), options);
}

namespace {

// Sums the gradients of `parameters` over `group`: one flat buffer per dtype, one after the
// other. Returns the largest one's bytes.
int64_t allreduce_flat(C10dGroup& group, const std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  int64_t largest = 0;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& p : parameters) by_dtype[p.scalar_type()].push_back(p);
  for (auto& [dtype, params] : by_dtype) {
    // Where the group sums: the CPU under Gloo, the parameters' GPU under NCCL.
    std::vector<torch::Tensor> flat{
        pack_gradients(params, group.collective_device(params.front().device()))};
    largest = std::max(largest, static_cast<int64_t>(flat[0].nbytes()));
    group.allreduce_sum(flat);
    unpack_gradients(params, flat[0]);
  }
  return largest;
}

}  // namespace

int64_t Distributed::allreduce_gradients(const std::vector<torch::Tensor>& parameters) {
  if (!data_parallel_ || parameters.empty()) return 0;
  return allreduce_flat(*data_parallel_, parameters);
}

void Distributed::allreduce_tensor_parallel_gradients(
    const std::vector<torch::Tensor>& parameters) {
  if (!tensor_parallel_ || parameters.empty()) return;
  allreduce_flat(*tensor_parallel_, parameters);
}

std::int64_t Distributed::allreduce_expert_gradients(const std::vector<torch::Tensor>& parameters) {
  if (!expert_data_parallel_ || parameters.empty()) return 0;
  return allreduce_flat(*expert_data_parallel_, parameters);
}

std::string Distributed::declare_tie(const std::string& name, std::vector<int> holders) {
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  PIPETRAIN_CHECK_INPUT(std::find(holders.begin(), holders.end(), pipeline_rank()) != holders.end(),
                        "rank ", rank(), " (pipeline rank ", pipeline_rank(), ") declares tie '",
                        name, "' but is not one of its holders");
  // The key names the holders too, so it is the same on every holder whatever pipes each built
  // before: the same name and holders (a second pipe over the same job) reuse the group; other
  // holders (a pipe that places its stages otherwise) get a group of their own.
  std::string key = name;
  for (int p : holders) key += "@" + std::to_string(p);
  if (ties_.count(key) != 0) return key;
  if (holders.size() == 1) {
    ties_[key] = nullptr;
    return key;
  }
  std::vector<int> ranks;
  for (int p : holders) ranks.push_back(layout_.rank_of(replica(), p, tp_rank()));
  ties_[key] = world_->new_group(
      "tie/" + key + "/" + std::to_string(replica()) +
          (layout_.tensor_parallel > 1 ? "/" + std::to_string(tp_rank()) : std::string()),
      ranks);
  return key;
}

void Distributed::allreduce_tie(const std::string& name,
                                const std::vector<torch::Tensor>& local_copies) {
  auto it = ties_.find(name);
  PIPETRAIN_CHECK_INPUT(it != ties_.end(), "tie '", name, "' was not declared on rank ", rank(),
                        ": call declare_tie first");
  PIPETRAIN_CHECK_INPUT(!local_copies.empty(), "rank ", rank(), " holds no copy of tie '", name,
                        "'");
  torch::NoGradGuard no_grad;
  for (const auto& copy : local_copies) {
    PIPETRAIN_CHECK_INPUT(copy.sizes() == local_copies[0].sizes(), "copies of tie '", name,
                          "' differ in shape: ", copy.sizes(), " vs ", local_copies[0].sizes());
  }
  // One copy here: summed in its own gradient, with no second tensor of its size (a tied
  // embedding's is hundreds of MB) where the collective runs on it. Adding +0 first makes its
  // zeros those of a sum started from zeros (-0 + 0 is +0): the same bits either way.
  const torch::Tensor& only = local_copies[0].grad();
  torch::Tensor sum;
  if (local_copies.size() == 1 && only.defined()) {
    sum = only;
    sum.add_(0.0);
  } else {
    sum = torch::zeros_like(local_copies[0]);
    for (const auto& copy : local_copies) {
      if (copy.grad().defined()) sum += copy.grad();
    }
  }
  if (it->second) {
    std::vector<torch::Tensor> buffer{
        sum.to(it->second->collective_device(sum.device())).contiguous()};
    it->second->allreduce_sum(buffer);
    sum = buffer[0].to(local_copies[0].device());
  }
  for (const auto& copy : local_copies) {
    auto& grad = const_cast<torch::Tensor&>(copy).mutable_grad();
    if (!grad.defined()) {
      grad = sum.clone();
    } else if (!grad.is_same(sum)) {
      grad.copy_(sum);
    }
  }
}

double Distributed::broadcast_loss(std::optional<double> replica_loss) {
  const double mine = tp_rank() == 0 ? replica_loss.value_or(0.0) : 0.0;
  std::vector<torch::Tensor> value{torch::tensor({mine}, torch::kDouble)};
  world_->world_group()->allreduce_sum(value);
  return value[0].item<double>();
}

std::map<std::string, torch::Tensor> Distributed::gather_named_parameters(
    const std::vector<std::pair<std::string, torch::Tensor>>& mine) {
  c10::Dict<std::string, torch::Tensor> dict;
  if (replica() == 0 && tp_rank() == 0) {
    for (const auto& [name, tensor] : mine) dict.insert(name, tensor.detach().to(torch::kCPU));
  }
  const std::vector<char> bytes = torch::pickle_save(dict);
  auto blobs = world_->world_group()->gather_bytes(bytes);
  std::map<std::string, torch::Tensor> merged;
  for (const auto& blob : blobs) {
    if (blob.empty()) continue;
    auto value = load_pickle(blob).toGenericDict();
    for (const auto& entry : value) {
      merged.emplace(entry.key().toStringRef(), entry.value().toTensor());
    }
  }
  return merged;
}

std::string Distributed::broadcast_text(const std::string& text, int root) {
  PIPETRAIN_CHECK_INPUT(root >= 0 && root < world_size(), "broadcast_text: root ", root,
                        " is not a rank of the world of ", world_size());
  // Two broadcasts: the length, then the bytes (the others cannot size their buffer before).
  std::vector<torch::Tensor> length{
      torch::tensor({static_cast<int64_t>(rank() == root ? text.size() : 0)}, torch::kLong)};
  world_->world_group()->broadcast(length, root);
  const int64_t n = length[0].item<int64_t>();
  if (n == 0) return {};
  std::vector<torch::Tensor> bytes{torch::empty({n}, torch::kUInt8)};
  if (rank() == root) std::memcpy(bytes[0].data_ptr(), text.data(), text.size());
  world_->world_group()->broadcast(bytes, root);
  return std::string(static_cast<const char*>(bytes[0].data_ptr()), static_cast<std::size_t>(n));
}

void Distributed::barrier() {
  world_->world_group()->barrier();
}
void Distributed::abort(const std::string& reason) {
  world_->abort(reason);
}
void Distributed::finalize() {
  world_->finalize();
}

// ---- run_distributed --------------------------------------------------------------------------

namespace {

[[noreturn]] void exit_now(int code) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace

int run_distributed(const DistributedOptions& options,
                    const std::function<void(Distributed&)>& body,
                    std::chrono::milliseconds abort_grace) {
  // Lines must reach a launcher's pipe before an _Exit.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::unique_ptr<Distributed> distributed;
  int rank = -1;
  // A bad environment is bad usage (2), and so is one the rendezvous finds out (a RANK started
  // twice, ranks disagreeing on WORLD_SIZE, a backend this build lacks: BadInput); a rendezvous
  // that fails otherwise (missing ranks after the timeout, a store out of reach) is a runtime
  // failure (1).
  try {
    const auto environment = DistributedEnvironment::from_environment();
    rank = environment.rank;
    distributed = std::make_unique<Distributed>(environment, options);
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": error: " << message_of(e) << std::endl;
    const auto* error = dynamic_cast<const Error*>(&e);
    return rank < 0 || (error && error->kind() == ErrorKind::BadInput) ? 2 : 1;
  }
  // An abort from elsewhere: the transports are woken by their own listeners; if the body is
  // stuck in a collective that cannot be woken, leave after the grace period.
  distributed->world()->add_abort_listener([rank, abort_grace](const std::string& reason) {
    std::thread([rank, abort_grace, reason] {
      std::this_thread::sleep_for(abort_grace);
      std::cerr << "rank " << rank << ": exiting: the job was aborted: " << reason << std::endl;
      exit_now(1);
    }).detach();
  });
  try {
    body(*distributed);
  } catch (const std::exception& e) {
    const std::string message = message_of(e);
    std::cerr << "rank " << rank << ": error: " << message << std::endl;
    distributed->abort(message);
    distributed->world()->linger_until_abort_seen(std::chrono::seconds(3));
    exit_now(1);
  }
  distributed->finalize();
  return 0;
}

}  // namespace pipetrain
