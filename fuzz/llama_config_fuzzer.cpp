// Fuzzes the Llama config reader (models/llama_config.h, a Hugging Face --model DIR's
// config.json): any JSON is read into a config whose shape check_llama_config accepts, or refused
// with a ModelConfigError naming the key.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "fuzz_check.h"
#include "pipetrain/models/llama_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pipetrain;
  const nlohmann::json json =
      nlohmann::json::parse(fuzz::as_text(data, size), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;  // read_llama_config reports JSON syntax itself
  fuzz::expect_only_pipetrain_errors([&] {
    const models::LlamaConfig config = models::parse_llama_config(json, "fuzz/config.json");
    models::check_llama_config(config);
    models::llama_config_json(config, "float32");
  });
  return 0;
}
