// The pipetrain::Error family (include/pipetrain/base/error.h): what() names the site and
// message() does not, the CLI exit code of every kind, catching by base class, throw_error.
// Torch-free; the end-to-end checks (real library calls throwing each kind) live beside the
// runtime that throws them, in tests/runtime/error_kinds_test.cpp.
#include "pipetrain/base/error.h"

#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace pipetrain {
namespace {

const ErrorSite kFullSite{1, 2, "2B5", 5};

TEST(ErrorSite, DescribesTheKnownPartsInOrder) {
  EXPECT_EQ(kFullSite.describe(), "rank 1, stage 2, action 2B5, micro-batch 5");
  EXPECT_EQ((ErrorSite{-1, 3, "", 7}).describe(), "stage 3, micro-batch 7");
  EXPECT_EQ((ErrorSite{4, -1, "", -1}).describe(), "rank 4");
  EXPECT_TRUE(ErrorSite{}.empty());
  EXPECT_EQ(ErrorSite{}.describe(), "");
}

TEST(Error, WhatBeginsWithTheSiteAndMessageLeavesItOut) {
  const TransportFailure error("no activation from rank 0", kFullSite);
  EXPECT_STREQ(error.what(),
               "rank 1, stage 2, action 2B5, micro-batch 5: no activation from rank 0");
  EXPECT_EQ(error.message(), "no activation from rank 0");
  EXPECT_EQ(error.site().rank, 1);
  EXPECT_EQ(error.site().stage, 2);
  EXPECT_EQ(error.site().action, "2B5");
  EXPECT_EQ(error.site().microbatch, 5);
}

TEST(Error, WithoutASiteWhatIsTheMessage) {
  const BadInput error("chunks must be at least 1 (got 0)");
  EXPECT_STREQ(error.what(), "chunks must be at least 1 (got 0)");
  EXPECT_EQ(error.message(), error.what());
  EXPECT_TRUE(error.site().empty());
}

TEST(Error, ExitCodeIsTwoForBadInputKindsAndOneForTheRest) {
  EXPECT_EQ(BadInput("x").exit_code(), 2);
  EXPECT_EQ(ScheduleInvalid("x").exit_code(), 2);
  EXPECT_EQ(FileError("x").exit_code(), 2);
  EXPECT_EQ(TransportFailure("x").exit_code(), 1);
  EXPECT_EQ(Timeout("x").exit_code(), 1);
  EXPECT_EQ(PeerFailed("x").exit_code(), 1);
  EXPECT_EQ(Error(ErrorKind::Runtime, "x").exit_code(), 1);
}

TEST(Error, EveryClassReportsItsKind) {
  EXPECT_EQ(BadInput("x").kind(), ErrorKind::BadInput);
  EXPECT_EQ(ScheduleInvalid("x").kind(), ErrorKind::ScheduleInvalid);
  EXPECT_EQ(FileError("x").kind(), ErrorKind::File);
  EXPECT_EQ(TransportFailure("x").kind(), ErrorKind::TransportFailure);
  EXPECT_EQ(Timeout("x").kind(), ErrorKind::Timeout);
  EXPECT_EQ(PeerFailed("x").kind(), ErrorKind::PeerFailed);
  EXPECT_STREQ(to_string(ErrorKind::Timeout), "timeout");
  EXPECT_STREQ(to_string(ErrorKind::PeerFailed), "peer failed");
}

// Returns the kind of the error `f` throws as caught through the base class `Base`.
template <typename Base>
ErrorKind caught_as(const std::function<void()>& f) {
  try {
    f();
  } catch (const Base& error) {
    return error.kind();
  }
  ADD_FAILURE() << "nothing was thrown";
  return ErrorKind::Runtime;
}

TEST(Error, CatchingByBaseClassWorks) {
  EXPECT_EQ(caught_as<BadInput>([] { throw ScheduleInvalid("deadlock"); }),
            ErrorKind::ScheduleInvalid);
  EXPECT_EQ(caught_as<BadInput>([] { throw FileError("cannot open 'x'"); }), ErrorKind::File);
  EXPECT_EQ(caught_as<Error>([] {
              throw Timeout("late", ErrorSite{1, -1, "", -1});
            }),
            ErrorKind::Timeout);
  EXPECT_EQ(caught_as<Error>([] { throw PeerFailed("rank 0 failed"); }), ErrorKind::PeerFailed);
  // A caller that knows only the standard library still gets the text.
  try {
    throw TransportFailure("closed", ErrorSite{0, -1, "", -1});
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "rank 0: closed");
  }
}

TEST(ThrowError, ThrowsTheClassOfTheKindWithTheSite) {
  const ErrorKind kinds[] = {ErrorKind::BadInput, ErrorKind::ScheduleInvalid,
                             ErrorKind::File,     ErrorKind::TransportFailure,
                             ErrorKind::Timeout,  ErrorKind::PeerFailed,
                             ErrorKind::Runtime};
  for (ErrorKind kind : kinds) {
    try {
      throw_error(kind, "message", ErrorSite{3, 1, "1F0", 0});
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), kind) << to_string(kind);
      EXPECT_EQ(error.message(), "message");
      // FileError carries no site.
      EXPECT_EQ(error.site().rank, kind == ErrorKind::File ? -1 : 3) << to_string(kind);
    }
  }
  EXPECT_THROW(throw_error(ErrorKind::Timeout, "late"), Timeout);
  EXPECT_THROW(throw_error(ErrorKind::File, "gone"), FileError);
  EXPECT_THROW(throw_error(ErrorKind::ScheduleInvalid, "cycle"), ScheduleInvalid);
  EXPECT_THROW(throw_error(ErrorKind::PeerFailed, "first"), PeerFailed);
  EXPECT_THROW(throw_error(ErrorKind::TransportFailure, "closed"), TransportFailure);
  EXPECT_THROW(throw_error(ErrorKind::BadInput, "bad"), BadInput);
}

}  // namespace
}  // namespace pipetrain
