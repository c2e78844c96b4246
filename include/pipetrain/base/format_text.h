// format_text: printf into a std::string, for the report lines that print figures with a fixed
// number of digits (fmt is not used in the LibTorch translation units: its headers clash there).
#pragma once

#include <cstdio>
#include <string>

namespace pipetrain {

template <typename... Args>
std::string format_text(const char* pattern, Args... args) {
  char small[256];
  const int n = std::snprintf(small, sizeof small, pattern, args...);
  if (n < 0) return std::string();
  if (static_cast<size_t>(n) < sizeof small) return std::string(small, static_cast<size_t>(n));
  std::string text(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(text.data(), text.size(), pattern, args...);
  text.resize(static_cast<size_t>(n));
  return text;
}

}  // namespace pipetrain
