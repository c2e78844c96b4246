// Fuzzes the checkpoint loader (train/checkpoint.h, `--resume FILE`, a restart's checkpoint.pt):
// the bytes of a file, read as a pipetrain checkpoint. A file that is not one -- not a torch
// pickle, not a dict, a field of the wrong type or shape -- is a CheckpointError naming it.
// Built only with LibTorch (scripts/fuzz builds it in build-fuzz-torch/).
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "pipetrain/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  fuzz::expect_only_pipetrain_errors([&] {
    (void)train::deserialize_checkpoint(std::string(fuzz::as_text(data, size)), "fuzz.pt");
  });
  return 0;
}
