// The pipetrain::Error family (pipetrain/base/error.h).
#include "pipetrain/base/error.h"

#include <utility>

namespace pipetrain {
namespace {

std::string with_site(const ErrorSite& site, const std::string& message) {
  return site.empty() ? message : site.describe() + ": " + message;
}

}  // namespace

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::BadInput:
      return "bad input";
    case ErrorKind::ScheduleInvalid:
      return "schedule invalid";
    case ErrorKind::File:
      return "file";
    case ErrorKind::TransportFailure:
      return "transport failure";
    case ErrorKind::Timeout:
      return "timeout";
    case ErrorKind::PeerFailed:
      return "peer failed";
    case ErrorKind::Runtime:
      return "runtime";
  }
  return "runtime";
}

std::string ErrorSite::describe() const {
  std::string text;
  auto add = [&text](const std::string& part) { text += (text.empty() ? "" : ", ") + part; };
  if (rank >= 0) add("rank " + std::to_string(rank));
  if (stage >= 0) add("stage " + std::to_string(stage));
  if (!action.empty()) add("action " + action);
  if (microbatch >= 0) add("micro-batch " + std::to_string(microbatch));
  return text;
}

Error::Error(ErrorKind kind, const std::string& message, ErrorSite site)
    : std::runtime_error(with_site(site, message)),
      kind_(kind),
      site_(std::move(site)),
      message_(message) {}

int Error::exit_code() const {
  switch (kind_) {
    case ErrorKind::BadInput:
    case ErrorKind::ScheduleInvalid:
    case ErrorKind::File:
      return 2;
    default:
      return 1;
  }
}

void throw_error(ErrorKind kind, const std::string& message, ErrorSite site) {
  switch (kind) {
    case ErrorKind::BadInput:
      throw BadInput(message, std::move(site));
    case ErrorKind::ScheduleInvalid:
      throw ScheduleInvalid(message, std::move(site));
    case ErrorKind::File:
      throw FileError(message);
    case ErrorKind::TransportFailure:
      throw TransportFailure(message, std::move(site));
    case ErrorKind::Timeout:
      throw Timeout(message, std::move(site));
    case ErrorKind::PeerFailed:
      throw PeerFailed(message, std::move(site));
    case ErrorKind::Runtime:
      break;
  }
  throw Error(ErrorKind::Runtime, message, std::move(site));
}

}  // namespace pipetrain
