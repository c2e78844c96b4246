// runtime/communication_thread.h: jobs run in submission order on a thread of their own, submit()
// returns before its job runs, drain() waits for them and rethrows a failure once, and what was
// queued behind a failure is skipped; a job run here follows the queue, on the caller's thread.
// Torch-free: compiled on its own (tests/CMakeLists.txt).
#include "pipetrain/runtime/communication_thread.h"

#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace pipetrain {
namespace {

TEST(CommunicationThread, RunsJobsInSubmissionOrderOnAThreadOfItsOwn) {
  CommunicationThread thread;
  EXPECT_FALSE(thread.started());
  std::vector<int> order;  // written by the jobs, read after drain()
  std::vector<std::thread::id> ran_on;
  for (int i = 0; i < 100; ++i) {
    thread.submit([&order, &ran_on, i] {
      order.push_back(i);
      ran_on.push_back(std::this_thread::get_id());
    });
  }
  EXPECT_TRUE(thread.started());
  thread.drain();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  for (const auto& id : ran_on) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(CommunicationThread, SubmitReturnsBeforeItsJobRuns) {
  CommunicationThread thread;
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  bool ran = false;
  // The job cannot end before this thread, after submit() returned, releases it.
  thread.submit([released, &ran] {
    released.wait();
    ran = true;
  });
  go.set_value();
  thread.drain();
  EXPECT_TRUE(ran);
}

TEST(CommunicationThread, AFailureIsRethrownOnceAndWhatWasQueuedBehindItIsSkipped) {
  CommunicationThread thread;
  std::promise<void> go;
  std::shared_future<void> released = go.get_future().share();
  bool behind_ran = false;
  thread.submit([released] {
    released.wait();  // until both jobs below are queued
    throw std::runtime_error("packing bucket 2 failed");
  });
  thread.submit([&behind_ran] { behind_ran = true; });
  go.set_value();
  try {
    thread.drain();
    ADD_FAILURE() << "drain() did not rethrow the job's failure";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "packing bucket 2 failed");
  }
  EXPECT_FALSE(behind_ran);
  EXPECT_NO_THROW(thread.drain());  // once
  bool after_ran = false;
  thread.submit([&after_ran] { after_ran = true; });
  thread.drain();
  EXPECT_TRUE(after_ran);
}

TEST(CommunicationThread, RunHereWaitsForTheQueueAndRunsOnTheCallingThread) {
  CommunicationThread thread;
  std::vector<int> order;  // written by the jobs, read after they ran
  std::thread::id submitted_on, here_on;
  thread.submit_or_run_here(
      [&] {
        // A job that takes a while is what is tested: were run_here not to wait for it, the job
        // below would run first.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        order.push_back(1);
        submitted_on = std::this_thread::get_id();
      },
      /*run_here=*/false);
  thread.submit_or_run_here(
      [&] {
        order.push_back(2);
        here_on = std::this_thread::get_id();
      },
      /*run_here=*/true);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));  // the job here ran after the queued one, and ended
  EXPECT_NE(submitted_on, std::this_thread::get_id());
  EXPECT_EQ(here_on, std::this_thread::get_id());
}

}  // namespace
}  // namespace pipetrain
