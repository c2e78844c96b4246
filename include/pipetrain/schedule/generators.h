// Schedule generators: one pure function per schedule family, and make_schedule() to pick one by
// name. Each returns a compute-only Schedule (F/B/I/W, no sends or receives) with stage_rank
// filled in; lower() (lower.h) adds the communication.
//
//   gpipe             fill-drain: all forwards, then all backwards (M = 1: naive model parallel)
//   1f1b              PipeDream-flush: K-r-1 warm-up forwards, then one forward / one backward
//   interleaved-1f1b  Megatron's interleaved 1F1B: V virtual stages per rank, stage j on rank j%K
//   zb-h1             Zero Bubble H1: backward split into I (input grad) and W (weight grad);
//                     W's fill the bubbles; at most min(K, M) micro-batches in flight per rank
//   zb-h2             Zero Bubble H2: as zb-h1 with up to 2K-1 in flight: no bubble in between
//   zb-v              Zero Bubble V: two chunks per rank in a V (rank r: stages r, 2K-1-r),
//                     1F1B's memory, no bubble in between when F = I = W
//   v-half, v-min     the V shape at about a half and a third of 1F1B's memory
//   interleaved-zb    interleaved 1F1B's placement with the split backward, 1F1B's memory
//   looped-bfs        V chunks placed as interleaved, breadth first: every micro-batch per chunk
//   dualpipev         DeepSeek's DualPipeV: the V shape with forward/backward pairs
//   zb-auto           the auto scheduler (auto_schedule.h) at 1F1B's memory; measured costs and
//                     other limits through auto_schedule() itself
//
// docs/SCHEDULES.md draws each one and gives its bubble and memory formulas.
//
// Thread-safety: pure functions.
// REQUIRES: ranks >= 1, microbatches >= 1, virtual_stages >= 1 (pipetrain::BadInput otherwise,
// naming the value). Every family but dualpipev accepts any M >= 1, including M < K.
#pragma once

#include <string>
#include <vector>

#include "pipetrain/schedule/schedule.h"

namespace pipetrain::schedule {

// K ranks = K stages; rank r: F0 .. F(M-1), then B0 .. B(M-1).
Schedule gpipe(int ranks, int microbatches);

// K ranks = K stages; rank r: min(K-r-1, M) warm-up forwards, then alternating F / B, then the
// remaining backwards. At most min(K-r, M) micro-batches in flight on stage r.
Schedule one_f_one_b(int ranks, int microbatches);

// K ranks, S = K*V stages, stage j on rank j % K. Micro-batches go through in rounds of K
// (the last round may be shorter, and M < K is one short round).
Schedule interleaved_one_f_one_b(int ranks, int microbatches, int virtual_stages);

// K ranks = K stages, backward split into I and W (zero-bubble H1).
Schedule zero_bubble_h1(int ranks, int microbatches);

// K ranks = K stages, I and W split, at most 2K-1 micro-batches in flight per rank.
Schedule zero_bubble_h2(int ranks, int microbatches);

// K ranks, 2K stages in the V shape (auto_schedule.h's v_placement), I and W split, at most K
// micro-batches' worth of activations per rank.
Schedule zero_bubble_v(int ranks, int microbatches);

// The V placement searched by the auto scheduler at the limits v_half_limit(K) and v_min_limit(K).
Schedule v_half(int ranks, int microbatches);
Schedule v_min(int ranks, int microbatches);
double v_half_limit(int ranks);
double v_min_limit(int ranks);

// K ranks, S = K*V stages placed as interleaved 1F1B, I and W split, at most K micro-batches'
// worth of activations per rank (1F1B's peak, as torch's ScheduleInterleavedZeroBubble).
Schedule interleaved_zero_bubble(int ranks, int microbatches, int virtual_stages);

// K ranks, S = K*V stages placed as interleaved 1F1B, breadth first.
Schedule looped_bfs(int ranks, int microbatches, int virtual_stages);

// K ranks, 2K stages in the V shape; see dualpipev.cpp. REQUIRES: K even, M >= 2K.
Schedule dualpipe_v(int ranks, int microbatches);

// The auto scheduler at equal costs (F = I = W) and 1F1B's memory, the best of its candidates.
Schedule zero_bubble_auto(int ranks, int microbatches);

// The names make_schedule() accepts, in a stable order: gpipe, 1f1b, interleaved-1f1b, zb-h1,
// then the rest in the order of the list above.
const std::vector<std::string>& schedule_names();

// Chunks per rank a family uses when the caller does not say: 2 for the V-shaped ones (which
// take no other), for interleaved-zb and for looped-bfs; 1 for the rest (interleaved-1f1b with
// V = 1 is plain 1F1B).
int default_virtual_stages(const std::string& name);

// True for the families whose V must be 2 with the V placement: zb-v, v-half, v-min, dualpipev.
bool is_v_shaped(const std::string& name);

// Empty when make_schedule(name, ranks, microbatches, virtual_stages) takes that shape; else why
// not, naming the smallest setting that would do (a V-shaped family with V != 2, V != 1 on a
// family without chunks, dualpipev with an odd K or M < 2K). Unknown names and counts < 1 are
// make_schedule's to report. Cheap: nothing is built.
std::string shape_error(const std::string& name, int ranks, int microbatches, int virtual_stages);

// Forward-only (inference) schedule over the ranks and stage placement of `placement`: every rank
// runs its stages' F in (micro-batch, stage) order, which is the order of the dependencies, so
// blocking receives cannot deadlock. Compute-only (lower() adds the communication).
Schedule forward_only(const Schedule& placement, int microbatches);

// Builds the named schedule. Throws pipetrain::BadInput for an unknown name (listing the valid
// names), for ranks/microbatches/virtual_stages < 1, for virtual_stages != 1 on a family that
// has no virtual stages, for virtual_stages != 2 on a V-shaped one, and for a family's own
// constraint (dualpipev: an even K); each message names the smallest setting that would do.
Schedule make_schedule(const std::string& name, int ranks, int microbatches,
                       int virtual_stages = 1);

}  // namespace pipetrain::schedule
