// Which device each pipeline rank of one process runs on (stage/device.h, rank_devices): the
// same in CUDA and CPU-only builds, over cuda_device_count() of the seam.
#include <torch/types.h>

#include "pipetrain/base/error.h"
#include "pipetrain/stage/device.h"

namespace pipetrain {

std::vector<torch::Device> rank_devices(const std::string& kind,
                                        const std::vector<std::string>& devices, int ranks) {
  std::vector<torch::Device> result;
  if (!devices.empty()) {
    if (static_cast<int>(devices.size()) != ranks) {
      throw BadInput("devices lists " + std::to_string(devices.size()) + " devices but the run has " +
                     std::to_string(ranks) + " pipeline ranks; give one device per rank");
    }
    for (const std::string& name : devices) {
      try {
        result.emplace_back(name);
      } catch (const std::exception&) {
        throw BadInput("device '" + name + "' is not a device name (cpu, cuda:0, cuda:1, ...)");
      }
      check_device_usable(result.back());
    }
    return result;
  }
  if (kind == "cpu") return std::vector<torch::Device>(static_cast<size_t>(ranks), torch::kCPU);
  if (kind != "cuda") {
    throw BadInput("unknown device '" + kind + "'; valid: cpu, cuda");
  }
  const int count = cuda_device_count();
  if (count < 1) {
    throw BadInput("device cuda: no CUDA device is visible to this process (a CPU-only LibTorch, no "
                   "GPU, or CUDA_VISIBLE_DEVICES empty); use cpu");
  }
  for (int r = 0; r < ranks; ++r) {
    result.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(r % count));
  }
  return result;
}

}  // namespace pipetrain
