// A run's summary as JSON (train/run_summary.h).
#include "pipetrain/train/run_summary.h"

namespace pipetrain::train {

nlohmann::json run_summary_json(const TrainSummary& summary, const TrainingRate& rate,
                                const DevicePeak& peak) {
  return {{"steps", summary.steps},
          {"seconds", summary.seconds},
          {"samples", summary.samples},
          {"tokens", rate.tokens},  // also fixed windows' (samples x window), as tokens_per_second
          {"counted_targets", summary.counted_targets},
          {"samples_per_second", rate.samples_per_second},
          {"tokens_per_second", rate.tokens_per_second},
          {"targets_per_second", rate.targets_per_second},
          {"mfu", rate.mfu},
          {"peak_flops", peak.flops},
          {"peak_source", peak.source},
          {"first_loss", summary.first_loss},
          {"last_loss", summary.last_loss},
          {"process_peak_bytes", summary.process_peak_bytes},
          {"step_seconds", summary.step_seconds}};
}

}  // namespace pipetrain::train
