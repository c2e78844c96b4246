// A run's summary as JSON: what `pipetrain train --summary-json` writes and a C++ caller can log --
// the Trainer's TrainSummary, its rates (train/progress.h) and the peak MFU divides by
// (train/device_peak.h).
//
//   {"steps", "seconds", "samples", "tokens", "counted_targets", "samples_per_second",
//    "tokens_per_second", "targets_per_second", "mfu", "peak_flops", "peak_source",
//    "first_loss", "last_loss", "process_peak_bytes"}
//
// "tokens" is what "tokens_per_second" counts (TrainingRate::tokens): for fixed windows, samples x
// window, where TrainSummary::tokens counts none.
//
// Thread-safety: a pure function.
#pragma once

#include <nlohmann/json.hpp>

#include "pipetrain/train/device_peak.h"
#include "pipetrain/train/progress.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::train {

nlohmann::json run_summary_json(const TrainSummary& summary, const TrainingRate& rate,
                                const DevicePeak& peak);

}  // namespace pipetrain::train
