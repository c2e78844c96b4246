// Memory model: residency from the schedule's order, the per-stage formula, per-rank sums, sizes.
#include <gtest/gtest.h>

#include "pipetrain/base/error.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/schedule/generators.h"

namespace pipetrain::partition {
namespace {

TEST(StageResidency, GPipeStashesEveryMicroBatchOnEveryStage) {
  const auto residency = stage_residency(schedule::gpipe(3, 5));
  ASSERT_EQ(residency.size(), 3u);
  for (const auto& stage : residency) {
    EXPECT_EQ(stage.peak_inflight, 5);
    // Our GPipe runs backwards in order 0..M-1, so B0..B3 (recomputed under except_last) run
    // while micro-batch 4 is still stashed whole.
    EXPECT_TRUE(stage.last_alive_during_recompute);
  }
}

TEST(StageResidency, ALastMicroBatchBackwardFirstOverlapsNoRecompute) {
  // Reverse-order GPipe as torchgpipe runs it: the last micro-batch's backward comes first.
  schedule::Schedule reversed = schedule::gpipe(1, 3);
  reversed.actions[0] = {{0, schedule::Op::kForward, 0},  {0, schedule::Op::kForward, 1},
                         {0, schedule::Op::kForward, 2},  {0, schedule::Op::kBackward, 2},
                         {0, schedule::Op::kBackward, 1}, {0, schedule::Op::kBackward, 0}};
  const auto residency = stage_residency(reversed);
  EXPECT_EQ(residency[0].peak_inflight, 3);
  EXPECT_FALSE(residency[0].last_alive_during_recompute);
}

TEST(StageResidency, OneFOneBStashesRanksMinusStageMicroBatches) {
  const int K = 4;
  const auto residency = stage_residency(schedule::one_f_one_b(K, 8));
  for (int j = 0; j < K; ++j) EXPECT_EQ(residency[j].peak_inflight, K - j) << "stage " << j;
  // Stage 0 runs F7 and then still B5, B6: the last micro-batch is alive during recomputes.
  EXPECT_TRUE(residency[0].last_alive_during_recompute);
  // The last stage runs F7 B7 back to back.
  EXPECT_FALSE(residency[K - 1].last_alive_during_recompute);
}

TEST(StageMemory, CountsParametersGradientsOptimizerAndStash) {
  StageResidency three{3, false};
  const auto never = stage_memory(1000, 10, 100, three, Checkpoint::kNever, 2.0);
  EXPECT_EQ(never.parameters, 1000);
  EXPECT_EQ(never.gradients, 1000);
  EXPECT_EQ(never.optimizer_state, 2000);
  EXPECT_EQ(never.stashed_activations, 3 * 110);
  EXPECT_EQ(never.recompute_activations, 0);
  EXPECT_EQ(never.total(), 4000 + 330);

  const auto always = stage_memory(1000, 10, 100, three, Checkpoint::kAlways, 0.0);
  EXPECT_EQ(always.stashed_activations, 3 * 10);
  EXPECT_EQ(always.recompute_activations, 100);

  const auto last = stage_memory(1000, 10, 100, three, Checkpoint::kExceptLast, 0.0);
  EXPECT_EQ(last.stashed_activations, 3 * 10 + 100);
  EXPECT_EQ(last.recompute_activations, 0);
  StageResidency overlapping{3, true};
  EXPECT_EQ(
      stage_memory(1000, 10, 100, overlapping, Checkpoint::kExceptLast, 0.0).recompute_activations,
      100);
}

TEST(RankPeakMemory, HoldsWhatARanksStagesStashAtTheSameTime) {
  // 4 identical layers: 100 B of parameters, 8 B of stash and 2 B of output per sample.
  UniformLayer layer;
  layer.parameter_bytes = 100;
  layer.activation_bytes_per_sample = 8;
  layer.output_bytes_per_sample = 2;
  const ModelProfile profile = uniform_profile(4, 4, layer);
  // 1f1b, 2 ranks, 4 micro-batches of 1 sample: stage 0 holds 2, stage 1 holds 1.
  const auto schedule = schedule::one_f_one_b(2, 4);
  const auto peaks = rank_peak_memory(profile, {2, 2}, 1, schedule, MemoryModelOptions{});
  // Per stage: 2 * 100 parameters + 2 * 100 gradients; stash per micro-batch = input 2 + 2 * 8.
  EXPECT_EQ(peaks[0], 400 + 2 * 18);
  EXPECT_EQ(peaks[1], 400 + 1 * 18);

  // Interleaved, 2 ranks x 2 virtual stages of one layer: rank 0 holds stages 0 and 2.
  const auto interleaved = schedule::interleaved_one_f_one_b(2, 4, 2);
  const auto r2 = stage_residency(interleaved);
  MemoryModelOptions always_options;
  always_options.checkpoint = Checkpoint::kAlways;
  const auto always = rank_peak_memory(profile, {1, 1, 1, 1}, 1, interleaved, always_options);
  // Each stage: 200 parameter bytes, inputs of 2 bytes, a recompute of 8 bytes. Rank 0 runs
  //   0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3
  // and holds the most at 2B0: five inputs and one recompute. Stage 0's own peak (four inputs,
  // at 0F3) and stage 2's (two, at 2F1) never coincide, so the rank holds less than their sum.
  const std::int64_t rank0 = 400 + 5 * 2 + 8;
  EXPECT_LT(rank0, 400 + 2 * (r2[0].peak_inflight + r2[2].peak_inflight) + 8);
  EXPECT_EQ(always[0], rank0);
}

TEST(RankPeakMemory, RejectsABalanceOfTheWrongSize) {
  const ModelProfile profile = uniform_profile(4, 4, UniformLayer{});
  const auto schedule = schedule::one_f_one_b(2, 4);
  EXPECT_THROW(rank_peak_memory(profile, {4}, 1, schedule, MemoryModelOptions{}),
               pipetrain::BadInput);
}

TEST(Bytes, ParseAndFormatAgree) {
  EXPECT_EQ(parse_bytes("2GiB"), 2LL << 30);
  EXPECT_EQ(parse_bytes("512 MiB"), 512LL << 20);
  EXPECT_EQ(parse_bytes("1.5G"), 3LL << 29);
  EXPECT_EQ(parse_bytes("64KB"), 64000);
  EXPECT_EQ(parse_bytes("1000000"), 1000000);
  EXPECT_THROW(parse_bytes("lots"), pipetrain::BadInput);
  EXPECT_THROW(parse_bytes("2 parsecs"), pipetrain::BadInput);
  // Sizes int64 cannot count are refused, not wrapped to a negative number.
  EXPECT_EQ(parse_bytes("7340032TiB"), 7340032LL << 40);  // 7 EiB
  EXPECT_THROW(parse_bytes("1e30GiB"), pipetrain::BadInput);
  EXPECT_THROW(parse_bytes("8388608TiB"), pipetrain::BadInput);
  EXPECT_THROW(parse_bytes("inf"), pipetrain::BadInput);
  EXPECT_EQ(format_bytes(2LL << 30), "2.00 GiB");
  EXPECT_EQ(format_bytes(100), "100 B");
}

TEST(Checkpoint, NamesRoundTrip) {
  for (Checkpoint mode : all_checkpoint_modes()) {
    EXPECT_EQ(parse_checkpoint(to_string(mode)), mode);
  }
  EXPECT_THROW(parse_checkpoint("sometimes"), pipetrain::BadInput);
}

TEST(PredictMemory, ZeroShardsTheOptimizerStateAndStageTwoTheGradientsOverTheReplicas) {
  // 4 layers of 100 parameter bytes (25 floats): a rank of 2 layers holds 50 floats.
  UniformLayer layer;
  layer.parameter_bytes = 100;
  const ModelProfile profile = uniform_profile(4, 4, layer);
  const auto schedule = schedule::one_f_one_b(2, 4);
  MemoryModelOptions options;
  options.optimizer_state_multiple = 2;
  const auto plain = predict_memory(profile, {2, 2}, 1, schedule, options);
  EXPECT_EQ(plain[0].parameters, 200);
  EXPECT_EQ(plain[0].gradients, 200);
  EXPECT_EQ(plain[0].optimizer_state, 400);
  options.data_parallel = 3;
  options.zero = 1;
  // Stage 1 lays the stage out as one bucket: 50 floats padded to 51, 17 a replica (68 bytes).
  // It steps slices of the parameters and writes the sums into .grad(): no shard of its own.
  const auto one = predict_memory(profile, {2, 2}, 1, schedule, options);
  EXPECT_EQ(one[0].parameters, 200);
  EXPECT_EQ(one[0].gradients, 200);
  EXPECT_EQ(one[0].optimizer_state, 2 * 68);
  EXPECT_EQ(one[0].step_gradients, 0);  // the full .grad() stays: in gradients
  // Stage 2 streams (the default): by layer, 25 floats padded to 27, 9 a replica each: a shard
  // of 18 floats (72 bytes); during the step only one layer's gradients of one micro-batch.
  options.zero = 2;
  const auto two = predict_memory(profile, {2, 2}, 1, schedule, options);
  EXPECT_EQ(two[0].gradients, 72);
  EXPECT_EQ(two[0].optimizer_state, 2 * 72);
  EXPECT_EQ(two[0].step_gradients, 100);
  // Accumulated: the stage as one bucket again, and the full .grad() until the reduce-scatter.
  options.zero_policy.stream = false;
  const auto accumulated = predict_memory(profile, {2, 2}, 1, schedule, options);
  EXPECT_EQ(accumulated[0].gradients, 68);
  EXPECT_EQ(accumulated[0].step_gradients, 200);
  EXPECT_EQ(plain[0].step_gradients, 0);
  // Activations do not depend on ZeRO's sharding, but streaming records every forward for a
  // backward by segment (the split body; here the same bytes).
  EXPECT_EQ(accumulated[0].activations, plain[0].activations);
}

// ZeRO's buffers in flight: none for one replica without ZeRO; every gradient once for ZeRO 0's
// all-reduce (or its buckets); at ZeRO 1-3 two segments at a time, each its padded buffer and,
// where the received piece is a buffer of its own (stage 1, and every streamed reduction), the
// piece; stages 1 and 2's step gathers as much. On the host when offloaded without replicas.
TEST(PredictMemory, TheGradientSumsBuffersAreTwoSegmentsInFlightUnderZero) {
  UniformLayer layer;
  layer.parameter_bytes = 100;
  const ModelProfile profile = uniform_profile(4, 4, layer);
  const auto schedule = schedule::one_f_one_b(2, 4);
  MemoryModelOptions options;
  EXPECT_EQ(predict_memory(profile, {2, 2}, 1, schedule, options)[0].reduce_buffers, 0);
  options.data_parallel = 3;
  const RankMemory replicated = predict_memory(profile, {2, 2}, 1, schedule, options)[0];
  EXPECT_EQ(replicated.reduce_buffers, 200);
  options.zero = 1;  // one segment: 51 floats padded (204 bytes) and its piece (68)
  EXPECT_EQ(predict_memory(profile, {2, 2}, 1, schedule, options)[0].reduce_buffers, 204 + 68);
  for (int zero : {2, 3}) {  // streamed by layer: two of 27 floats (108 bytes) and 9 (36)
    options.zero = zero;
    const RankMemory sharded = predict_memory(profile, {2, 2}, 1, schedule, options)[0];
    EXPECT_EQ(sharded.reduce_buffers, 2 * (108 + 36)) << "zero " << zero;
    EXPECT_EQ(sharded.total() - sharded.reduce_buffers,
              sharded.parameters + sharded.gradients + sharded.optimizer_state +
                  sharded.activations + sharded.gathered + sharded.step_gradients +
                  sharded.gather_buffers)
        << "zero " << zero;
  }
  // Buckets of 120 bytes: stage 1 lays 100-byte layers out one a bucket, two in flight.
  options.zero = 1;
  options.zero_policy.bucket_bytes = 120;
  EXPECT_EQ(predict_memory(profile, {2, 2}, 1, schedule, options)[0].reduce_buffers,
            2 * (108 + 36));
  // --overlap-grad-reduce: every segment's reduction in flight together until the step's end.
  options.zero_policy.overlap = true;
  EXPECT_EQ(predict_memory(profile, {2, 2}, 1, schedule, options)[0].reduce_buffers,
            2 * (108 + 36));
  options = MemoryModelOptions();
  options.zero = 1;
  options.data_parallel = 1;
  options.offload_optimizer = true;
  const RankMemory alone = predict_memory(profile, {2, 2}, 1, schedule, options)[0];
  EXPECT_EQ(alone.reduce_buffers, 0);
  EXPECT_EQ(alone.offloaded, 2 * 200 + 200);  // shard and its gradient, and the flat
}

TEST(PredictMemory, TransportHoldsTwoPostedReceivesAndTheSendsNotProvenReceivedBetweenProcesses) {
  UniformLayer layer;
  layer.output_bytes_per_sample = 100;  // 2 samples: 200 bytes, 256 aligned to 64
  const ModelProfile profile = uniform_profile(3, 4, layer);
  const auto schedule = schedule::one_f_one_b(3, 4);
  MemoryModelOptions options;
  const auto one_process = predict_memory(profile, {1, 1, 1}, 2, schedule, options);
  EXPECT_EQ(one_process[1].receive_buffers + one_process[1].send_buffers, 0);
  options.processes = true;
  const auto ranks = predict_memory(profile, {1, 1, 1}, 2, schedule, options);
  const std::int64_t message = transport_message_bytes(200);
  EXPECT_EQ(message, 256 + 256);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(ranks[r].receive_buffers, 2 * message) << "rank " << r;
  // Stage 0 sends its 3 warm-up forwards before its first receive: the send window of 2 frees
  // the oldest before the third. The last stage learns that gradient i arrived only from
  // activation i + 2, which rank 1 sent after it took gradient i: it holds two gradients
  // (schedule/send_release.h).
  EXPECT_EQ(ranks[0].send_buffers, 2 * message);
  EXPECT_EQ(ranks[2].send_buffers, 2 * message);
  // A send walk the caller keeps (the planner's, one per schedule) gives the same figures.
  const SendWalk walk = send_walk(schedule);
  options.sends = &walk;
  const auto kept = predict_memory(profile, {1, 1, 1}, 2, schedule, options);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(kept[r].send_buffers, ranks[r].send_buffers) << "rank " << r;
}

TEST(PredictMemory, TheLossKeepsItsTensorsOnTheLastStageForEveryMicroBatchInFlight) {
  UniformLayer layer;
  const ModelProfile profile = uniform_profile(2, 8, layer);
  const auto gpipe = schedule::gpipe(2, 4);
  MemoryModelOptions options;
  const auto without = predict_memory(profile, {1, 1}, 2, gpipe, options);
  options.loss_bytes = 1000;
  const auto with = predict_memory(profile, {1, 1}, 2, gpipe, options);
  EXPECT_EQ(with[0].activations, without[0].activations);
  EXPECT_EQ(with[1].activations, without[1].activations + 4 * 1000);
  // The totals are what the planner compares with its limit.
  const auto totals = rank_peak_memory(profile, {1, 1}, 2, gpipe, options);
  EXPECT_EQ(totals[1], with[1].total());
}

TEST(PredictMemory, ASplitBackwardHoldsEveryRecomputedMicroBatchFromItsIToItsW) {
  UniformLayer layer;
  layer.activation_bytes_per_sample = 1000;
  layer.output_bytes_per_sample = 1;
  const ModelProfile profile = uniform_profile(2, 4, layer);
  MemoryModelOptions options;
  options.checkpoint = Checkpoint::kAlways;
  // 1F1B's last stage recomputes and frees one micro-batch at a time: one body at once.
  const auto one_f_one_b = predict_memory(profile, {1, 1}, 1, schedule::one_f_one_b(2, 4), options);
  EXPECT_EQ(one_f_one_b[1].activations, 1 + 1000);
  // ZB-H1 defers W: the last stage's recomputed micro-batches wait for it, bodies and all.
  const auto zb = predict_memory(profile, {1, 1}, 1, schedule::zero_bubble_h1(2, 4), options);
  EXPECT_GE(zb[1].activations, 2 * (1 + 1000));
}

// Activation offload (MemoryModelOptions::offload). The last stage's input is 100 bytes, its body
// 1000, one row per micro-batch. The interpreter brings a micro-batch back from the first action
// after the backward before its own, so the first one after a backward never stays away: GPipe
// keeps M - 1 inputs in host memory, 1F1B one.
TEST(PredictMemory, OffloadKeepsWaitingInputsInHostMemoryAndFreesThemOnlyOnAGpu) {
  UniformLayer layer;
  layer.activation_bytes_per_sample = 1000;
  layer.output_bytes_per_sample = 100;
  const ModelProfile profile = uniform_profile(2, 4, layer);
  MemoryModelOptions options;
  options.checkpoint = Checkpoint::kAlways;
  for (const bool gpipe : {true, false}) {
    const auto schedule = gpipe ? schedule::gpipe(2, 4) : schedule::one_f_one_b(2, 4);
    const std::string what = gpipe ? "gpipe" : "1f1b";
    options.offload = false;
    const auto without = predict_memory(profile, {1, 1}, 1, schedule, options);
    EXPECT_EQ(without[1].offloaded, 0) << what;
    EXPECT_EQ(without[1].activations, (gpipe ? 4 : 1) * 100 + 1000) << what;
    // CPU stages: the inputs are counted in host memory and stay in the stash.
    options.offload = true;
    options.offload_frees_stash = {};
    const auto cpu = predict_memory(profile, {1, 1}, 1, schedule, options);
    EXPECT_EQ(cpu[1].offloaded, (gpipe ? 3 : 1) * 100) << what;
    EXPECT_GT(cpu[0].offloaded, 0) << what;
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(cpu[r].activations, without[r].activations) << what << " rank " << r;
      EXPECT_EQ(cpu[r].total(), without[r].total()) << what << ": host memory is not in total()";
    }
    // GPU stages: a backward holds its own input and body, and GPipe's also the next backward's
    // input, which comes back while it runs (1F1B's next one is not forwarded yet); the other
    // inputs are away.
    options.offload_frees_stash = {false, true};  // rank 0 on the CPU, rank 1 on a GPU
    const auto gpu = predict_memory(profile, {1, 1}, 1, schedule, options);
    EXPECT_EQ(gpu[1].offloaded, cpu[1].offloaded) << what;
    EXPECT_EQ(gpu[1].activations, (gpipe ? 2 : 1) * 100 + 1000) << what;
    EXPECT_EQ(gpu[0].activations, cpu[0].activations) << what;
  }
}

TEST(PredictMemory, OffloadWithoutACheckpointedMicroBatchIsBadInput) {
  const ModelProfile profile = uniform_profile(2, 4, UniformLayer{});
  MemoryModelOptions options;
  options.offload = true;
  options.checkpoint = Checkpoint::kNever;
  EXPECT_THROW(predict_memory(profile, {1, 1}, 1, schedule::gpipe(2, 4), options),
               pipetrain::BadInput);
  options.checkpoint = Checkpoint::kExceptLast;
  EXPECT_THROW(predict_memory(profile, {1, 1}, 1, schedule::gpipe(2, 1), options),
               pipetrain::BadInput);
  EXPECT_NO_THROW(predict_memory(profile, {1, 1}, 1, schedule::gpipe(2, 2), options));
}

// ZeRO-3: the parameters held between steps are the shard, and the gathered category walks the
// residency plan: interleaved 1F1B keeps a rank's two stages whole together (their first-to-last
// intervals overlap), resharding after forward one at a time (the larger).
// Both ZeRO-3 tests below: 100 bytes of parameters a layer, rank 0 of interleaved 1F1B (stages 0
// and 2), Adam's state, dp 2.
struct ZeroThreeSetup {
  ModelProfile profile;
  schedule::Schedule schedule = schedule::interleaved_one_f_one_b(2, 4, 2);
  MemoryModelOptions options;
  ZeroThreeSetup() {
    UniformLayer layer;
    layer.parameter_bytes = 100;
    profile = uniform_profile(5, 4, layer);
    options.optimizer_state_multiple = 2;
    options.data_parallel = 2;
    options.zero = 3;
    // By stage, gradients accumulated: each stage one bucket.
    options.zero_policy.by_layer = false;
    options.zero_policy.stream = false;
  }
};

TEST(PredictMemory, ZeroThreeHoldsTheShardAndGathersTheStagesAsTheResidencyPlanSays) {
  ZeroThreeSetup setup;
  const ModelProfile& profile = setup.profile;
  const schedule::Schedule& schedule = setup.schedule;
  MemoryModelOptions& options = setup.options;
  const std::vector<int> balance = {1, 1, 2, 1};  // rank 0: 100 + 200 bytes
  const auto keep = predict_memory(profile, balance, 1, schedule, options);
  EXPECT_EQ(keep[0].parameters, 152);  // 75 floats padded to 76, 38 per replica
  EXPECT_EQ(keep[0].gradients, 152);
  EXPECT_EQ(keep[0].optimizer_state, 2 * 152);
  EXPECT_EQ(keep[0].gathered, 300);
  options.reshard_after_forward = true;
  const auto reshard = predict_memory(profile, balance, 1, schedule, options);
  EXPECT_EQ(reshard[0].gathered, 200);
  EXPECT_EQ(reshard[0].parameters, keep[0].parameters);
  options.zero = 2;
  EXPECT_EQ(predict_memory(profile, balance, 1, schedule, options)[0].gathered, 0);
}

// ZeRO-3's gather buffers: a stage's receive buffer from its gather's start to the wait before the
// action that needs it, one stage's at a time here. Rank 0 of interleaved 1F1B gathers stage 0
// before its first action (25 floats padded to 26: 104 bytes), and stage 2 after its second, as
// the prefetch for its third (50 floats: 200 bytes). Narrowed to bf16, a buffer is 2 bytes an
// element plus the bf16 copy of the rank's piece.
TEST(PredictMemory, ZeroThreeGatherBuffersAreTheLargestStagesBufferInFlight) {
  ZeroThreeSetup setup;
  const ModelProfile& profile = setup.profile;
  const schedule::Schedule& schedule = setup.schedule;
  MemoryModelOptions& options = setup.options;
  const std::vector<int> balance = {1, 1, 2, 1};
  EXPECT_EQ(predict_memory(profile, balance, 1, schedule, options)[0].gather_buffers, 200);
  options.reshard_after_forward = true;
  EXPECT_EQ(predict_memory(profile, balance, 1, schedule, options)[0].gather_buffers, 200);
  options.reshard_after_forward = false;
  ModelProfile cast = profile;
  for (LayerProfile& layer : cast.layers) layer.cast_parameter_bytes = 100;  // every parameter
  options.cast_gathers = true;
  const RankMemory narrowed = predict_memory(cast, balance, 1, schedule, options)[0];
  EXPECT_EQ(narrowed.gather_buffers, 50 * 2 + 25 * 2);  // stage 2: buffer and piece copy
  EXPECT_EQ(narrowed.gathered, 300);                    // whole parameters stay float32
  options.cast_gathers = false;                         // the same layers, gathered in float32
  EXPECT_EQ(predict_memory(cast, balance, 1, schedule, options)[0].gather_buffers, 200);
  options.cast_gathers = true;
  for (LayerProfile& layer : cast.layers) layer.cast_parameter_bytes = 0;
  cast.layers[0].cast_parameter_bytes = 40;  // layer 0: 10 floats narrowed, 15 kept
  const auto ranks = predict_memory(cast, {1, 1, 1, 1}, 1, schedule, options);
  // 15 kept floats pad to 16 (64 bytes); 10 narrowed: 5 a replica, 10 x 2 + 5 x 2 = 30 bytes.
  EXPECT_EQ(ranks[0].gather_buffers, std::max<std::int64_t>(64 + 30, 104));
  RankMemory without = ranks[0];
  without.gather_buffers = 0;
  EXPECT_EQ(ranks[0].total() - without.total(), 104);  // in the device's total
  options.zero = 2;
  EXPECT_EQ(predict_memory(profile, balance, 1, schedule, options)[0].gather_buffers, 0);
}

// ZeRO-3 by layer (the default): rank 1 of 1F1B holds layers 2 and 3 (100 bytes each), layer 3's
// 100 being 60 bytes of its own and 40 of a weight tied to another rank's layer. By layer each
// layer is a unit (layer 2: 25 floats, padded to 26 at dp 2, 104 bytes; layer 3: 15 floats of its
// own, 16, 64 bytes, and the tie's 10, 40 bytes): the tie is gathered with its layer, but its
// gradient accumulates over the step and is reduced after the tie sum, not streamed.
TEST(PredictMemory, ZeroThreeByLayerHoldsALayerAtATimeAndAccumulatesATiedWeight) {
  UniformLayer layer;
  layer.parameter_bytes = 100;
  ModelProfile profile = uniform_profile(4, 4, layer);
  profile.layers[3].parameter_sizes = {60, 40};
  profile.layers[3].shared_parameters = {false, true};
  profile.layers[3].cast_parameters = {false, false};
  const auto schedule = schedule::one_f_one_b(2, 4);
  MemoryModelOptions options;
  options.optimizer_state_multiple = 2;
  options.data_parallel = 2;
  options.zero = 3;
  options.zero_policy.units = {0, 0, -1};  // no prefetch, freed after every use
  const RankMemory rank = predict_memory(profile, {2, 2}, 1, schedule, options)[1];
  EXPECT_EQ(rank.parameters, 52 + 32 + 20);
  EXPECT_EQ(rank.gradients, rank.parameters);
  EXPECT_EQ(rank.optimizer_state, 2 * rank.parameters);
  EXPECT_EQ(rank.gathered, 104);  // one layer at a time: in flight at its use, then whole
  EXPECT_EQ(rank.gather_buffers, 0);  // by layer a gathered buffer is the parameters' storage
  EXPECT_EQ(rank.step_gradients, 40 + 100);  // the tie's .grad(), and layer 2's of one micro-batch
  // Prefetch starts the next layer while one is whole; keeping a layer reused next (1F1B's last
  // stage runs F then B) holds both layers at once at most.
  options.zero_policy.units = {std::int64_t{1} << 20, 0, 0};
  const RankMemory prefetched = predict_memory(profile, {2, 2}, 1, schedule, options)[1];
  EXPECT_GE(prefetched.gathered, 104);
  EXPECT_LE(prefetched.gathered, 208);
  // By stage, the whole stage from its first action to its last.
  options.zero_policy.by_layer = false;
  EXPECT_EQ(predict_memory(profile, {2, 2}, 1, schedule, options)[1].gathered, 200);
  // A rank holding both ends of the tie keeps it whole through the step, once.
  profile.layers[2].parameter_sizes = {60, 40};
  profile.layers[2].shared_parameters = {false, true};
  profile.layers[2].cast_parameters = {false, false};
  options.zero_policy.by_layer = true;
  options.zero_policy.units = {0, 0, -1};
  const RankMemory both = predict_memory(profile, {2, 2}, 1, schedule, options)[1];
  EXPECT_EQ(both.gathered, 64 + 40);  // a layer's own 60 bytes, and the tie through the step
}

// ZeRO-Offload: the shard's values and gradient and the optimizer state leave the rank's total for
// the offloaded (host) category; what the rank keeps is the parameters, their gradients and, at
// ZeRO-3, the shard its gathers read.
TEST(PredictMemory, OptimizerOffloadMovesTheShardAndItsStateToHostMemory) {
  UniformLayer layer;
  layer.parameter_bytes = 100;
  const ModelProfile profile = uniform_profile(4, 4, layer);
  const auto schedule = schedule::one_f_one_b(2, 4);
  const std::vector<int> balance = {2, 2};  // each rank: 200 bytes, 50 floats, 25 per replica
  MemoryModelOptions options;
  options.optimizer_state_multiple = 2;
  options.data_parallel = 2;
  options.zero_policy.stream = false;  // each stage one bucket
  options.zero_policy.by_layer = false;
  for (int zero : {1, 2, 3}) {
    options.zero = zero;
    options.offload_optimizer = false;
    const RankMemory kept = predict_memory(profile, balance, 1, schedule, options)[0];
    options.offload_optimizer = true;
    const RankMemory offloaded = predict_memory(profile, balance, 1, schedule, options)[0];
    EXPECT_EQ(offloaded.optimizer_state, 0) << "zero " << zero;
    // Stage 1 keeps every .grad() either way (the offload's shard gradient is on the host);
    // stages 2 and 3 keep the shard's, which the offload moves.
    EXPECT_EQ(offloaded.gradients, kept.gradients - (zero == 1 ? 0 : 100)) << "zero " << zero;
    EXPECT_EQ(offloaded.parameters, kept.parameters) << "zero " << zero;
    EXPECT_EQ(offloaded.offloaded, kept.offloaded + 2 * 100 + 2 * 100) << "zero " << zero;
    // The step steps the host's shard: stage 1 no longer copies its piece out of the parameters.
    EXPECT_EQ(offloaded.reduce_buffers, 200) << "zero " << zero;
    EXPECT_EQ(kept.reduce_buffers, zero == 3 ? 200 : 300) << "zero " << zero;
  }
  options.zero = 0;  // nothing is sharded, so nothing moves
  const RankMemory unsharded = predict_memory(profile, balance, 1, schedule, options)[0];
  EXPECT_EQ(unsharded.optimizer_state, 400);
  EXPECT_EQ(unsharded.offloaded, 0);
}

TEST(PredictMemory, RejectsAZeroStageOutsideZeroToThreeAndNoReplicas) {
  const ModelProfile profile = uniform_profile(2, 4, UniformLayer{});
  const auto schedule = schedule::one_f_one_b(2, 4);
  MemoryModelOptions options;
  options.zero = 4;
  EXPECT_THROW(predict_memory(profile, {1, 1}, 1, schedule, options), pipetrain::BadInput);
  options.zero = 0;
  options.data_parallel = 0;
  EXPECT_THROW(predict_memory(profile, {1, 1}, 1, schedule, options), pipetrain::BadInput);
}

}  // namespace
}  // namespace pipetrain::partition
