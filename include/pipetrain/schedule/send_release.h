// Send release: when a rank may free the buffer of a message it sent to another rank, because
// the schedule alone proves that the receiver has it.
//
// A send's buffer lives until the send completes, and that depends on when the receiver posts
// its receive: timing, not the schedule. But a rank learns, through the messages it receives,
// how far the other ranks have got. When rank r receives a message that rank q sent after q
// had received r's message m (directly, or through a chain of messages in between), m has
// arrived: its send is complete, or completes without anyone doing anything more. So each
// message has a point in its sender's list from which its buffer is certainly free.
//
// released_sends() walks the lowered schedule with vector clocks (one counter per rank of the
// actions it has run): a receive merges the sender's clock at the send. For each remote send
// (SF/SB whose other stage is on another rank) it gives the number of the rank's earlier
// remote sends of the step, counted from its first, that are all proven received at that
// point: a prefix, because a transport completes sends in the order they were posted.
//
//   1F1B, 2 ranks, 4 micro-batches (lowered):
//     rank 0: F0 SF0 | F1 SF1 | RB0 B0 | F2 SF2 | RB1 B1 | F3 SF3 | RB2 B2 | RB3 B3
//     rank 1: RF0 F0 B0 SB0 | RF1 F1 B1 SB1 | RF2 F2 B2 SB2 | RF3 F3 B3 SB3
//   rank 0's SF2 comes after RB0; rank 1 sent gradient 0 after it received activation 0, so
//   activation 0 is proven received: released before SF2 = 1 (SF0 0, SF1 0, SF3 2). Rank 1's
//   SB2 comes after RF2, which rank 0 sent after RB0: gradient 0 is proven received (SB0 0,
//   SB1 0, SB2 1, SB3 2). Either rank holds at most 2 messages at once.
//
// A send window caps what is held when nothing is proven for long: GPipe's stage 0 sends all M
// forwards before it receives anything. With a window of N, before its next send a rank waits
// until its oldest sends but N - 1 have completed, so it holds at most N messages. That wait is
// on a peer: counted here as over when the receiver has run the receive (a posted receive can be
// enough, but not when the message's size changed, as in the first step). A wait for a peer can
// deadlock a schedule that runs with unbounded sends, so released_sends() runs the lists with the
// window (sends wait as above, receives wait for their send) and widens the window until every
// rank finishes. A schedule that deadlocks even without a window is an error.
//
//   GPipe, 2 ranks, 4 micro-batches, window 2: rank 0's sends release 0, 0, 1, 2 (it holds 2;
//   without the window it would hold all 4 until its first backward).
//
// The runtime frees a sent buffer at that point and not before (Transport::release_sends), so
// the bytes a rank holds in sent messages are what the memory model predicts from this
// (partition/memory.h, "send buffers"), whatever the timing.
//
// Thread-safety: pure function. Cost: O(actions * ranks) per window tried.
#pragma once

#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// The send window the runtime uses (runtime/interpreter.h).
constexpr int kSendWindow = 2;

// Per rank r and action index a of `lowered.actions[r]`: for a send to another rank, how many of
// rank r's remote sends of the step before it are freed first: those proven received (see
// above), and beyond them as many of the oldest as keep `window` held after the send (0: no
// window); -1 for every other action. The window widens where `window` would deadlock.
// REQUIRES: a lowered schedule that validate() accepts; throws pipetrain::BadInput for a
// compute-only schedule of several stages, for one whose messages deadlock, and for window < 0.
std::vector<std::vector<int>> released_sends(const Schedule& lowered, int window = kSendWindow);

}  // namespace pipetrain::schedule
