// Moving a range of memory larger than a buffer to and from a SwapFile region, slice by slice
// through the bounded pool (offload/aligned_buffers.h): what lets a tensor of any size live in a
// file while host memory holds only the pool. Each slice is a buffer's worth; up to
// `most_in_flight` slices are in flight at once (copies into and out of the buffers overlap the
// transfers of the others), and never more than the pool lends.
//
// The memory given may be anywhere and unaligned (the buffers are what the file sees). A region
// written by stream_to_file reads back with stream_from_file at the same offset and length.
//
// Torch-free (part of pipetrain::schedule). Thread-safety: each call on one thread; several calls
// may share a pool. A call that holds none of the pool's buffers waits for one, so the calling
// thread must not hold them all itself.
#pragma once

#include <cstdint>

#include "pipetrain/offload/aligned_buffers.h"
#include "pipetrain/offload/swap_file.h"

namespace pipetrain::offload {

// Writes `bytes` of `source` to `file` at `offset` (a region reserve() returned, at least that
// long). Returns when every slice is written; throws pipetrain::FileError as FileIo does.
void stream_to_file(SwapFile& file, int64_t offset, const void* source, int64_t bytes,
                    AlignedBuffers& buffers, int most_in_flight = 2);
// Reads `bytes` at `offset` of `file` into `destination`.
void stream_from_file(SwapFile& file, int64_t offset, void* destination, int64_t bytes,
                      AlignedBuffers& buffers, int most_in_flight = 2);

}  // namespace pipetrain::offload
