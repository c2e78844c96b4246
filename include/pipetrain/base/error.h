// pipetrain::Error: the one error family every public function of pipetrain throws.
//
//   std::runtime_error
//     pipetrain::Error            kind() says which of the below; site() says where
//       BadInput                  the caller's input is wrong: a value, a file, a flag (CLI exit 2)
//         ScheduleInvalid         a schedule that breaks a dependency or deadlocks (CLI exit 2)
//         FileError               a file that cannot be read or written (CLI exit 2)
//       TransportFailure          moving a tensor between ranks failed (CLI exit 1)
//       Timeout                   a rank or the store did not answer in time (CLI exit 1)
//       PeerFailed                another rank or worker failed first; this one stopped (exit 1)
//       (kind Runtime)            anything else that fails while running, e.g. a diverged loss
//
// A caller catches by kind (`catch (const pipetrain::BadInput&)`) or catches pipetrain::Error and
// asks exit_code(). Where it applies, the site names the rank, stage, action and micro-batch;
// what() begins with them ("rank 1, stage 2, action 2B5, micro-batch 5: ..."), message() is
// without.
//
// Torch-free (part of pipetrain::schedule). Thread-safety: immutable after construction.
#pragma once

#include <stdexcept>
#include <string>

namespace pipetrain {

enum class ErrorKind {
  BadInput,
  ScheduleInvalid,
  File,
  TransportFailure,
  Timeout,
  PeerFailed,
  Runtime
};

// "bad input", "schedule invalid", "file", "transport failure", "timeout", "peer failed",
// "runtime".
const char* to_string(ErrorKind kind);

// Where an error happened. -1 (or "") means not known or not applicable.
struct ErrorSite {
  int rank = -1;
  int stage = -1;
  std::string action;  // an action's text form, e.g. "2B5"
  int microbatch = -1;

  bool empty() const { return rank < 0 && stage < 0 && action.empty() && microbatch < 0; }
  // "rank 1, stage 2, action 2B5, micro-batch 5" with the known parts only; "" when empty().
  std::string describe() const;
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message, ErrorSite site = {});

  ErrorKind kind() const { return kind_; }
  const ErrorSite& site() const { return site_; }
  // The message without the site.
  const std::string& message() const { return message_; }
  // The CLI's exit code for this error: 2 for bad input (BadInput and its kinds), else 1.
  int exit_code() const;

 private:
  ErrorKind kind_;
  ErrorSite site_;
  std::string message_;
};

class BadInput : public Error {
 public:
  explicit BadInput(const std::string& message, ErrorSite site = {})
      : Error(ErrorKind::BadInput, message, std::move(site)) {}

 protected:
  BadInput(ErrorKind kind, const std::string& message, ErrorSite site)
      : Error(kind, message, std::move(site)) {}
};

class ScheduleInvalid : public BadInput {
 public:
  explicit ScheduleInvalid(const std::string& message, ErrorSite site = {})
      : BadInput(ErrorKind::ScheduleInvalid, message, std::move(site)) {}
};

class FileError : public BadInput {
 public:
  explicit FileError(const std::string& message)
      : BadInput(ErrorKind::File, message, ErrorSite{}) {}
};

class TransportFailure : public Error {
 public:
  explicit TransportFailure(const std::string& message, ErrorSite site = {})
      : Error(ErrorKind::TransportFailure, message, std::move(site)) {}
};

class Timeout : public Error {
 public:
  explicit Timeout(const std::string& message, ErrorSite site = {})
      : Error(ErrorKind::Timeout, message, std::move(site)) {}
};

class PeerFailed : public Error {
 public:
  explicit PeerFailed(const std::string& message, ErrorSite site = {})
      : Error(ErrorKind::PeerFailed, message, std::move(site)) {}
};

// Throws the class of `kind` (Timeout for ErrorKind::Timeout, ...; a plain Error for Runtime), so
// that a caller catching by class catches it: for code that learns the kind at run time. FileError
// takes no site; a File kind drops it.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message, ErrorSite site = {});

}  // namespace pipetrain
