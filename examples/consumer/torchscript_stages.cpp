// Concept: a model written in Python, trained in C++ pipeline stages (stage/torchscript.h), by the
// library's training loop (train/trainer.h over train/step_runner.h).
//
//   python save_scripted_model.py model.pt     torch.jit.save(torch.jit.script(nn.Sequential(..)))
//   ./torchscript_stages model.pt              its children become the layers of 2 stages
//
// load_torchscript_sequential turns the scripted nn.Sequential into a torch::nn::Sequential of
// ScriptLayers that share the jit module's tensors, so the trained weights load back in Python by
// name ("0.weight", ...). A Trainer runs 30 SGD steps on a Pipe (2 stages, 1F1B, 4 micro-batches)
// over a TensorBatches of fixed rows; a second Trainer runs the same steps sequentially on a
// second copy loaded from the same file.
//
// Check: the loss decreased, and the weights equal the sequential run's (same_weights.h).
#include <cstdio>

#include <pipetrain/stage/torchscript.h>
#include <pipetrain/train/step_runner.h>
#include <pipetrain/train/trainer.h>
#include <torch/torch.h>

#include "same_weights.h"

namespace train = pipetrain::train;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.pt (written by save_scripted_model.py)\n", argv[0]);
    return 2;
  }
  torch::manual_seed(0);
  // 4 batches of 32 rows, read in order (train::TensorBatches). 8 inputs and 4 targets per row,
  // as the Python model expects; the targets are a function of the inputs, so there is something
  // to learn.
  const torch::Tensor x = torch::randn({128, 8});
  const train::TensorBatches batches(x, torch::tanh(x.narrow(1, 0, 4)), 32);
  const auto options = train::TrainerOptions(30).optimizer("sgd").lr(0.05).momentum(0.9);
  auto mse = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::mse_loss(out, target);
  };

  torch::nn::Sequential model = pipetrain::load_torchscript_sequential(argv[1]);
  auto pipe = train::make_pipe_runner(
      model, mse, pipetrain::PipeOptions().stages(2).chunks(4).schedule("1f1b"));
  train::Trainer trainer(model, *pipe, batches, options);
  trainer.on_step = [](const train::StepReport& r) {
    if (r.step % 10 == 0) std::printf("step %lld loss %.6f\n", (long long)r.step, r.loss);
  };
  const train::TrainSummary done = trainer.fit();
  std::printf("%s: loss %.6f -> %.6f\n", pipe->description().c_str(), done.first_loss,
              done.last_loss);

  torch::nn::Sequential reference = pipetrain::load_torchscript_sequential(argv[1]);
  auto sequential = train::make_sequential_runner(reference, mse);
  train::Trainer(reference, *sequential, batches, options).fit();

  const bool learned = done.last_loss < done.first_loss;
  if (!learned) std::printf("the loss did not decrease\n");
  const bool same = consumer::same_weights(consumer::to_map(model->named_parameters()),
                                           consumer::to_map(reference->named_parameters()));
  return learned && same ? 0 : 1;
}
