// Per-stage random number streams, so random layers (dropout) draw the same numbers whatever the
// thread timing, and a checkpointed forward can be replayed exactly.
//
// LibTorch layers draw from the process-wide default CPU generator. Stages run on different
// threads, so draws would interleave by timing. Each stage therefore owns its own CPU generator
// state; a training forward (or a recompute) installs it as the default generator for its
// duration under one process-wide lock, then takes it back:
//
//   [1] lock the RNG lock           [2] default <- stage state (recompute: <- snapshot)
//   [3] run the layers               [4] stage state <- default (recompute: not kept)
//   [5] default <- what it was      [6] unlock
//
// So training forwards of different stages take turns (their backward passes still overlap).
// The device generator (CUDA) is per device; its state is only snapshotted and replayed.
//
// Thread-safety: a StageRng is used by the one worker thread of its stage; the static lock
// serialises stages against each other.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/types.h>

namespace pipetrain {

// The seed of stage j's stream in a run seeded with `seed`: the same in Pipe and DistributedPipe,
// so a stage draws the same random numbers in both runtimes.
inline uint64_t stage_seed(uint64_t seed, int j) {
  return seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(j + 1);
}

class StageRng {
 public:
  // What a recompute needs to draw the same numbers as the forward it replays.
  struct Snapshot {
    torch::Tensor cpu;     // CPU generator state before the forward
    torch::Tensor device;  // device generator state before the forward (undefined on CPU)
  };

  StageRng(uint64_t seed, torch::Device device);

  // Restarts the stage's CPU stream from `seed`.
  void seed(uint64_t seed);
  // The CPU stream's state (a uint8 tensor, as at::Generator::get_state returns), and putting one
  // back: a checkpoint keeps it so that a resumed run draws the dropout masks an uninterrupted
  // run would have drawn.
  torch::Tensor state() const { return state_.clone(); }
  void set_state(const torch::Tensor& state) { state_ = state.clone(); }

  // Runs `layers` with the stage's stream installed ([1]-[6] above); returns the state it
  // started from.
  Snapshot run_forward(const std::function<void()>& layers);

  // Runs `layers` with the generators set to `snapshot`; the stage's stream and the process
  // default are left as they were.
  void run_replay(const Snapshot& snapshot, const std::function<void()>& layers);

 private:
  torch::Tensor state_;  // CPU generator state (a uint8 tensor as Generator::get_state returns)
  torch::Device device_;
};

}  // namespace pipetrain
