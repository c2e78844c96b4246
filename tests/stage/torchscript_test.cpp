// Tests for TorchScript modules as layers (include/pipetrain/stage/torchscript.h).
//
// Two sources of jit modules: ones built here with torch::jit::Module::define (always run), and
// ones scripted by Python (tests/apps/make_models.py fixtures), skipped only when /usr/bin/python3
// has no torch.
#include "pipetrain/stage/torchscript.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/python.h"
#include "pipetrain/base/error.h"
#include "pipetrain/runtime/tensor_io.h"
#include "pipetrain/stage/batchnorm.h"

namespace pipetrain {
namespace {

// root
//   "0": Scale   weight (3)         forward: inner(x) * weight
//          "inner": Shift  bias (3), buffer offset (3)   forward: x + bias + offset
//   "1": Scale'  weight (3)
// Python's scripted modules carry `training` and parameters that require grad; so do these.
torch::jit::Module make_module(const std::string& type) {
  torch::jit::Module module(type);
  module.register_attribute("training", c10::BoolType::get(), true);
  return module;
}

torch::Tensor parameter(double value) {
  return torch::full({3}, value, torch::TensorOptions().requires_grad(true));
}

torch::jit::Module make_shift() {
  torch::jit::Module shift = make_module("Shift");
  shift.register_parameter("bias", parameter(0.5), /*is_buffer=*/false);
  shift.register_buffer("offset", torch::full({3}, 0.25));
  shift.define("def forward(self, x):\n  return x + self.bias + self.offset\n");
  return shift;
}

torch::jit::Module make_root() {
  torch::jit::Module scale = make_module("Scale");
  scale.register_parameter("weight", parameter(2.0), /*is_buffer=*/false);
  scale.register_module("inner", make_shift());
  scale.define("def forward(self, x):\n  return self.inner.forward(x) * self.weight\n");
  torch::jit::Module last = make_module("Last");
  last.register_parameter("weight", parameter(-1.0), /*is_buffer=*/false);
  last.define("def forward(self, x):\n  return x * self.weight\n");
  torch::jit::Module root = make_module("Root");
  root.register_module("0", scale);
  root.register_module("1", last);
  return root;
}

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  return dict.keys();
}

template <typename List>
std::vector<std::string> jit_names(const List& list) {
  std::vector<std::string> names;
  for (const auto& item : list) names.push_back(item.name);
  return names;
}

TEST(ScriptLayer, ParameterAndBufferNamesEqualTheJitModuleNames) {
  torch::jit::Module root = make_root();
  torch::nn::Sequential sequential = sequential_from_torchscript(root);
  EXPECT_EQ(keys(sequential->named_parameters()), jit_names(root.named_parameters()));
  EXPECT_EQ(keys(sequential->named_buffers()), jit_names(root.named_buffers()));
  EXPECT_EQ(keys(sequential->named_parameters()),
            (std::vector<std::string>{"0.weight", "0.inner.bias", "1.weight"}));
}

TEST(ScriptLayer, ParametersAreTheJitTensorsThemselves) {
  torch::jit::Module root = make_root();
  torch::nn::Sequential sequential = sequential_from_torchscript(root);
  auto ours = sequential->named_parameters();
  for (const auto& jit : root.named_parameters()) {
    EXPECT_EQ(ours[jit.name].unsafeGetTensorImpl(), jit.value.unsafeGetTensorImpl()) << jit.name;
  }
  auto our_buffers = sequential->named_buffers();
  for (const auto& jit : root.named_buffers()) {
    EXPECT_EQ(our_buffers[jit.name].unsafeGetTensorImpl(), jit.value.unsafeGetTensorImpl());
  }
}

TEST(ScriptLayer, ForwardChainsTheChildrenLikeTheFormula) {
  torch::nn::Sequential sequential = sequential_from_torchscript(make_root());
  torch::Tensor x = torch::tensor({1.0, 2.0, 3.0}).unsqueeze(0);
  // ((x + 0.5 + 0.25) * 2) * -1
  torch::Tensor expected = -(x + 0.75) * 2;
  EXPECT_TRUE(torch::allclose(sequential->forward(x), expected));
}

TEST(ScriptLayer, OptimizerStepsAreSeenByTheJitModule) {
  torch::jit::Module root = make_root();
  torch::nn::Sequential sequential = sequential_from_torchscript(root);
  torch::optim::SGD sgd(sequential->parameters(), torch::optim::SGDOptions(0.5));
  torch::Tensor x = torch::ones({2, 3});
  sequential->forward(x).sum().backward();
  sgd.step();
  // Layer 1's weight gradient is sum over rows of its input: 2 rows * (1 + 0.75) * 2 = 7.
  torch::Tensor jit_weight = root.attr("1").toModule().attr("weight").toTensor();
  EXPECT_TRUE(torch::allclose(jit_weight, torch::full({3}, -1.0 - 0.5 * 7.0)));
  // The jit module's own forward now computes with the updated weights.
  torch::Tensor through_jit = root.attr("1").toModule().forward({torch::ones({1, 3})}).toTensor();
  EXPECT_TRUE(torch::allclose(through_jit, torch::full({1, 3}, -4.5)));
}

TEST(ScriptLayer, TrainAndEvalReachEveryJitSubmodule) {
  torch::jit::Module root = make_root();
  torch::nn::Sequential sequential = sequential_from_torchscript(root);
  // The root's own flag is not used: only its children run.
  auto every_layer_module = [&root](bool training) {
    for (const auto& child : root.children()) {
      for (const auto& module : child.modules()) EXPECT_EQ(module.is_training(), training);
    }
  };
  sequential->eval();
  every_layer_module(false);
  sequential->train();
  every_layer_module(true);
}

TEST(ScriptLayer, CloneIsADeepCopyWithLeafParameters) {
  torch::nn::Sequential sequential = sequential_from_torchscript(make_root());
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(sequential->clone());
  ASSERT_NE(copy, nullptr);
  auto original = sequential->named_parameters();
  auto cloned = copy->named_parameters();
  ASSERT_EQ(cloned.keys(), original.keys());
  for (const auto& item : original) {
    const torch::Tensor& twin = cloned[item.key()];
    EXPECT_NE(twin.unsafeGetTensorImpl(), item.value().unsafeGetTensorImpl());
    EXPECT_TRUE(torch::equal(twin, item.value()));
    EXPECT_TRUE(twin.is_leaf() && twin.requires_grad()) << item.key();
  }
  {
    torch::NoGradGuard no_grad;
    cloned["1.weight"].fill_(3.0);
  }
  torch::Tensor x = torch::ones({1, 3});
  EXPECT_TRUE(torch::allclose(sequential->forward(x), torch::full({1, 3}, -3.5)));
  EXPECT_TRUE(torch::allclose(copy->forward(x), torch::full({1, 3}, 10.5)));
}

TEST(ScriptLayer, RejectsAModuleWithParametersOutsideItsChildren) {
  torch::jit::Module root = make_root();
  root.register_parameter("stray", torch::ones({1}), /*is_buffer=*/false);
  try {
    sequential_from_torchscript(root);
    FAIL() << "expected an error";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("stray"), std::string::npos) << error.what();
  }
}

TEST(ScriptLayer, RejectsAModuleWithoutChildren) {
  torch::jit::Module leaf("Leaf");
  leaf.define("def forward(self, x):\n  return x\n");
  EXPECT_THROW(sequential_from_torchscript(leaf), BadInput);
}

TEST(ScriptLayer, ALayerReturningATupleIsReportedByName) {
  torch::jit::Module pair("Pair");
  pair.define("def forward(self, x):\n  return (x, x)\n");
  torch::jit::Module root("Root");
  root.register_module("head", pair);
  torch::nn::Sequential sequential = sequential_from_torchscript(root);
  try {
    sequential->forward(torch::ones({1}));
    FAIL() << "expected an error";
  } catch (const BadInput& error) {
    EXPECT_NE(std::string(error.what()).find("'head'"), std::string::npos) << error.what();
  }
}

std::string temporary_directory() {
  std::string pattern = ::testing::TempDir() + "pipetrain_torchscript_XXXXXX";
  char* made = ::mkdtemp(pattern.data());
  EXPECT_NE(made, nullptr);
  return pattern;
}

TEST(LoadTorchscriptSequential, NamesTheMissingPath) {
  const std::string path = temporary_directory() + "/absent.pt";
  try {
    load_torchscript_sequential(path);
    FAIL() << "expected an error";
  } catch (const FileError& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

TEST(LoadTorchscriptSequential, NamesTheCorruptPath) {
  const std::string path = temporary_directory() + "/corrupt.pt";
  std::ofstream(path) << "this is not a zip archive";
  try {
    load_torchscript_sequential(path);
    FAIL() << "expected an error";
  } catch (const BadInput& error) {
    EXPECT_EQ(error.kind(), ErrorKind::BadInput) << error.what();
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("not a TorchScript"), std::string::npos);
  }
}

// ---- modules scripted by Python ----------------------------------------------------------------

class PythonScripted : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!pipetrain::testing::python_has_torch()) return;
    directory_ = new std::string(temporary_directory());
    const std::string command = pipetrain::testing::kPython +
                                " " PIPETRAIN_SOURCE_DIR "/tests/apps/make_models.py fixtures " +
                                *directory_;
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  void SetUp() override {
    if (directory_ == nullptr) GTEST_SKIP() << pipetrain::testing::no_python_torch_message();
  }
  std::string path(const std::string& name) const { return *directory_ + "/" + name; }

  static std::string* directory_;
};
std::string* PythonScripted::directory_ = nullptr;

TEST_F(PythonScripted, NestedNamesIncludingBatchNormBuffersMatchPython) {
  torch::jit::Module module = torch::jit::load(path("nested.pt"));
  torch::nn::Sequential sequential = sequential_from_torchscript(module);
  EXPECT_EQ(keys(sequential->named_parameters()), jit_names(module.named_parameters()));
  EXPECT_EQ(keys(sequential->named_buffers()), jit_names(module.named_buffers()));
  EXPECT_TRUE(sequential->named_parameters().contains("2.attn.out_proj.weight"));
  EXPECT_TRUE(sequential->named_buffers().contains("3.running_mean"));
}

TEST_F(PythonScripted, EvalOutputEqualsPythonsOutput) {
  torch::nn::Sequential sequential = load_torchscript_sequential(path("nested.pt"));
  sequential->eval();
  torch::NoGradGuard no_grad;
  torch::Tensor output = sequential->forward(load_tensor(path("nested_input.pt")));
  EXPECT_TRUE(torch::allclose(output, load_tensor(path("nested_eval_output.pt")), 1e-5, 1e-6));
}

TEST_F(PythonScripted, LayerByLayerGradientsEqualTheWholeJitModulesGradients) {
  torch::jit::Module module = torch::jit::load(path("nested.pt"));
  torch::nn::Sequential sequential = sequential_from_torchscript(module);
  sequential->eval();  // no dropout randomness, batch norm from running statistics
  torch::Tensor x = load_tensor(path("nested_input.pt"));
  sequential->forward(x).square().sum().backward();
  std::vector<torch::Tensor> layered;
  for (const auto& parameter : sequential->parameters()) {
    layered.push_back(parameter.grad().clone());
    parameter.mutable_grad().zero_();
  }
  module.forward({x}).toTensor().square().sum().backward();
  auto whole = module.parameters();
  size_t index = 0;
  for (const auto& parameter : whole) {
    ASSERT_LT(index, layered.size());
    EXPECT_TRUE(torch::allclose(parameter.grad(), layered[index], 1e-5, 1e-6)) << index;
    ++index;
  }
  EXPECT_EQ(index, layered.size());
}

TEST_F(PythonScripted, DropoutFollowsTheModeSetOnTheSequential) {
  torch::nn::Sequential sequential = load_torchscript_sequential(path("nested.pt"));
  auto* dropout = sequential->ptr(4)->as<ScriptLayer>();
  ASSERT_NE(dropout, nullptr);
  torch::NoGradGuard no_grad;
  torch::Tensor in = torch::ones({64, 8});
  sequential->train();
  EXPECT_GT((dropout->forward(in) == 0).sum().item<int64_t>(), 0);
  sequential->eval();
  EXPECT_TRUE(torch::equal(dropout->forward(in), in));
}

TEST_F(PythonScripted, ATorchScriptBatchNormBecomesADeferredOneOnTheSameTensors) {
  torch::jit::Module module = torch::jit::load(path("nested.pt"));
  torch::nn::Sequential converted =
      convert_deferred_batch_norm(sequential_from_torchscript(module), /*chunks=*/2);
  auto* deferred = converted->ptr(3)->as<DeferredBatchNorm>();
  ASSERT_NE(deferred, nullptr);
  EXPECT_EQ(keys(converted->named_parameters()), jit_names(module.named_parameters()));
  EXPECT_EQ(keys(converted->named_buffers()), jit_names(module.named_buffers()));
  torch::jit::Module jit_batch_norm = module.attr("3").toModule();
  EXPECT_EQ(deferred->running_mean.unsafeGetTensorImpl(),
            jit_batch_norm.attr("running_mean").toTensor().unsafeGetTensorImpl());
  EXPECT_EQ(deferred->weight.unsafeGetTensorImpl(),
            jit_batch_norm.attr("weight").toTensor().unsafeGetTensorImpl());

  // Reference: a LibTorch BatchNorm1d with the fixture's statistics, on the whole batch.
  torch::nn::BatchNorm1d whole(8);
  {
    torch::NoGradGuard no_grad;
    whole->running_mean.copy_(deferred->running_mean);
    whole->running_var.copy_(deferred->running_var);
  }
  torch::Tensor batch = torch::randn({10, 8});
  for (const auto& micro : batch.chunk(2)) deferred->forward(micro);
  whole->forward(batch);
  torch::Tensor jit_mean = jit_batch_norm.attr("running_mean").toTensor();
  EXPECT_TRUE(torch::allclose(jit_mean, whole->running_mean, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(jit_batch_norm.attr("running_var").toTensor(), whole->running_var,
                              1e-5, 1e-6));
  EXPECT_EQ(jit_batch_norm.attr("num_batches_tracked").toTensor().item<int64_t>(), 1);
}

}  // namespace
}  // namespace pipetrain
