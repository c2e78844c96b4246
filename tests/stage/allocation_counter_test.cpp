#include "pipetrain/stage/allocation_counter.h"

#include <thread>
#include <vector>

#include <c10/core/CPUAllocator.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace pipetrain {
namespace {

TEST(AllocationCounter, CountsTheBytesOfTensorsAllocatedInsideTheGuardUntilTheyAreFreed) {
  AllocationCounter counter;
  torch::Tensor kept;
  {
    CountAllocations counting(counter);
    kept = torch::empty({10, 25}, torch::kFloat);               // 1000 bytes, kept
    torch::Tensor dropped = torch::empty({7}, torch::kDouble);  // 56 bytes, freed below
    EXPECT_EQ(counter.live_bytes(), 1000 + 56);
  }
  EXPECT_EQ(counter.live_bytes(), 1000);
  EXPECT_EQ(counter.counted_bytes_of(kept), 1000);
  EXPECT_EQ(counter.counted_bytes_of(kept.narrow(0, 2, 3)), 1000) << "a view counts its storage";
  kept = torch::Tensor();
  EXPECT_EQ(counter.live_bytes(), 0);
}

TEST(AllocationCounter, IgnoresAllocationsOutsideTheGuardAndThoseOfAnotherCounter) {
  AllocationCounter counter;
  AllocationCounter other;
  torch::Tensor outside = torch::ones({100});
  torch::Tensor elsewhere;
  {
    CountAllocations counting(other);
    elsewhere = torch::ones({100});
  }
  EXPECT_EQ(counter.live_bytes(), 0);
  EXPECT_EQ(counter.counted_bytes_of(outside), 0);
  EXPECT_EQ(counter.counted_bytes_of(elsewhere), 0);
  EXPECT_EQ(other.counted_bytes_of(elsewhere), 400);
  EXPECT_EQ(counter.counted_bytes_of(torch::Tensor()), 0);
}

TEST(AllocationCounter, CountsOnlyTheThreadThatHoldsTheGuard) {
  AllocationCounter counter;
  CountAllocations counting(counter);
  torch::Tensor from_other_thread;
  std::thread([&] { from_other_thread = torch::ones({64}); }).join();
  EXPECT_EQ(counter.live_bytes(), 0);
}

TEST(AllocationCounter, AFreeOnAnotherThreadLowersTheCount) {
  AllocationCounter counter;
  torch::Tensor t;
  {
    CountAllocations counting(counter);
    t = torch::ones({32, 32});
  }
  ASSERT_EQ(counter.live_bytes(), 32 * 32 * 4);
  std::thread([moved = std::move(t)]() mutable { moved = torch::Tensor(); }).join();
  EXPECT_EQ(counter.live_bytes(), 0);
}

TEST(AllocationCounter, NestedGuardsCountIntoTheInnerOneThenResumeTheOuter) {
  AllocationCounter outer;
  AllocationCounter inner;
  torch::Tensor a, b, c;
  {
    CountAllocations counting_outer(outer);
    a = torch::ones({8});
    {
      CountAllocations counting_inner(inner);
      b = torch::ones({16});
    }
    c = torch::ones({4});
  }
  EXPECT_EQ(outer.live_bytes(), (8 + 4) * 4);
  EXPECT_EQ(inner.live_bytes(), 16 * 4);
}

TEST(AllocationCounter, CountedTensorsComputeAndResizeLikeAnyOther) {
  AllocationCounter counter;
  torch::Tensor x;
  torch::Tensor grad;
  {
    CountAllocations counting(counter);
    x = torch::arange(6, torch::kFloat).requires_grad_();
    auto y = (x * x).sum();
    y.backward();
    grad = x.grad().clone();
    x = x.detach().clone();
    x.resize_({100});
  }
  EXPECT_TRUE(torch::equal(grad, 2 * torch::arange(6, torch::kFloat)));
  EXPECT_EQ(counter.counted_bytes_of(x), 400);
  x = torch::Tensor();
  grad = torch::Tensor();
  EXPECT_EQ(counter.live_bytes(), 0) << "every counted allocation was freed";
}

// CPU convolutions take workspaces with Allocator::raw_allocate, which asserts that a DataPtr's
// context is its data pointer; a stage's forward runs them inside a guard.
TEST(AllocationCounter, RawAllocationsInsideAGuardAreCountedAndFreedByRawDeallocate) {
  AllocationCounter counter;
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* outside = allocator->raw_allocate(64);
  {
    CountAllocations counting(counter);
    void* inside = allocator->raw_allocate(4096);
    EXPECT_EQ(counter.live_bytes(), 4096);
    allocator->raw_deallocate(inside);
    EXPECT_EQ(counter.live_bytes(), 0);
    // Many live blocks at once (the record table grows) and freed in another order.
    std::vector<torch::Tensor> many;
    for (int k = 0; k < 5000; ++k) many.push_back(torch::empty({16}));
    EXPECT_EQ(counter.live_bytes(), 5000 * 64);
    for (size_t k = 0; k < many.size(); k += 2) many[k] = torch::Tensor();
    EXPECT_EQ(counter.live_bytes(), 2500 * 64);
  }
  EXPECT_EQ(counter.live_bytes(), 0);  // `many` is gone
  allocator->raw_deallocate(outside);  // allocated before the guard: the wrapped deleter frees it
  EXPECT_EQ(counter.live_bytes(), 0);
}

TEST(AllocationCounter, AConvolutionRunsInsideTheGuard) {
  AllocationCounter counter;
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(1, 4, 3));
  torch::Tensor out;
  {
    CountAllocations counting(counter);
    out = conv->forward(torch::randn({2, 1, 8, 8}));
  }
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 4, 6, 6}));
  EXPECT_GE(counter.live_bytes(), static_cast<int64_t>(out.numel() * 4));
}

}  // namespace
}  // namespace pipetrain
