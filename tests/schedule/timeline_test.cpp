// Timeline writers: SVG Gantt, Chrome trace JSON, time grid.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "pipetrain/schedule/chrome_trace.h"
#include "pipetrain/schedule/generators.h"
#include "pipetrain/schedule/grid.h"
#include "pipetrain/schedule/simulate.h"
#include "pipetrain/schedule/timeline_svg.h"

namespace pipetrain::schedule {
namespace {

Timeline two_events() {
  Timeline t;
  t.title = "measured <run>";
  t.num_ranks = 2;
  t.time_unit = "ms";
  t.microseconds_per_unit = 1000;
  t.events.push_back(make_event(0, {0, Op::kForward, 3}, 0.0, 1.5));
  t.events.push_back(make_event(1, {1, Op::kBackwardWeight, 3}, 2.0, 2.5));
  return t;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(TimelineSvg, OneBoxPerEventColouredByOpWithLegendAxisAndEscapedTitle) {
  const std::string svg = render_svg(simulate(zero_bubble_h1(3, 4)).timeline("zb-h1"));
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(count(svg, "<title>"), 3u * 4 * 3);
  EXPECT_NE(svg.find("F forward"), std::string::npos);
  EXPECT_NE(svg.find("I input grad"), std::string::npos);
  EXPECT_NE(svg.find("W weight grad"), std::string::npos);
  EXPECT_EQ(svg.find("B backward"), std::string::npos);  // zb-h1 has no full backward
  EXPECT_NE(svg.find("time (units)"), std::string::npos);
  const std::string measured = render_svg(two_events());
  EXPECT_NE(measured.find("measured &lt;run&gt;"), std::string::npos);
  EXPECT_NE(measured.find("time (ms)"), std::string::npos);
}

// A long title (the measured timelines' titles name the run) widens the picture instead of
// running past its right edge.
TEST(TimelineSvg, TheWidthFitsALongTitle) {
  auto width_of = [](const std::string& svg) {
    const auto at = svg.find("width=\"") + 7;
    return std::stod(svg.substr(at, svg.find('"', at) - at));
  };
  const Timeline short_title = simulate(zero_bubble_h1(2, 2)).timeline("zb-h1");
  const Timeline long_title = simulate(zero_bubble_h1(2, 2)).timeline(std::string(200, 'x'));
  EXPECT_GE(width_of(render_svg(long_title)), 70 + 200 * 9.0);
  EXPECT_LT(width_of(render_svg(short_title)), width_of(render_svg(long_title)));
}

TEST(ChromeTrace, EventsAreCompleteEventsInMicroseconds) {
  const nlohmann::json trace = nlohmann::json::parse(render_chrome_trace(two_events()));
  int complete = 0;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "X") continue;
    ++complete;
    if (event["name"] == "1W3") {
      EXPECT_DOUBLE_EQ(event["ts"].get<double>(), 2000.0);
      EXPECT_DOUBLE_EQ(event["dur"].get<double>(), 500.0);
      EXPECT_EQ(event["tid"], 1);
      EXPECT_EQ(event["args"]["op"], "W");
    }
  }
  EXPECT_EQ(complete, 2);
}

TEST(ChromeTrace, SaveWritesAFileThatParses) {
  const std::string path = ::testing::TempDir() + "/pipetrain_trace_test.json";
  save_chrome_trace(two_events(), path);
  std::ifstream in(path);
  EXPECT_NO_THROW(nlohmann::json::parse(in));
  std::remove(path.c_str());
}

TEST(TimeGrid, ShowsIdleSlotsAsDots) {
  const std::string grid = render_time_grid(simulate(gpipe(2, 1)).timeline());
  // rank 1 idles during rank 0's forward (slot 0): gpipe K=2 M=1 with F=1, B=2.
  EXPECT_NE(grid.find("rank 1   . 1F0 1B0 1B0"), std::string::npos) << grid;
  EXPECT_NE(grid.find("rank 0 0F0   .   .   . 0B0 0B0"), std::string::npos) << grid;
}

}  // namespace
}  // namespace pipetrain::schedule
