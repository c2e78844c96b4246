// Concept: Pipe, in-process pipeline parallelism (runtime/pipe.h). A torch::nn::Sequential is cut
// into 2 stages, each run by its own worker thread; every mini-batch is cut into 4 micro-batches
// and the 1F1B schedule orders their forwards and backwards. The README shows this program.
//
// Check: the weights after 5 steps equal plain sequential training of a copy (same_weights.h).
// Exit 0 when they do, 1 when not.
#include <cstdio>

#include <pipetrain/runtime/pipe.h>
#include <torch/torch.h>

#include "same_weights.h"

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  auto reference = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());

  // 2 stages (one worker thread each), 4 micro-batches per mini-batch, 1F1B.
  pipetrain::Pipe pipe(model, pipetrain::PipeOptions().stages(2).chunks(4).schedule("1f1b"));
  torch::optim::SGD sgd(pipe->parameters(), torch::optim::SGDOptions(0.05));
  torch::optim::SGD reference_sgd(reference->parameters(), torch::optim::SGDOptions(0.05));
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };

  for (int step = 0; step < 5; ++step) {
    const torch::Tensor x = torch::randn({32, 16});
    const torch::Tensor y = torch::randn({32, 4});
    sgd.zero_grad();
    const torch::Tensor loss = pipe->train_step(x, y, mse);  // forward + backward, all stages
    sgd.step();
    reference_sgd.zero_grad();
    mse(reference->forward(x), y).backward();
    reference_sgd.step();
    std::printf("step %d loss %.6f\n", step, loss.item<double>());
  }
  const bool same = consumer::same_weights(consumer::to_map(pipe->named_parameters()),
                                           consumer::to_map(reference->named_parameters()));
  return same ? 0 : 1;
}
