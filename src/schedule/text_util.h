// Private helper of the schedule readers (text_format.cpp, csv_format.cpp).
#pragma once

#include <string_view>

namespace pipetrain::schedule::detail {

// `text` without leading and trailing spaces, tabs, CRs and LFs.
inline std::string_view trim(std::string_view text) {
  const char* space = " \t\r\n";
  const auto begin = text.find_first_not_of(space);
  if (begin == std::string_view::npos) return {};
  const auto end = text.find_last_not_of(space);
  return text.substr(begin, end - begin + 1);
}

}  // namespace pipetrain::schedule::detail
