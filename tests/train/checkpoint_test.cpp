#include "pipetrain/train/checkpoint.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "pipetrain/base/atomic_file.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/train/optimizer.h"

namespace pipetrain::train {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "pipetrain-ckpt-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  size_t entries() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(path_), fs::directory_iterator()));
  }

 private:
  std::string path_;
};

// Linear, BatchNorm (buffers), ReLU, Linear: names "0.weight", "1.running_mean", "3.bias", ...
torch::nn::Sequential small_model() {
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                               torch::nn::ReLU(), torch::nn::Linear(8, 2));
}

void train_steps(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int steps,
                 uint64_t seed) {
  torch::manual_seed(seed);
  for (int k = 0; k < steps; ++k) {
    torch::Tensor x = torch::randn({16, 4});
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  }
}

void expect_same_tensors(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) {
    ASSERT_TRUE(b.contains(item.key())) << item.key();
    EXPECT_TRUE(item.value().equal(b[item.key()])) << item.key();
  }
}

// Trains 3 steps, checkpoints, trains 2 more; a fresh model restored from the checkpoint and
// trained the same 2 steps must end bit-identical: parameters, buffers and optimizer state all
// came back.
void expect_resume_is_exact(const std::string& optimizer_kind) {
  TempDir dir;
  torch::manual_seed(0);
  torch::nn::Sequential model = small_model();
  auto optimizer = make_optimizer(optimizer_kind, model->parameters(), OptimizerOptions().lr(0.05));
  train_steps(model, *optimizer, 3, 1);
  Checkpoint saved;
  capture_model(saved, *model);
  capture_optimizer(saved, *optimizer, model->named_parameters());
  saved.step = 3;
  save_checkpoint(dir.file("run.ckpt"), saved);
  train_steps(model, *optimizer, 2, 2);

  torch::manual_seed(99);  // different initial weights
  torch::nn::Sequential resumed = small_model();
  auto resumed_optimizer =
      make_optimizer(optimizer_kind, resumed->parameters(), OptimizerOptions().lr(0.05));
  Checkpoint loaded = load_checkpoint(dir.file("run.ckpt"));
  EXPECT_EQ(loaded.optimizer, optimizer_kind);
  restore_model(loaded, *resumed);
  restore_optimizer(loaded, *resumed_optimizer, resumed->named_parameters());
  train_steps(resumed, *resumed_optimizer, 2, 2);
  expect_same_tensors(model->named_parameters(), resumed->named_parameters());
  expect_same_tensors(model->named_buffers(), resumed->named_buffers());
}

TEST(Checkpoint, AdamResumeContinuesExactlyAsAnUninterruptedRun) {
  expect_resume_is_exact("adam");
}
TEST(Checkpoint, AdamWResumeContinuesExactly) {
  expect_resume_is_exact("adamw");
}
TEST(Checkpoint, SgdMomentumResumeContinuesExactly) {
  expect_resume_is_exact("sgd");
}

TEST(Checkpoint, OptimizerStateIsStoredByParameterName) {
  torch::manual_seed(0);
  torch::nn::Sequential model = small_model();
  auto optimizer = make_optimizer("adam", model->parameters());
  train_steps(model, *optimizer, 2, 1);
  Checkpoint c;
  capture_optimizer(c, *optimizer, model->named_parameters());
  ASSERT_TRUE(c.optimizer_state.count("3.weight"));
  const auto& fields = c.optimizer_state.at("3.weight");
  EXPECT_EQ(fields.at("step").item<int64_t>(), 2);
  EXPECT_EQ(fields.at("exp_avg").sizes(), torch::IntArrayRef({2, 8}));
  EXPECT_TRUE(fields.count("exp_avg_sq"));
}

TEST(Checkpoint, PositionLoaderStateAndMetadataRoundTrip) {
  TempDir dir;
  Checkpoint c;
  c.step = 1234;
  c.epoch = 3;
  c.batch = 17;
  c.loader_state = "seed=7";
  c.metadata = {{"model", "cnn"}, {"options", {{"width", 32}}}};
  save_checkpoint(dir.file("meta.ckpt"), c);
  Checkpoint r = load_checkpoint(dir.file("meta.ckpt"));
  EXPECT_EQ(r.step, 1234);
  EXPECT_EQ(r.epoch, 3);
  EXPECT_EQ(r.batch, 17);
  EXPECT_EQ(r.loader_state, "seed=7");
  EXPECT_EQ(r.metadata["options"]["width"], 32);
  EXPECT_FALSE(r.torch_rng_state.defined());
}

TEST(Checkpoint, RestoredGeneratorDrawsTheSameNextNumbers) {
  TempDir dir;
  torch::manual_seed(5);
  torch::randn({7});
  Checkpoint c;
  capture_torch_rng(c);
  save_checkpoint(dir.file("rng.ckpt"), c);
  torch::Tensor expected = torch::randn({10});
  torch::randn({1000});  // move on
  restore_torch_rng(load_checkpoint(dir.file("rng.ckpt")));
  EXPECT_TRUE(torch::randn({10}).equal(expected));
}

TEST(Checkpoint, StageRandomStreamsRoundTripAndMergeFromTwoParts) {
  TempDir dir;
  auto state_of = [](uint64_t seed) {
    return at::make_generator<at::CPUGeneratorImpl>(seed).get_state();
  };
  Checkpoint rank0, rank1;
  rank0.stage_rng_states[0] = state_of(1);
  rank1.stage_rng_states[1] = state_of(2);
  merge_checkpoint(rank0, rank1);
  save_checkpoint(dir.file("streams.ckpt"), rank0);
  Checkpoint r = load_checkpoint(dir.file("streams.ckpt"));
  ASSERT_EQ(r.stage_rng_states.size(), 2u);
  EXPECT_TRUE(r.stage_rng_states[0].equal(state_of(1)));
  EXPECT_TRUE(r.stage_rng_states[1].equal(state_of(2)));
  EXPECT_FALSE(r.stage_rng_states[0].equal(r.stage_rng_states[1]));
}

TEST(Checkpoint, MissingNameIsAnErrorThatNamesIt) {
  torch::nn::Sequential model = small_model();
  Checkpoint c;
  capture_model(c, *model);
  c.parameters.erase("3.bias");
  try {
    restore_model(c, *model);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("missing from the checkpoint: 3.bias"), std::string::npos) << message;
  }
}

TEST(Checkpoint, SaveParametersWritesThemInTheModelsOrderAndNamesAMissingOne) {
  torch::nn::Sequential model = small_model();
  Checkpoint c;
  capture_model(c, *model);  // a std::map: sorted by name, not in the model's order
  const std::string path = ::testing::TempDir() + "/save_parameters.pt";
  ASSERT_EQ(save_parameters(path, c, *model), model->named_parameters().size());
  const std::string bytes = read_file(path);
  const c10::Dict<torch::IValue, torch::IValue> saved =
      load_pickle(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
  ASSERT_EQ(saved.size(), model->named_parameters().size());
  auto it = saved.begin();
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(it->key().toStringRef(), item.key());
    EXPECT_TRUE(it->value().toTensor().equal(item.value()));
    ++it;
  }
  c.parameters.erase("3.bias");
  try {
    save_parameters(path + ".missing", c, *model);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("'3.bias'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".missing"));
}

TEST(Checkpoint, UnexpectedNameAndShapeMismatchAreErrors) {
  torch::nn::Sequential model = small_model();
  Checkpoint c;
  capture_model(c, *model);
  c.parameters["9.weight"] = torch::zeros({1});
  c.parameters["0.weight"] = torch::zeros({8, 5});
  try {
    restore_model(c, *model);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("not in the model: 9.weight"), std::string::npos) << message;
    EXPECT_NE(message.find("0.weight (checkpoint [8, 5], model [8, 4])"), std::string::npos)
        << message;
  }
}

// A checkpoint converts into a model of another dtype when no value rounds (float32 into
// float64), and names every tensor that would round otherwise (float64 into float32).
TEST(Checkpoint, AWiderDtypeConvertsAndANarrowerOneIsAnErrorNamingTheTensor) {
  torch::nn::Sequential model = small_model();
  Checkpoint c;
  capture_model(c, *model);
  torch::nn::Sequential wide = small_model();
  wide->to(torch::kFloat64);
  restore_model(c, *wide);
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(wide->named_parameters()[item.key()].equal(item.value().to(torch::kFloat64)))
        << item.key();
  }
  Checkpoint from_wide;
  capture_model(from_wide, *wide);
  try {
    restore_model(from_wide, *model);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("lose precision"), std::string::npos) << message;
    EXPECT_NE(message.find("0.weight (checkpoint Double, model Float)"), std::string::npos)
        << message;
  }
}

TEST(Checkpoint, PartsSavedByTwoStagesLoadIntoOneModelAndBackIntoThree) {
  torch::manual_seed(0);
  torch::nn::Sequential model = small_model();
  auto all = model->named_parameters();
  auto buffers = model->named_buffers();
  // Two stages: layers 0-1 and layers 2-3, each capturing its global names.
  NamedTensors stage0, stage1, buffers0, buffers1;
  for (const auto& item : all)
    (item.key()[0] < '2' ? stage0 : stage1).insert(item.key(), item.value());
  for (const auto& item : buffers)
    (item.key()[0] < '2' ? buffers0 : buffers1).insert(item.key(), item.value());
  Checkpoint part0, part1;
  capture_model(part0, stage0, buffers0);
  capture_model(part1, stage1, buffers1);
  merge_checkpoint(part0, part1);

  torch::manual_seed(1);
  torch::nn::Sequential whole = small_model();
  restore_model(part0, *whole);
  expect_same_tensors(model->named_parameters(), whole->named_parameters());

  // A three-stage run: stage 2 holds layer 3 only and restores its subset.
  torch::manual_seed(2);
  torch::nn::Sequential other = small_model();
  NamedTensors last_stage;
  last_stage.insert("3.weight", other->named_parameters()["3.weight"]);
  last_stage.insert("3.bias", other->named_parameters()["3.bias"]);
  restore_model(part0, last_stage, NamedTensors(), NameMatch::kSubset);
  EXPECT_TRUE(other->named_parameters()["3.weight"].equal(all["3.weight"]));
  EXPECT_FALSE(other->named_parameters()["0.weight"].equal(all["0.weight"]));
}

TEST(Checkpoint, OptimizerOfAnotherKindIsAnError) {
  torch::nn::Sequential model = small_model();
  auto adam = make_optimizer("adam", model->parameters());
  train_steps(model, *adam, 1, 1);
  Checkpoint c;
  capture_optimizer(c, *adam, model->named_parameters());
  auto sgd = make_optimizer("sgd", model->parameters());
  EXPECT_THROW(restore_optimizer(c, *sgd, model->named_parameters()), CheckpointError);
}

TEST(Checkpoint, AFileThatIsNotACheckpointIsAnError) {
  TempDir dir;
  write_file_atomically(dir.file("junk"), "definitely not a zip");
  EXPECT_THROW(load_checkpoint(dir.file("junk")), CheckpointError);
  EXPECT_THROW(load_checkpoint(dir.file("absent")), FileError);
}

// A full disk in miniature: RLIMIT_FSIZE makes write() fail with EFBIG part-way through.
// Found by fuzz_checkpoint: a zip directory pointing past the end of the file made LibTorch's
// torch::pickle_load copy bytes from beyond its buffer (AddressSanitizer: heap-buffer-overflow in
// VectorReader::read). The loader reads through a reader of its own now (load_pickle), and the
// file is a CheckpointError. `make sanitize` runs this under AddressSanitizer.
TEST(Checkpoint, AZipDirectoryPastTheEndIsACheckpointErrorNotAReadPastTheBuffer) {
  const std::string path =
      std::string(PIPETRAIN_SOURCE_DIR) + "/fuzz/corpus/checkpoint/zip_directory_past_the_end.pt";
  try {
    (void)load_checkpoint(path);
    FAIL() << "expected a CheckpointError for " << path;
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a pipetrain checkpoint"), std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, FailedWriteLeavesThePreviousCheckpointIntactAndNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  Checkpoint old_checkpoint;
  old_checkpoint.step = 1;
  old_checkpoint.parameters["w"] = torch::ones({4});
  save_checkpoint(path, old_checkpoint);
  const auto old_size = fs::file_size(path);

  Checkpoint big;
  big.step = 2;
  big.parameters["w"] = torch::zeros({1 << 20});  // 4 MiB, over the limit below
  struct rlimit saved_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  auto saved_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved_limit;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    save_checkpoint(path, big);
  } catch (const FileError& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved_limit);
  signal(SIGXFSZ, saved_handler);

  EXPECT_NE(message.find(path), std::string::npos) << "no FileError naming the path: " << message;
  EXPECT_EQ(fs::file_size(path), old_size);
  Checkpoint survivor = load_checkpoint(path);
  EXPECT_EQ(survivor.step, 1);
  EXPECT_TRUE(survivor.parameters.at("w").equal(torch::ones({4})));
  EXPECT_EQ(dir.entries(), 1u) << "the temporary file was left behind";
}

TEST(AtomicFile, WriteIntoAMissingDirectoryNamesThePath) {
  try {
    write_file_atomically("/nonexistent-dir/x.ckpt", "data");
    FAIL() << "no error";
  } catch (const FileError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.ckpt"), std::string::npos);
  }
}

TEST(AtomicFile, ReplacesTheContentWhole) {
  TempDir dir;
  write_file_atomically(dir.file("f"), "first version, longer");
  write_file_atomically(dir.file("f"), "second");
  EXPECT_EQ(read_file(dir.file("f")), "second");
  EXPECT_EQ(dir.entries(), 1u);
}

}  // namespace
}  // namespace pipetrain::train
