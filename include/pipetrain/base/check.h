// PIPETRAIN_CHECK and friends: TORCH_CHECK's shape for the pipetrain::Error family
// (pipetrain/base/error.h). The message is built with c10::str from any printable values, exactly
// as TORCH_CHECK builds it, but the exception is a pipetrain::Error of the kind the caller can
// catch, and carries no C++ backtrace in what().
//
//   PIPETRAIN_CHECK_INPUT(chunks >= 1, "chunks must be at least 1 (got ", chunks, ")");
//   PIPETRAIN_CHECK(ready, Timeout, "no activation after ", seconds, " s");
//   PIPETRAIN_CHECK_AT(ok, TransportFailure, (ErrorSite{rank, stage, "", i}), "recv failed");
//
// Use them for the caller's mistakes and for failures at run time; internal invariants (our bugs)
// stay TORCH_INTERNAL_ASSERT.
//
// Needs LibTorch (c10::str): part of pipetrain::pipetrain, not pipetrain::schedule.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/StringUtil.h>

#include "pipetrain/base/error.h"

// Throws `ErrorType(c10::str(...))` unless `cond` holds. ErrorType is a pipetrain::Error subclass
// as named at the call site (inside namespace pipetrain: `BadInput`; elsewhere qualified).
#define PIPETRAIN_CHECK(cond, ErrorType, ...)   \
  do {                                          \
    if (C10_UNLIKELY(!(cond))) {                \
      throw ErrorType(::c10::str(__VA_ARGS__)); \
    }                                           \
  } while (false)

// As PIPETRAIN_CHECK, with an ErrorSite (put braces or a constructor call in parentheses).
#define PIPETRAIN_CHECK_AT(cond, ErrorType, site, ...) \
  do {                                                 \
    if (C10_UNLIKELY(!(cond))) {                       \
      throw ErrorType(::c10::str(__VA_ARGS__), site);  \
    }                                                  \
  } while (false)

// The caller's input (an option, an argument, a shape, a file's contents) is wrong: BadInput.
#define PIPETRAIN_CHECK_INPUT(cond, ...) PIPETRAIN_CHECK(cond, ::pipetrain::BadInput, __VA_ARGS__)
