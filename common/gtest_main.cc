// The main of every onebit test: gtest and gmock, with the signal set-up of every onebit
// binary (common/signals.h), so that a test whose peer vanishes mid-send fails with a
// status instead of dying of SIGPIPE.
#include "common/signals.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  testing::InitGoogleMock(&argc, argv);
  return RUN_ALL_TESTS();
}
