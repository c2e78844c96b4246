// Concept: a Hugging Face checkpoint of the Llama family (Llama, Mistral, Qwen2) loaded, trained
// in pipeline stages by the library's training loop and written back in Hugging Face's format
// (models/llama.h, train/token_batches.h, train/trainer.h, models/llama_export.h).
//
//   python save_hf_llama.py DIR      transformers' save_pretrained of a tiny Llama + DIR/tokens.bin
//   ./hf_llama DIR OUT               trains DIR in 2 stages, writes the result into OUT
//
// read_llama_config reads DIR/config.json; make_llama builds the model as a Sequential of
// embedding, decoder layers, norm and head, under Sequential names that map one to one onto
// Hugging Face's (hf_name_of); load_llama_weights fills it from DIR's safetensors. A Trainer runs
// 12 SGD steps of a Pipe (2 stages, 1F1B, 4 micro-batches) over windows of the token file
// (TokenBatches: input ids and the next ids), under the causal-LM loss; save_llama_hf writes OUT
// as transformers writes a model (config.json, model.safetensors), which
// LlamaForCausalLM.from_pretrained(OUT) loads.
//
// Check: the loss fell; the weights equal those of a sequential run of the same steps
// (same_weights.h); and OUT, loaded back, holds exactly the trained weights.
#include <cstdio>
#include <memory>
#include <string>

#include <pipetrain/io/safetensors.h>
#include <pipetrain/io/token_file.h>
#include <pipetrain/models/llama.h>
#include <pipetrain/models/llama_config.h>
#include <pipetrain/models/llama_export.h>
#include <pipetrain/train/step_runner.h>
#include <pipetrain/train/token_batches.h>
#include <pipetrain/train/trainer.h>
#include <torch/torch.h>

#include "same_weights.h"

namespace io = pipetrain::io;
namespace models = pipetrain::models;
namespace train = pipetrain::train;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR OUT_DIR (MODEL_DIR from save_hf_llama.py)\n",
                 argv[0]);
    return 2;
  }
  const std::string directory = argv[1], out = argv[2];
  const models::LlamaConfig config = models::read_llama_config(directory);
  auto load = [&] {
    models::LlamaModel llama = models::make_llama(config);
    models::load_llama_weights(llama, io::SafetensorsCheckpoint::open(directory));
    return llama;
  };
  // 8 windows of 16 ids a step; the Trainer draws batch k for step k.
  const auto tokens = std::make_shared<const io::TokenFile>(directory + "/tokens.bin");
  tokens->check_vocabulary(config.vocab_size);
  const train::TokenBatches batches(tokens, /*seq_len=*/16, /*batch_size=*/8);
  const auto options = train::TrainerOptions(12).optimizer("sgd").lr(0.05).momentum(0.9);

  models::LlamaModel llama = load();
  auto pipe =
      train::make_pipe_runner(llama.sequential, models::causal_lm_loss,
                              pipetrain::PipeOptions().stages(2).chunks(4).schedule("1f1b"));
  train::Trainer trainer(llama.sequential, *pipe, batches, options);
  trainer.on_step = [](const train::StepReport& r) {
    if (r.step % 4 == 0) std::printf("step %lld loss %.4f\n", (long long)r.step, r.loss);
  };
  const train::TrainSummary done = trainer.fit();
  std::printf("%s: loss %.4f -> %.4f\n", pipe->description().c_str(), done.first_loss,
              done.last_loss);
  const std::vector<std::string> written = models::save_llama_hf(trainer, out, config);
  std::printf("wrote %zu files into %s\n", written.size(), out.c_str());

  models::LlamaModel reference = load();
  auto sequential = train::make_sequential_runner(reference.sequential, models::causal_lm_loss);
  train::Trainer(reference.sequential, *sequential, batches, options).fit();

  models::LlamaModel saved = models::make_llama(models::read_llama_config(out));
  models::load_llama_weights(saved, io::SafetensorsCheckpoint::open(out));

  const bool learned = done.last_loss < done.first_loss;
  if (!learned) std::printf("the loss did not fall\n");
  const auto trained = consumer::to_map(llama.sequential->named_parameters());
  const bool same =
      consumer::same_weights(trained, consumer::to_map(reference.sequential->named_parameters()));
  const bool kept = consumer::same_weights(consumer::to_map(saved.sequential->named_parameters()),
                                           trained, /*rtol=*/0, "the trained weights, of OUT");
  return learned && same && kept ? 0 : 1;
}
