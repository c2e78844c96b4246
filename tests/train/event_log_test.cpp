// train/event_log.h: a rank's actions, collectives and counts survive the trip to rank 0
// (serialize, deserialize, merge), a damaged log is refused, and the Chrome trace puts each rank's
// collectives on a row of their own under the ranks' rows and its counts in counter tracks.
#include "pipetrain/train/event_log.h"

#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "pipetrain/base/error.h"

namespace pipetrain::train {
namespace {

EventLog two_ranks() {
  EventLog log;
  log.add(3, 1000.0, {{0, {0, schedule::Op::kForward, 1}, 0, 50}}, 0);
  log.add_collectives(3, 1000.0, {{0, CollectiveKind::kAllGather, 0, -10.0, 10.0}}, 0);
  EventLog other;
  other.add(3, 1000.0, {{0, {1, schedule::Op::kBackward, 1}, 60, 120}}, 1);
  other.add_collectives(3, 1000.0, {{0, CollectiveKind::kReduceScatter, 1, 120.0, 200.0, 4096}}, 1);
  other.add_counts({3, 1, 1250.0, 2, {5, 0, 11}});  // layer 2's tokens per expert, on rank 1
  log.merge(EventLog::deserialize(other.serialize()));
  return log;
}

TEST(EventLog, ActionsAndCollectivesSurviveSerializationAndMerge) {
  const EventLog log = EventLog::deserialize(two_ranks().serialize());
  ASSERT_EQ(log.events().size(), 2u);
  ASSERT_EQ(log.collectives().size(), 2u);
  EXPECT_EQ(log.events()[1].event.rank, 1);
  EXPECT_EQ(log.events()[1].event.action.op, schedule::Op::kBackward);
  EXPECT_DOUBLE_EQ(log.events()[1].event.end_us, 1120.0);
  const StepCollective& c = log.collectives()[1];
  EXPECT_EQ(c.step, 3);
  EXPECT_EQ(c.event.rank, 1);
  EXPECT_EQ(c.event.kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(c.event.stage, 1);
  EXPECT_DOUBLE_EQ(c.event.start_us, 1120.0);
  EXPECT_DOUBLE_EQ(c.event.end_us, 1200.0);
  EXPECT_EQ(c.event.bytes, 4096);
  EXPECT_EQ(log.collectives()[0].event.bytes, -1);  // not recorded
  ASSERT_EQ(log.counts().size(), 1u);
  EXPECT_EQ(log.counts()[0].rank, 1);
  EXPECT_EQ(log.counts()[0].layer, 2);
  EXPECT_DOUBLE_EQ(log.counts()[0].time_us, 1250.0);
  EXPECT_EQ(log.counts()[0].values, (std::vector<int64_t>{5, 0, 11}));
}

TEST(EventLog, ADamagedLogIsRefused) {
  std::vector<char> bytes = two_ranks().serialize();
  bytes.pop_back();
  EXPECT_THROW(EventLog::deserialize(bytes), TransportFailure);
  EXPECT_THROW(EventLog::deserialize(std::vector<char>(3, 0)), TransportFailure);
  std::vector<char> huge(8, 0);
  huge[6] = 1;  // a count of actions far beyond the bytes
  EXPECT_THROW(EventLog::deserialize(huge), TransportFailure);
  std::vector<char> wrapping(8 + 48, 0);  // a count whose bytes overflow 64 bits
  wrapping[7] = 0x10;
  EXPECT_THROW(EventLog::deserialize(wrapping), TransportFailure);
  // An action or collective of a kind that does not exist (the op field, the kind field).
  EventLog one;
  one.add(0, 0.0, {{0, {0, schedule::Op::kForward, 0}, 0, 1}}, 0);
  std::vector<char> bad_op = one.serialize();
  bad_op[8 + 16] = 99;  // PackedEvent: step (8), rank, stage, then op
  EXPECT_THROW(EventLog::deserialize(bad_op), TransportFailure);
  EventLog collective;
  collective.add_collectives(0, 0.0, {{0, CollectiveKind::kAllGather, 0, 0, 1}}, 0);
  std::vector<char> bad_kind = collective.serialize();
  bad_kind[8 + 8 + 12] = 7;  // no action; PackedCollective: step (8), rank, then kind
  EXPECT_THROW(EventLog::deserialize(bad_kind), TransportFailure);
  // Counts whose values run past the end.
  EventLog counted;
  counted.add_counts({0, 0, 0.0, 0, {1, 2}});
  std::vector<char> short_counts = counted.serialize();
  short_counts.resize(short_counts.size() - 4);
  EXPECT_THROW(EventLog::deserialize(short_counts), TransportFailure);
}

TEST(EventLog, TheChromeTraceDrawsEachRanksCollectivesOnTheirOwnRow) {
  std::string dir = ::testing::TempDir() + "pipetrain_event_log_XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  two_ranks().write_chrome_trace(dir + "/trace.json", 2);
  std::ifstream file(dir + "/trace.json");
  const nlohmann::json trace = nlohmann::json::parse(file);
  std::map<int, std::string> rows;
  std::map<std::string, int> row_of;  // event name -> tid
  std::map<std::string, nlohmann::json> args_of;
  std::map<std::string, nlohmann::json> counters;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "C") counters[e["name"].get<std::string>()] = e;
    if (e["ph"] == "M") rows[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["ph"] == "X") row_of[e["name"].get<std::string>()] = e["tid"].get<int>();
    if (e["ph"] == "X") args_of[e["name"].get<std::string>()] = e["args"];
  }
  // A collective's bytes where they were recorded, and no figure where they were not.
  EXPECT_EQ(args_of.at("reduce-scatter s1").value("bytes", int64_t{-2}), 4096);
  EXPECT_FALSE(args_of.at("all-gather s0").contains("bytes"));
  EXPECT_EQ(rows[0], "rank 0");
  EXPECT_EQ(rows[2], "rank 0 collectives");
  EXPECT_EQ(rows[3], "rank 1 collectives");
  EXPECT_EQ(row_of.at("all-gather s0"), 2);
  EXPECT_EQ(row_of.at("reduce-scatter s1"), 3);
  EXPECT_EQ(row_of.at("0F1"), 0);
  // Counts: a counter track per rank and layer, a series per expert, at its time from the origin.
  ASSERT_EQ(counters.count("rank 1 layer 2 tokens per expert"), 1u);
  const nlohmann::json& c = counters.at("rank 1 layer 2 tokens per expert");
  EXPECT_EQ(c["args"]["expert 2"].get<double>(), 11);
  EXPECT_DOUBLE_EQ(c["ts"].get<double>(), 1250.0 - 1000.0);  // from the first action
}

}  // namespace
}  // namespace pipetrain::train
