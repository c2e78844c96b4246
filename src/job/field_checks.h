// The checks of one value the field declaration (job_fields.cpp) gives its fields: Check
// builders (job/job_fields.h's Check) and the few checks of their own. Private to src/job/.
//
// A check that the library already makes (check_pipeline_request, check_trainer_settings, the
// ZeRO and size parsers) is reused through `library_check`: the field's value goes into an object
// of defaults and the library's own message comes back, so a message is written once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipetrain/base/error.h"
#include "pipetrain/base/message_of.h"
#include "pipetrain/job/job_fields.h"
#include "pipetrain/partition/memory.h"
#include "pipetrain/runtime/run_layout.h"
#include "pipetrain/train/trainer.h"

namespace pipetrain::job::detail {

inline std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Runs `check` (a library check that throws BadInput); its message, or "".
template <typename Run>
std::string library_check(Run&& check) {
  try {
    check();
  } catch (const pipetrain::Error& error) {
    return error.what();
  } catch (const std::exception& error) {
    return message_of(error);
  }
  return "";
}

inline Check<int64_t> at_least(int64_t least) {
  return [least](const std::string& flag, const int64_t& value) -> std::string {
    if (value >= least) return "";
    return flag + " must be at least " + std::to_string(least) + ", got " + std::to_string(value);
  };
}

inline Check<int64_t> not_negative() {
  return [](const std::string& flag, const int64_t& value) -> std::string {
    return value >= 0 ? "" : flag + " must be >= 0, got " + std::to_string(value);
  };
}

inline Check<std::string> one_of(std::vector<std::string> names, std::string more = "") {
  return [names = std::move(names), more](const std::string& flag,
                                          const std::string& value) -> std::string {
    if (std::find(names.begin(), names.end(), value) != names.end()) return "";
    return "unknown " + flag + " '" + value + "'; valid: " + joined(names) + more;
  };
}

// The value through a PipelineRequest of defaults (run/run_layout.h's messages).
template <typename T, typename Set>
Check<T> pipeline_check(Set set) {
  return [set](const std::string&, const T& value) {
    return library_check([&] {
      PipelineRequest request;
      set(request, value);
      check_pipeline_request(request);
    });
  };
}

// The value through TrainerOptions of defaults (train/trainer.h's messages).
template <typename T, typename Set>
Check<T> trainer_check(Set set) {
  return [set](const std::string&, const T& value) {
    return library_check([&] {
      train::TrainerOptions options(1);
      options.lr(1).min_lr(0);
      set(options, value);
      train::check_trainer_settings(options);
    });
  };
}

inline Check<std::string> size_check(bool minus_one = false) {
  return [minus_one](const std::string& flag, const std::string& value) {
    if (minus_one && value == "-1") return std::string();
    return library_check([&] {
      try {
        partition::parse_bytes(value);
      } catch (const BadInput& error) {
        throw BadInput(flag + ": " + error.what());
      }
    });
  };
}

inline Check<double> positive_number() {
  return [](const std::string& flag, const double& value) -> std::string {
    if (value > 0 && std::isfinite(value)) return "";
    char got[32];
    std::snprintf(got, sizeof got, "%g", value);
    return flag + " must be a positive number, got " + got;
  };
}

// A finite number >= `least`; the message says `what` it must be.
inline Check<double> finite_at_least(double least, const char* what) {
  return [least, what](const std::string& flag, const double& value) -> std::string {
    if (value >= least && std::isfinite(value)) return "";
    char got[32];
    std::snprintf(got, sizeof got, "%g", value);
    return flag + " must be " + what + ", got " + got;
  };
}

inline Check<double> finite_at_least_zero(const char* what) {
  return finite_at_least(0, what);
}

// --chunks: a count >= 1 or auto.
inline std::string check_chunks(const std::string& flag, const std::string& text) {
  if (text.empty() || text == "auto") return "";
  try {
    std::size_t used = 0;
    const long long chunks = std::stoll(text, &used);
    if (used != text.size()) throw std::invalid_argument(text);
    if (chunks < 1) return flag + " must be at least 1 (or auto), got " + text;
  } catch (const std::exception&) {
    return flag + " '" + text + "' is not a micro-batch count; give a number >= 1 or auto";
  }
  return "";
}

// --balance: layer counts >= 1, or auto alone.
inline std::string check_balance(const std::string& flag, const std::vector<std::string>& entries) {
  const bool any_auto = std::find(entries.begin(), entries.end(), "auto") != entries.end();
  if (any_auto && entries.size() != 1) {
    return flag + " auto and a list of layer counts were both given; give either " + flag +
           " auto (the planner splits the layers) or the list";
  }
  if (any_auto) return "";
  for (const std::string& text : entries) {
    try {
      std::size_t used = 0;
      const long long layers = std::stoll(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
      if (layers < 1) {
        return flag + " entries must be at least 1 layer each, got " + std::to_string(layers);
      }
    } catch (const std::exception&) {
      return flag + " entry '" + text + "' is not a layer count; give counts like 3,2,2 or auto";
    }
  }
  return "";
}

inline std::string check_virtual(const std::string& flag, const int64_t& value) {
  return value >= 1 ? "" : flag + " must be at least 1, got " + std::to_string(value);
}

}  // namespace pipetrain::job::detail
