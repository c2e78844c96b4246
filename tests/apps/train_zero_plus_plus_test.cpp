// ZeRO++ under `pipetrain train` (train/sharded_optimizer.h, docs/DISTRIBUTED.md): the Hugging Face
// Llama at dp 4 over two hosts of two ranks (--ranks-per-host 2), ZeRO-3. hpZ alone trains the
// weights of ZeRO-3 bit for bit and keeps the backward's gathers within the hosts; qwZ, hpZ and
// qgZ together send a quarter of float32's bytes in the forward's gathers and less than a quarter
// of the gradients' between hosts, and train weights near ZeRO-3's but not equal to them (the
// quantization is in the path). What cannot run exits 2 before training, naming the flag.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../helpers/cli_run.h"
#include "../helpers/hf_models.h"
#include "../helpers/params_file.h"

namespace pipetrain::train_zero_plus_plus_test {
namespace {

using testing::CliRun;
using testing::run_pipetrain;

std::string flags(const std::string& extra) {
  const std::string dir = testing::hf_fixtures();
  return "train --model " + dir + "/llama --data tokens --token-file " + dir +
         "/tokens.bin --seq-len 16 --batch-size 8 --lr 1e-2 --optimizer adamw --adam-eps 1e-6 "
         "--nproc 4 --dp 4 --chunks 2 --steps 2 " +
         extra;
}

// ZeRO's bytes per step, within hosts and between hosts, from --report-comm's line: forward
// gathers, backward gathers, gradients.
struct ZeroBytes {
  std::vector<double> within, between;
};
ZeroBytes zero_bytes(const std::string& output) {
  ZeroBytes bytes;
  const size_t at = output.find("(bytes: ");
  if (at == std::string::npos) return bytes;
  std::istringstream in(output.substr(at + 8));
  for (int i = 0; i < 3; ++i) {
    double w = 0, b = 0;
    in >> w >> b;
    bytes.within.push_back(w);
    bytes.between.push_back(b);
  }
  return bytes;
}

// The largest difference of a weight tensor from `b`'s, in norm, relative to its norm in `b`.
double largest_difference(const std::string& a, const std::string& b) {
  const auto x = testing::load_params(a), y = testing::load_params(b);
  if (x.empty() || x.size() != y.size()) return INFINITY;
  double most = 0;
  for (const auto& [name, tensor] : y) {
    if (!x.count(name)) return INFINITY;
    most = std::max(most, (x.at(name) - tensor).norm().item<double>() /
                              std::max(tensor.norm().item<double>(), 1e-12));
  }
  return most;
}

TEST(TrainZeroPlusPlus, HpzIsExactAndTheQuantizedPathsSendWhatTheyShould) {
  const std::string dir = testing::scratch_dir("train_zero_plus_plus");
  auto run = [&](const std::string& extra, const std::string& name) {
    const CliRun r = run_pipetrain(flags("--zero 3 --ranks-per-host 2 --report-comm " + extra +
                                         " --save-params " + dir + "/" + name + ".pt"));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.output;
    return zero_bytes(r.output);
  };
  const ZeroBytes exact = run("", "exact");
  ASSERT_EQ(exact.between.size(), 3u);
  for (double b : exact.between) EXPECT_GT(b, 0);
  // hpZ over the hosts' two replicas: the weights of ZeRO-3; the forward's gathers and the
  // gradients as ZeRO-3's, the backward's within the hosts only. By stage, gathered around every
  // action, the same weights, and the gathers after a stage's first of the step within the hosts.
  const ZeroBytes hpz = run("--zero-hpz-partition-size 2", "hpz");
  ASSERT_EQ(hpz.between.size(), 3u);
  EXPECT_EQ(hpz.between[0], exact.between[0]);
  EXPECT_EQ(hpz.between[1], 0);
  EXPECT_GT(hpz.within[1], 0);
  EXPECT_EQ(hpz.between[2], exact.between[2]);
  EXPECT_EQ(largest_difference(dir + "/hpz.pt", dir + "/exact.pt"), 0);
  const ZeroBytes by_stage = run("--zero-hpz-partition-size 2 --reshard-after-forward", "stage");
  ASSERT_EQ(by_stage.between.size(), 3u);
  EXPECT_EQ(by_stage.between[1], 0);
  EXPECT_GT(by_stage.within[1], 0);
  EXPECT_EQ(largest_difference(dir + "/stage.pt", dir + "/exact.pt"), 0);
  // All three: int8 and a float32 scale per 256 values where float32 went (a quarter and 1/64 of
  // it), and the gradients' int8 through the second hop only between hosts.
  const ZeroBytes all =
      run("--zero-quantized-weights --zero-hpz-partition-size 2 --zero-quantized-gradients", "all");
  ASSERT_EQ(all.between.size(), 3u);
  const double forward = all.between[0] / exact.between[0];
  EXPECT_GE(forward, 0.25);
  EXPECT_LE(forward, 0.25 + 1.0 / 64 + 0.01);
  EXPECT_EQ(all.between[1], 0);
  EXPECT_LT(all.between[2], exact.between[2] / 4);
  // Adam's first steps move each weight by about the learning rate whatever its gradient's size,
  // so a gradient that quantizes to 0 or changes sign moves it by that much less or more: about
  // 0.1 of a matrix's norm after two steps here (0.85 where the pieces reach the wrong replicas,
  // the reordering left out).
  const double difference = largest_difference(dir + "/all.pt", dir + "/exact.pt");
  EXPECT_GT(difference, 0);
  EXPECT_LT(difference, 0.2);
}

TEST(TrainZeroPlusPlus, WhatCannotRunExitsTwoNamingTheFlag) {
  const auto expect = [](const std::string& extra, const std::string& wanted) {
    const CliRun r = run_pipetrain(flags(extra));
    EXPECT_EQ(r.exit_code, 2) << extra << "\n" << r.output;
    EXPECT_NE(r.output.find(wanted), std::string::npos) << extra << "\n" << r.output;
  };
  expect("--zero-quantized-weights", "--zero-quantized-weights is part of ZeRO++");
  expect("--zero-quantized-weights --zero 2", "it needs --zero 3 (got --zero 2)");
  expect("--zero-hpz-partition-size 2 --zero 1", "it needs --zero 3 (got --zero 1)");
  expect("--zero 3 --zero-hpz-partition-size 3",
         "--zero-hpz-partition-size 3 does not divide the 4 data-parallel replicas");
  expect("--zero 1 --zero-quantized-gradients --ranks-per-host 3",
         "has 3 on host 0 and 1 on host 1 (--ranks-per-host 3)");
  expect("--zero 3 --zero-quantized-weights --zero-ladder", "--zero-ladder picks the ZeRO stage");
}

}  // namespace
}  // namespace pipetrain::train_zero_plus_plus_test
