// Generated schedules against hand-checked golden files (tests/schedule/golden/*.txt).
//
// Each golden file was compared by eye with the paper's figure before it was committed (the
// figure is named in the file's first comment line and in docs/SCHEDULES.md). A mismatch prints
// both rank x step grids with the first differing cell marked.
//
// To regenerate after an intended change: PIPETRAIN_UPDATE_GOLDEN=1 build/tests/tests_schedule
// --gtest_filter='Golden*', then check the diff against the figures again.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/grid.h"
#include "pipetrain/schedule/text_format.h"

namespace pipetrain::schedule {
namespace {

std::string golden_path(const std::string& file) {
  return std::string(PIPETRAIN_SOURCE_DIR) + "/tests/schedule/golden/" + file;
}

// Empty when equal; otherwise both grids with the first differing cell marked.
std::string compare(const Schedule& expected, const Schedule& actual) {
  const std::size_t ranks = std::max(expected.actions.size(), actual.actions.size());
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::vector<Action> none;
    const auto& want = r < expected.actions.size() ? expected.actions[r] : none;
    const auto& got = r < actual.actions.size() ? actual.actions[r] : none;
    const std::size_t steps = std::max(want.size(), got.size());
    for (std::size_t k = 0; k < steps; ++k) {
      if (k < want.size() && k < got.size() && want[k] == got[k]) continue;
      const std::vector<GridCell> mark = {{static_cast<int>(r), static_cast<int>(k)}};
      return "first difference at rank " + std::to_string(r) + " step " + std::to_string(k) +
             "\nexpected (golden):\n" + render_grid(expected, mark, 0) + "actual (generated):\n" +
             render_grid(actual, mark, 0);
    }
  }
  return "";
}

void expect_golden(const std::string& file, const Schedule& generated, const std::string& figure) {
  if (std::getenv("PIPETRAIN_UPDATE_GOLDEN")) {
    save_schedule(generated, golden_path(file), figure);
  }
  const Schedule golden = load_schedule(golden_path(file));
  const std::string difference = compare(golden, generated);
  EXPECT_TRUE(difference.empty()) << file << ": " << difference;
}

TEST(Golden, GpipeThreeStagesFourMicrobatches) {
  expect_golden("gpipe_k3_m4.txt", make_schedule("gpipe", 3, 4),
                "gpipe K=3 M=4; compare: GPipe (Huang et al. 2019) Figure 2(c), which draws the "
                "backwards in reverse micro-batch order (same timing with equal costs)");
}

TEST(Golden, OneFOneBFourStagesEightMicrobatches) {
  expect_golden("1f1b_k4_m8.txt", make_schedule("1f1b", 4, 8),
                "1f1b K=4 M=8; compare: Megatron-LM (Narayanan et al. 2021) Figure 4 top");
}

TEST(Golden, InterleavedTwoRanksFourMicrobatchesTwoChunks) {
  expect_golden("interleaved_k2_m4_v2.txt", make_schedule("interleaved-1f1b", 2, 4, 2),
                "interleaved-1f1b K=2 M=4 V=2; compare: Megatron-LM (Narayanan et al. 2021) "
                "Figure 4 bottom");
}

TEST(Golden, InterleavedFourRanksEightMicrobatchesTwoChunksAsInMegatronsFigure) {
  expect_golden("interleaved_k4_m8_v2.txt", make_schedule("interleaved-1f1b", 4, 8, 2),
                "interleaved-1f1b K=4 M=8 V=2; compare: Megatron-LM (Narayanan et al. 2021) "
                "Figure 4 bottom (same K, M, V)");
}

TEST(Golden, ZeroBubbleH1ThreeStagesSixMicrobatches) {
  expect_golden("zb_h1_k3_m6.txt", make_schedule("zb-h1", 3, 6),
                "zb-h1 K=3 M=6; compare: Zero Bubble PP (Qi et al. 2024) Figure 3 (ZB-H1, drawn "
                "there for 4 stages)");
}

TEST(Golden, MismatchReportMarksTheFirstDifferingCell) {
  const Schedule a = parse_schedule("0F0,0B0\n1F0,1B0\n");
  const Schedule b = parse_schedule("0F0,0B0\n1B0,1F0\n");
  const std::string report = compare(a, b);
  EXPECT_NE(report.find("rank 1 step 0"), std::string::npos) << report;
  EXPECT_NE(report.find(">1F0<"), std::string::npos) << report;
  EXPECT_NE(report.find(">1B0<"), std::string::npos) << report;
  EXPECT_TRUE(compare(a, a).empty());
}

}  // namespace
}  // namespace pipetrain::schedule
