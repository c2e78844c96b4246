// Fuzzes the config-file reader (train/config_file.h, `--config run.json`): the file's JSON
// becomes flags; a value that cannot be a flag is a ConfigError.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fuzz_check.h"
#include "pipetrain/train/config_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const nlohmann::json config =
      nlohmann::json::parse(fuzz::as_text(data, size), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;  // read_config_file reports JSON syntax itself
  fuzz::expect_only_pipetrain_errors([&] { train::config_to_arguments(config, {"--lr"}); });
  return 0;
}
