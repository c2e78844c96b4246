// Sharded checkpoints (train/sharded_checkpoint.h) in one process: four "ranks" (tp 2 x dp 2)
// write their parts, any other cut reads them back exactly, and every broken file is refused
// naming the file and the tensor.
#include "pipetrain/train/sharded_checkpoint.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain::train {
namespace sharded_checkpoint_test {
namespace fs = std::filesystem;

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "pipetrain-sharded-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~ScratchDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// "w" [8, 6] is cut by rows over the tensor-parallel group; "norm" [6] and the buffer are whole.
TensorParallelSlice rows_split(int rank, int size) {
  return {[](const std::string& name) -> std::optional<parallel::TensorSplit> {
            if (name == "w") return parallel::TensorSplit{0, 1};
            return std::nullopt;
          },
          rank, size};
}

struct Globals {
  torch::Tensor w = torch::randn({8, 6}, torch::kFloat64);
  torch::Tensor norm = torch::randn({6});
  torch::Tensor w_avg = torch::randn({8, 6}, torch::kFloat64);
  torch::Tensor norm_avg = torch::randn({6});
  torch::Tensor buffer = torch::arange(5, torch::kFloat32);
  torch::Tensor rng = torch::randint(0, 255, {40}, torch::kUInt8);
};

// Rank (tp t, replica d)'s part, as a trainer captures it.
Checkpoint part_of(const Globals& g, int t, int tp) {
  Checkpoint part;
  const int64_t rows = 8 / tp;
  part.parameters["w"] = g.w.narrow(0, t * rows, rows);
  part.parameters["norm"] = g.norm;
  part.buffers["running"] = g.buffer;
  part.optimizer = "adam";
  part.optimizer_state["w"] = {{"exp_avg", g.w_avg.narrow(0, t * rows, rows)},
                               {"step", torch::tensor(int64_t{3})}};
  part.optimizer_state["norm"] = {{"exp_avg", g.norm_avg}, {"step", torch::tensor(int64_t{3})}};
  part.stage_rng_states[0] = g.rng;
  return part;
}

// Writes step `step` of `dir` as tp 2 x dp 2 ranks would; returns the step directory.
std::string write_four_ranks(const Globals& g, const std::string& dir, int64_t step, int keep = 0) {
  const std::string partial = sharded_step_directory(dir, step) + ".tmp";
  fs::create_directories(partial);
  std::vector<std::pair<std::string, std::map<std::string, io::ShardTensor>>> files;
  for (int rank = 0; rank < 4; ++rank) {
    const int t = rank % 2, d = rank / 2;
    ShardPlacement placement{rows_split(t, 2), d, 2};
    const std::vector<ShardPieceSource> pieces =
        rank_pieces(part_of(g, t, 2), {}, placement, rank == 0);
    const std::string name = "rank-0000" + std::to_string(rank) + ".safetensors";
    files.emplace_back(name, write_shard_file(partial + "/" + name, pieces).tensors);
  }
  commit_sharded_checkpoint(
      dir, step, partial,
      make_shard_index(files, {{"step", step}, {"optimizer", "adam"}}, {{"tp", 2}, {"dp", 2}}),
      keep);
  return sharded_step_directory(dir, step);
}

TEST(ShardedCheckpoint, FourRanksWriteEveryElementOnceAndAnyCutReadsItBack) {
  torch::manual_seed(0);
  const Globals g;
  ScratchDir dir;
  const std::string step = write_four_ranks(g, dir.path(), 5);
  const ShardedCheckpoint c = ShardedCheckpoint::open(dir.path());  // through `latest`
  EXPECT_EQ(c.directory(), step);
  // Whole: bit for bit what the ranks held.
  const Checkpoint whole = read_whole_checkpoint(c);
  EXPECT_EQ(whole.step, 5);
  EXPECT_TRUE(torch::equal(whole.parameters.at("w"), g.w));
  EXPECT_TRUE(torch::equal(whole.parameters.at("norm"), g.norm));
  EXPECT_TRUE(torch::equal(whole.buffers.at("running"), g.buffer));
  EXPECT_TRUE(torch::equal(whole.optimizer_state.at("w").at("exp_avg"), g.w_avg));
  EXPECT_EQ(whole.optimizer_state.at("norm").at("step").item<int64_t>(), 3);
  EXPECT_TRUE(torch::equal(whole.stage_rng_states.at(0), g.rng));
  // The replicated tensors once, not once per rank: 8x6 doubles and 6 floats, twice (values and
  // exp_avg), the buffer, two steps, the stream.
  int64_t bytes = 0;
  for (const auto& [name, tensor] : c.index().tensors)
    bytes += static_cast<int64_t>(tensor.bytes());
  EXPECT_EQ(bytes, 2 * (48 * 8 + 6 * 4) + 5 * 4 + 2 * 8 + 40);
  // A rank of tp 4 reads its rows only, in the model's form.
  for (int t = 0; t < 4; ++t) {
    NamedTensors parameters, buffers;
    parameters.insert("w", torch::zeros({2, 6}, torch::kFloat64));
    parameters.insert("norm", torch::zeros({6}));
    buffers.insert("running", torch::zeros({5}));
    const Checkpoint rank = read_rank_checkpoint(c, parameters, buffers, rows_split(t, 4));
    EXPECT_TRUE(torch::equal(rank.parameters.at("w"), g.w.narrow(0, 2 * t, 2))) << t;
    EXPECT_TRUE(
        torch::equal(rank.optimizer_state.at("w").at("exp_avg"), g.w_avg.narrow(0, 2 * t, 2)))
        << t;
    EXPECT_TRUE(torch::equal(rank.optimizer_state.at("norm").at("exp_avg"), g.norm_avg)) << t;
  }
  const std::string info = describe_sharded_checkpoint(dir.path());
  EXPECT_NE(info.find("step 5"), std::string::npos) << info;
  EXPECT_NE(info.find("rank-00003.safetensors"), std::string::npos) << info;
}

// A ZeRO rank resumes reading only its ranges of the optimizer state: by range, the state is not
// read with the box (meta tensors), and optimizer_range gives any span of the rank's box (here a
// tp 4 rank's rows of "w", which the four pieces of two tp-2 ranks' files hold), bit for bit; the
// whole through optimizer_state_value; ranges outside the box refused.
TEST(ShardedCheckpoint, AZeroRankReadsOnlyTheRangesOfTheOptimizerStateItKeeps) {
  torch::manual_seed(0);
  const Globals g;
  ScratchDir dir;
  write_four_ranks(g, dir.path(), 5);
  const ShardedCheckpoint c = ShardedCheckpoint::open(dir.path());
  for (int t = 0; t < 4; ++t) {
    NamedTensors parameters, buffers;
    parameters.insert("w", torch::zeros({2, 6}, torch::kFloat64));
    parameters.insert("norm", torch::zeros({6}));
    buffers.insert("running", torch::zeros({5}));
    const Checkpoint rank =
        read_rank_checkpoint(c, parameters, buffers, rows_split(t, 4), /*by_range=*/true);
    const torch::Tensor& unread = rank.optimizer_state.at("w").at("exp_avg");
    EXPECT_TRUE(unread.is_meta()) << t;
    EXPECT_EQ(unread.sizes(), torch::IntArrayRef({2, 6})) << t;
    EXPECT_EQ(unread.scalar_type(), torch::kFloat64) << t;
    EXPECT_EQ(rank.optimizer_state.at("w").at("step").item<int64_t>(), 3) << t;  // read
    ASSERT_TRUE(rank.optimizer_range) << t;
    const torch::Tensor box = g.w_avg.narrow(0, 2 * t, 2).reshape({-1});
    for (const auto& [begin, length] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 12}, {0, 5}, {5, 7}, {3, 1}, {11, 1}, {4, 0}}) {
      const torch::Tensor part = rank.optimizer_range("w", "exp_avg", begin, length);
      EXPECT_TRUE(torch::equal(part, box.narrow(0, begin, length)))
          << t << " [" << begin << ", " << begin + length << ")";
    }
    EXPECT_TRUE(torch::equal(optimizer_state_value(rank, "w", "exp_avg"), box.view({2, 6}))) << t;
    EXPECT_TRUE(
        torch::equal(rank.optimizer_range("norm", "exp_avg", 2, 3), g.norm_avg.narrow(0, 2, 3)))
        << t;
    EXPECT_ANY_THROW(rank.optimizer_range("w", "exp_avg", 10, 3));
    EXPECT_THROW(rank.optimizer_range("other", "exp_avg", 0, 1), CheckpointError);
  }
  // Without a reader, a meta tensor's value is refused, not made up.
  Checkpoint unread;
  unread.optimizer_state["w"]["exp_avg"] = torch::empty({2}, torch::kMeta);
  EXPECT_THROW(optimizer_state_value(unread, "w", "exp_avg"), CheckpointError);
}

// What the ranks of a model that is not the checkpoint's are told.
TEST(ShardedCheckpoint, RefusesAModelThatIsNotTheCheckpoints) {
  torch::manual_seed(1);
  const Globals g;
  ScratchDir dir;
  write_four_ranks(g, dir.path(), 2);
  const ShardedCheckpoint c = ShardedCheckpoint::open(dir.path());
  auto read = [&](NamedTensors parameters) {
    NamedTensors buffers;
    buffers.insert("running", torch::zeros({5}));
    return read_rank_checkpoint(c, parameters, buffers, rows_split(0, 1));
  };
  NamedTensors extra;
  extra.insert("w", torch::zeros({8, 6}, torch::kFloat64));
  extra.insert("norm", torch::zeros({6}));
  extra.insert("head", torch::zeros({6}));
  EXPECT_THROW(
      {
        try {
          read(extra);
        } catch (const io::ShardIndexError& e) {
          EXPECT_NE(std::string(e.what()).find("missing from the checkpoint: head"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      io::ShardIndexError);
  NamedTensors fewer;
  fewer.insert("w", torch::zeros({8, 6}, torch::kFloat64));
  EXPECT_THROW(
      {
        try {
          read(fewer);
        } catch (const io::ShardIndexError& e) {
          EXPECT_EQ(e.tensor(), "param/norm");
          throw;
        }
      },
      io::ShardIndexError);
  NamedTensors other_shape;
  other_shape.insert("w", torch::zeros({8, 5}, torch::kFloat64));
  other_shape.insert("norm", torch::zeros({6}));
  EXPECT_THROW(read(other_shape), io::ShardIndexError);
}

// A piece whose bytes changed, a file cut short, a file gone: refused naming the file.
TEST(ShardedCheckpoint, RefusesCorruptTruncatedAndMissingFiles) {
  torch::manual_seed(2);
  const Globals g;
  ScratchDir dir;
  const std::string step = write_four_ranks(g, dir.path(), 4);
  const std::string file = step + "/rank-00001.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x5a');
  }
  try {
    read_whole_checkpoint(ShardedCheckpoint::open(step));
    ADD_FAILURE() << "a changed byte was read";
  } catch (const io::ShardIndexError& e) {
    EXPECT_EQ(e.file(), file);
    EXPECT_FALSE(e.tensor().empty());
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  fs::resize_file(file, fs::file_size(file) - 16);
  try {
    ShardedCheckpoint::open(step);
    ADD_FAILURE() << "a truncated file was opened";
  } catch (const io::ShardIndexError& e) {
    EXPECT_EQ(e.file(), file);
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove(file);
  try {
    ShardedCheckpoint::open(step);
    ADD_FAILURE() << "a missing file was opened";
  } catch (const io::ShardIndexError& e) {
    EXPECT_EQ(e.file(), file);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

// `latest` moves only to a complete checkpoint; what an interrupted save left is never read, and
// the next save clears it; --keep-checkpoints keeps the newest.
TEST(ShardedCheckpoint, LatestNamesOnlyCompleteCheckpoints) {
  torch::manual_seed(3);
  const Globals g;
  ScratchDir dir;
  write_four_ranks(g, dir.path(), 2);
  // An interrupted save of step 4: pieces, no index.
  fs::create_directories(dir.path() + "/step-4.tmp");
  std::ofstream(dir.path() + "/step-4.tmp/rank-00000.safetensors") << "half";
  EXPECT_EQ(ShardedCheckpoint::open(dir.path()).index().state["step"], 2);
  write_four_ranks(g, dir.path(), 6, /*keep=*/1);
  EXPECT_EQ(ShardedCheckpoint::open(dir.path()).index().state["step"], 6);
  EXPECT_FALSE(fs::exists(dir.path() + "/step-4.tmp"));
  EXPECT_FALSE(fs::exists(dir.path() + "/step-2"));
  // The same step written again replaces it.
  write_four_ranks(g, dir.path(), 6, /*keep=*/1);
  EXPECT_TRUE(fs::exists(dir.path() + "/step-6/index.json"));
  EXPECT_FALSE(fs::exists(dir.path() + "/step-6.old"));
}

// Regression: `--resume DIR` where the only save was interrupted (DIR/step-1.tmp, no `latest`)
// read DIR as a single file and said "not a pipetrain checkpoint (unreadable torch pickle ...
// miniz error)". It names the interrupted write; a directory of complete checkpoints that no
// `latest` names, or of nothing, is said to be so.
TEST(ShardedCheckpoint, ResumingFromADirectoryWhoseOnlyWriteWasInterruptedNamesThatWrite) {
  auto error_of = [](const std::function<void()>& load) -> std::string {
    try {
      load();
    } catch (const CheckpointError& error) {
      return error.what();
    }
    return "no CheckpointError";
  };
  ScratchDir dir;
  fs::create_directories(dir.path() + "/step-1.tmp");
  std::ofstream(dir.path() + "/step-1.tmp/rank-00000.safetensors") << "half";
  torch::nn::Linear model(2, 2);
  const std::string interrupted = "'" + dir.path() +
                                  "' holds no complete checkpoint: the write of step 1 was "
                                  "interrupted (" +
                                  dir.path() + "/step-1.tmp), and none before it was completed";
  std::string message = error_of([&] { resume_checkpoint(dir.path(), *model, "adam"); });
  EXPECT_NE(message.find(interrupted), std::string::npos) << message;
  EXPECT_EQ(message.find("pickle"), std::string::npos) << message;
  message = error_of([&] { load_any_checkpoint(dir.path()); });
  EXPECT_NE(message.find(interrupted), std::string::npos) << message;
  // Two interrupted writes and a complete checkpoint that `latest` no longer names (written
  // first: its commit clears what interrupted writes left).
  torch::manual_seed(4);
  write_four_ranks(Globals(), dir.path(), 2);
  fs::remove(dir.path() + "/latest");
  fs::create_directories(dir.path() + "/step-1.tmp");
  fs::create_directories(dir.path() + "/step-3.tmp");
  message = error_of([&] { load_any_checkpoint(dir.path()); });
  EXPECT_NE(message.find("the writes of steps 1 and 3 were interrupted (" + dir.path() +
                         "/step-1.tmp, " + dir.path() +
                         "/step-3.tmp); no latest names a "
                         "complete one, but " +
                         dir.path() + "/step-2 is one: give its path"),
            std::string::npos)
      << message;
  ScratchDir empty;
  message = error_of([&] { load_any_checkpoint(empty.path()); });
  EXPECT_NE(message.find("'" + empty.path() +
                         "' holds no complete checkpoint (no index.json, no latest)"),
            std::string::npos)
      << message;
}

}  // namespace sharded_checkpoint_test
}  // namespace pipetrain::train
