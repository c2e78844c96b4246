// Concept: multi-process pipeline parallelism (runtime/launcher.h, runtime/distributed.h,
// runtime/distributed_pipe.h). The model of two_stage_1f1b is trained by 2 processes, one stage
// each, talking over c10d (Gloo on CPU):
//
//   ./two_processes               no torchrun environment: launch_self starts this program twice,
//     |                           as rank 0 and rank 1 (MASTER_ADDR, MASTER_PORT, RANK, ... set)
//     +-- rank 0: stage 0  --activations-->  rank 1: stage 1      run_distributed: rendezvous,
//                          <--gradients----                       then main_of_rank on each
//
// Under torchrun (or Slurm, mpirun) the environment is already there and the program runs as one
// rank directly. Every rank builds the same model from the same seed and draws the same batches.
//
// Check: rank 0 gathers every stage's weights and compares them with plain sequential training of
// a copy (same_weights.h). The launcher's exit code is the first failing rank's: 0 when it held.
#include <cstdio>

#include <pipetrain/runtime/distributed.h>
#include <pipetrain/runtime/distributed_pipe.h>
#include <pipetrain/runtime/launcher.h>
#include <torch/torch.h>

#include "same_weights.h"

// One rank's work. Returns false on rank 0 when the weights differ from sequential training.
bool main_of_rank(pipetrain::Distributed& distributed) {
  torch::manual_seed(0);  // the same model and batches on every rank
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());

  // This rank keeps and runs only its own stage (stages = the job's 2 processes).
  pipetrain::DistributedPipe pipe(distributed, model,
                                  pipetrain::PipeOptions().stages(2).chunks(4).schedule("1f1b"));
  torch::optim::SGD sgd(pipe.parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.05));
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };
  for (int step = 0; step < 5; ++step) {
    const torch::Tensor x = torch::randn({32, 16}), y = torch::randn({32, 4});
    sgd.zero_grad();
    // The mini-batch loss, on every rank (a 0-dim tensor, as Pipe's train_step returns).
    const double loss = pipe.train_step(x, y, mse).item<double>();
    sgd.step();
    if (distributed.rank() != 0) continue;
    reference_sgd.zero_grad();
    mse(reference->forward(x), y).backward();
    reference_sgd.step();
    std::printf("step %d loss %.6f\n", step, loss);
  }
  // Collective: every rank sends its stage's parameters; rank 0 receives them all.
  const consumer::NamedTensors gathered = pipe.gather_parameters();
  if (distributed.rank() != 0) return true;
  return consumer::same_weights(gathered, consumer::to_map(reference->named_parameters()));
}

int main(int argc, char** argv) {
  if (!pipetrain::DistributedEnvironment::present()) {
    // The parent: run this program as 2 ranks and return the first failure's exit code.
    return pipetrain::launch_self(2, pipetrain::strip_launcher_flags(argc, argv));
  }
  torch::set_num_threads(1);  // two processes share this machine's cores
  bool held = true;
  const int code = pipetrain::run_distributed(
      pipetrain::DistributedOptions().timeout(std::chrono::seconds(60)),
      [&](pipetrain::Distributed& distributed) { held = main_of_rank(distributed); });
  return code != 0 ? code : (held ? 0 : 1);
}
