// Trains a torch::nn::Sequential in 2 pipeline stages with the 1F1B schedule in one process, and
// checks the pipeline's result against plain sequential training of a copy: the weights must be
// equal (pipetrain's transparency). Exit 0 when they are, 1 when not.
#include <cstdio>

#include <pipetrain/runtime/pipe.h>
#include <torch/torch.h>

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

  double worst = 0;
  const auto expected = reference->named_parameters();
  for (const auto& p : pipe->named_parameters()) {
    const torch::Tensor* want = expected.find(p.key());
    if (want == nullptr) continue;
    worst = std::max(worst, (p.value() - *want).abs().max().item<double>());
  }
  std::printf("largest difference from sequential training: %.3g\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
