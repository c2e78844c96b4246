// The model and data flags of `pipetrain train` and `pipetrain eval` (train_setup.h).
#include "train_setup.h"

#include "fashion_mnist.h"
#include "model_registry.h"

namespace pipetrain::cli {

void add_model_data_flags(CLI::App& command, ModelDataArgs& args) {
  command
      .add_option("--model", args.model,
                  "model: " + join_names(examples::model_names()) +
                      ", a TorchScript file (torch.jit.save; its children are the layers), or a "
                      "Hugging Face Llama/Mistral/Qwen2 directory (config.json, safetensors)")
      ->capture_default_str();
  command
      .add_option("--model-options", args.model_options,
                  "JSON object of the example model's options, e.g. '{\"width\": 16}' "
                  "(docs/MODELS.md lists them)")
      ->capture_default_str();
  command
      .add_option("--data", args.data,
                  "data: " + join_names(data_names()) +
                      " (tensors: --inputs/--targets; the default with a TorchScript --model)")
      ->capture_default_str();
  command.add_option("--data-dir", args.data_dir,
                     std::string("Fashion-MNIST directory of the gzipped IDX files. Default ") +
                         examples::kFashionMnistDirectory);
  command.add_option(
      "--text-file", args.text_file,
      std::string("corpus for --data text. Default ") + examples::kDefaultCorpusPath);
  command.add_option("--inputs", args.inputs_path, "input tensor X (torch.save), rows on dim 0");
  command.add_option("--targets", args.targets_path, "target tensor Y (torch.save), rows on dim 0");
  command.add_option("--loss", args.loss,
                     "loss: mse, cross-entropy. Default: the example model's (cross-entropy); "
                     "required with a TorchScript --model");
  command
      .add_option("--synthetic-samples", args.synthetic_samples,
                  "rows of --data synthetic (random 28x28 images, 10 classes)")
      ->capture_default_str();
  command
      .add_option("--init", args.init,
                  "a Hugging Face --model's weights: checkpoint (DIR's safetensors) or random "
                  "(only config.json is read; seeded by --seed)")
      ->capture_default_str();
  command.add_option("--token-file", args.token_file,
                     "--data tokens: a flat file of little-endian token ids (docs/MODELS.md)");
  command.add_option("--data-path", args.data_path,
                     "--data indexed: PREFIX of a Megatron indexed dataset (PREFIX.idx and "
                     "PREFIX.bin, as Megatron-LM's preprocessing and scripts/prepare-data write "
                     "them); or a blend W1 PREFIX1 W2 PREFIX2 ..., rows drawn by weight as "
                     "Megatron's blend draws them (docs/DATA.md)");
  command
      .add_option("--pack", args.packing,
                  "--data indexed: how documents fill rows of --seq-len: split (laid end to end, "
                  "cut every T ids), whole (each whole into one row, best fit), none (one per "
                  "row, each micro-batch padded to its own longest)")
      ->capture_default_str();
  command.add_option("--loss-mask-path", args.loss_mask_path,
                     "--data indexed: the loss mask of each --data-path dataset (PREFIX_loss_mask "
                     "from scripts/prepare-data): only tokens marked 1 are learned");
  command.add_flag("--cross-document-attention", args.cross_document_attention,
                   "--data indexed: tokens attend to every earlier token of their row, and RoPE "
                   "counts along the row (default: only within their own document, positions "
                   "restarting at each)");
  command
      .add_option("--pad-multiple", args.pad_multiple,
                  "--data indexed: row widths rounded up to a multiple of this (0: the --tp size "
                  "with --sequence-parallel, else 1)")
      ->capture_default_str();
  command.add_flag("--group-by-length", args.group_by_length,
                   "--pack none: rows ordered longest first within windows of 50 mini-batches, "
                   "so a micro-batch pads little");
  command.add_option("--seq-len", args.seq_len, "--data tokens or indexed: ids per sample T");
  command.add_option("--token-bytes", args.token_bytes, "bytes per id: 2 (uint16) or 4 (uint32)")
      ->capture_default_str();
  command.add_flag("--shuffle", args.shuffle,
                   "--data tokens: samples in a seeded order per epoch; indexed: documents "
                   "(--pack split) or rows (whole, none)");
}

}  // namespace pipetrain::cli
