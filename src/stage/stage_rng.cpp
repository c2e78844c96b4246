// Per-stage RNG streams swapped into the default CPU generator
// (include/pipetrain/stage/stage_rng.h).
#include "pipetrain/stage/stage_rng.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "pipetrain/stage/device.h"

namespace pipetrain {
namespace {

std::mutex& rng_lock() {
  static std::mutex lock;
  return lock;
}

torch::Tensor get_cpu_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_cpu_state(const torch::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

// Restores the default CPU (and device) generator on scope exit, also when a layer throws.
class RestoreDefault {
 public:
  RestoreDefault(const torch::Device& device, bool restore_device)
      : device_(device),
        cpu_(get_cpu_state()),
        device_state_(restore_device ? device_rng_state(device) : torch::Tensor()) {}
  ~RestoreDefault() {
    set_cpu_state(cpu_);
    if (device_state_.defined()) set_device_rng_state(device_, device_state_);
  }
  RestoreDefault(const RestoreDefault&) = delete;
  RestoreDefault& operator=(const RestoreDefault&) = delete;

 private:
  torch::Device device_;
  torch::Tensor cpu_;
  torch::Tensor device_state_;
};

}  // namespace

StageRng::StageRng(uint64_t seed_value, torch::Device device) : device_(device) {
  seed(seed_value);
}

void StageRng::seed(uint64_t seed_value) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed_value);
  state_ = generator.get_state();
}

StageRng::Snapshot StageRng::run_forward(const std::function<void()>& layers) {
  std::lock_guard<std::mutex> lock(rng_lock());  // [1]
  Snapshot snapshot{state_, device_rng_state(device_)};
  RestoreDefault restore(device_, /*restore_device=*/false);
  set_cpu_state(state_);     // [2]
  layers();                  // [3]
  state_ = get_cpu_state();  // [4]
  return snapshot;           // [5] [6] by destructors
}

void StageRng::run_replay(const Snapshot& snapshot, const std::function<void()>& layers) {
  std::lock_guard<std::mutex> lock(rng_lock());
  RestoreDefault restore(device_, /*restore_device=*/true);
  set_cpu_state(snapshot.cpu);
  if (snapshot.device.defined()) set_device_rng_state(device_, snapshot.device);
  layers();
}

}  // namespace pipetrain
