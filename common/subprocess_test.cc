// Real child processes (/bin/sh -c ...): exit codes, signals, output capture, environment,
// working directory, termination.
#include "common/subprocess.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

std::string NewDir(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/subprocess_", name, "_", getpid(), "_", counter++);
  EXPECT_EQ(mkdir(dir.c_str(), 0777), 0) << dir;
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ProcessOptions Shell(const std::string& script) {
  ProcessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  return options;
}

// Starts `options` and waits for its exit code (-1 if it did not start or exit).
int RunToExit(const ProcessOptions& options) {
  auto p = Process::Start(options);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return -1;
  absl::StatusOr<int> code = (*p)->Wait(absl::Seconds(30));
  EXPECT_TRUE(code.ok()) << code.status();
  return code.ok() ? *code : -1;
}

TEST(SubprocessTest, ExitCodes) {
  EXPECT_EQ(RunToExit(Shell("exit 0")), 0);
  EXPECT_EQ(RunToExit(Shell("exit 3")), 3);
  EXPECT_EQ(RunToExit(Shell("exit 255")), 255);
}

TEST(SubprocessTest, ASignalGivesOneHundredTwentyEightPlusItsNumber) {
  EXPECT_EQ(RunToExit(Shell("kill -KILL $$")), 128 + SIGKILL);
  auto p = Process::Start(Shell("exec sleep 30"));
  ASSERT_TRUE(p.ok()) << p.status();
  int code = 0;
  EXPECT_FALSE((*p)->Exited(&code));
  (*p)->Signal(SIGUSR1);
  EXPECT_EQ(*(*p)->Wait(absl::Seconds(10)), 128 + SIGUSR1);
  EXPECT_TRUE((*p)->Exited(&code));
  EXPECT_EQ(code, 128 + SIGUSR1);
}

TEST(SubprocessTest, WaitTimesOutWhileTheChildRuns) {
  auto p = Process::Start(Shell("exec sleep 30"));
  ASSERT_TRUE(p.ok()) << p.status();
  const absl::StatusOr<int> code = (*p)->Wait(absl::Milliseconds(100));
  EXPECT_EQ(code.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE((*p)->Exited(nullptr));
  (*p)->Terminate();
  EXPECT_TRUE((*p)->Exited(nullptr));
}

TEST(SubprocessTest, OutputIsInTheLogOnceTheExitIsSeen) {
  const std::string dir = NewDir("log");
  ProcessOptions options =
      Shell("echo out; echo err >&2; i=0; while [ $i -lt 2000 ]; do echo line$i; i=$((i+1)); done;"
            " printf 'no newline'");
  options.log_path = dir + "/out.log";
  EXPECT_EQ(RunToExit(options), 0);
  // Read at once: the pipe was drained before the exit was reported.
  const std::string log = Read(options.log_path);
  EXPECT_EQ(log.rfind("out\nerr\nline0\nline1\n", 0), 0u) << log.substr(0, 100);
  EXPECT_THAT(log, HasSubstr("\nline1999\nno newline\n"));
  EXPECT_EQ(log.size(), log.rfind("no newline\n") + 11);

  // A second process appends to the same log.
  EXPECT_EQ(RunToExit(options), 0);
  EXPECT_EQ(Read(options.log_path), log + log);
}

// The child's last lines are still in the pipe when it exits; exit is reported only once
// they are in the log. Many short lines make the pump's last stretch take a while.
TEST(SubprocessTest, TheLastLinesAreInTheLogWhenTheExitIsReported) {
  const std::string dir = NewDir("drain");
  for (int i = 0; i < 5; ++i) {
    ProcessOptions options = Shell("seq 1 100000");
    options.log_path = absl::StrCat(dir, "/log", i);
    ASSERT_EQ(RunToExit(options), 0);
    const std::string log = Read(options.log_path);
    ASSERT_GT(log.size(), 7u);
    EXPECT_EQ(log.substr(log.size() - 7), "100000\n") << "run " << i;
  }
}

TEST(SubprocessTest, StderrApart) {
  const std::string dir = NewDir("stderr");
  ProcessOptions options = Shell("echo out; echo err >&2; exit 4");
  options.log_path = dir + "/out";
  options.stderr_path = dir + "/err";
  EXPECT_EQ(RunToExit(options), 4);
  EXPECT_EQ(Read(dir + "/out"), "out\n");
  EXPECT_EQ(Read(dir + "/err"), "err\n");
}

TEST(SubprocessTest, EchoLabelsEveryLine) {
  const std::string dir = NewDir("echo");
  ProcessOptions options = Shell("echo one; echo two >&2");
  options.name = "child 7";
  options.echo = true;
  options.log_path = dir + "/log";
  testing::internal::CaptureStdout();
  const int code = RunToExit(options);
  const std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_EQ(code, 0);
  EXPECT_EQ(printed, "[child 7] one\n[child 7] two\n");
  EXPECT_EQ(Read(dir + "/log"), "one\ntwo\n");
}

TEST(SubprocessTest, EnvironmentAdditionsAndRemovals) {
  const std::string dir = NewDir("env");
  ASSERT_EQ(setenv("ONEBIT_SUBPROCESS_TEST_GONE", "still here", 1), 0);
  ASSERT_EQ(setenv("ONEBIT_SUBPROCESS_TEST_OLD", "old", 1), 0);
  ASSERT_EQ(setenv("ONEBIT_SUBPROCESS_TEST_KEPT", "kept", 1), 0);
  ProcessOptions options = Shell(
      "echo \"gone=${ONEBIT_SUBPROCESS_TEST_GONE-unset}\";"
      " echo \"old=$ONEBIT_SUBPROCESS_TEST_OLD\"; echo \"new=$ONEBIT_SUBPROCESS_TEST_NEW\";"
      " echo \"kept=$ONEBIT_SUBPROCESS_TEST_KEPT\";"
      " env | grep -c '^ONEBIT_SUBPROCESS_TEST_OLD='");
  options.env_unset = {"ONEBIT_SUBPROCESS_TEST_GONE"};
  options.env_set = {"ONEBIT_SUBPROCESS_TEST_OLD=replaced", "ONEBIT_SUBPROCESS_TEST_NEW=a=b"};
  options.log_path = dir + "/log";
  EXPECT_EQ(RunToExit(options), 0);
  EXPECT_EQ(Read(options.log_path), "gone=unset\nold=replaced\nnew=a=b\nkept=kept\n1\n");
  // Our own environment is untouched.
  EXPECT_STREQ(getenv("ONEBIT_SUBPROCESS_TEST_GONE"), "still here");

  options.env_set = {"NO_EQUALS_SIGN"};
  EXPECT_EQ(Process::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, WorkingDirectory) {
  const std::string dir = NewDir("cwd");
  const std::string work = NewDir("cwd_work");
  ProcessOptions options = Shell("pwd -P; echo made > made_here");
  options.working_dir = work;
  options.log_path = dir + "/log";  // relative to our directory, not the child's
  EXPECT_EQ(RunToExit(options), 0);
  char real[PATH_MAX];
  ASSERT_NE(realpath(work.c_str(), real), nullptr);
  EXPECT_EQ(Read(dir + "/log"), absl::StrCat(real, "\n"));
  EXPECT_EQ(Read(work + "/made_here"), "made\n");

  options.working_dir = dir + "/missing";
  auto missing = Process::Start(options);
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(dir + "/missing"));
}

// Starts `script`, which prints a line once its traps are set, and waits for that line.
std::unique_ptr<Process> StartWhenReady(const std::string& script) {
  ProcessOptions options = Shell(script);
  options.log_path = NewDir("ready") + "/log";
  auto p = Process::Start(options);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  const absl::Status ready = WaitForFile(options.log_path, absl::Seconds(10), p->get()).status();
  EXPECT_TRUE(ready.ok()) << ready;
  return ready.ok() ? *std::move(p) : nullptr;
}

TEST(SubprocessTest, TerminateFallsBackToSigkill) {
  // exec: sleep inherits the ignored SIGTERM, and no grandchild outlives the shell.
  std::unique_ptr<Process> p = StartWhenReady("trap '' TERM; echo ready; exec sleep 60");
  ASSERT_NE(p, nullptr);
  const absl::Time start = absl::Now();
  p->Terminate(absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  int code = 0;
  ASSERT_TRUE(p->Exited(&code));
  EXPECT_EQ(code, 128 + SIGKILL) << "SIGTERM should have been ignored";
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(5));
}

// A stopped child that handles SIGTERM (as our servers do) gets to handle it at once,
// not after the grace period. (A default-action SIGTERM kills even a stopped process.)
TEST(SubprocessTest, TerminateLetsAStoppedChildHandleSigterm) {
  std::unique_ptr<Process> p =
      StartWhenReady("trap 'exit 5' TERM; echo ready; while :; do sleep 0.05; done");
  ASSERT_NE(p, nullptr);
  p->Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  p->Terminate(absl::Seconds(10));
  int code = 0;
  ASSERT_TRUE(p->Exited(&code));
  EXPECT_EQ(code, 5) << "the handler did not run";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "SIGTERM waited for the grace period";
}

TEST(SubprocessTest, AGrandchildHoldingThePipeDoesNotHoldUpTheExit) {
  const std::string dir = NewDir("grandchild");
  ProcessOptions options = Shell("sleep 3 & echo parent done");
  options.log_path = dir + "/log";
  const absl::Time start = absl::Now();
  EXPECT_EQ(RunToExit(options), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2.5));
  EXPECT_EQ(Read(options.log_path), "parent done\n");
}

TEST(SubprocessTest, AMissingBinaryIsAClearError) {
  ProcessOptions options;
  options.argv = {"/nonexistent/onebit-binary", "--flag"};
  auto p = Process::Start(options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("/nonexistent/onebit-binary"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("No such file or directory"));

  options.argv = {};
  EXPECT_EQ(Process::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SubprocessTest, AnUnopenableLogIsAClearError) {
  const std::string dir = NewDir("badlog");
  ProcessOptions options = Shell("exit 0");
  options.log_path = dir + "/missing/log";
  auto p = Process::Start(options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound) << p.status();
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(options.log_path));
}

TEST(SubprocessTest, WaitForFile) {
  const std::string dir = NewDir("wait");
  auto writer = Process::Start(Shell("sleep 0.2; echo hello > " + dir + "/f.tmp; mv " + dir +
                                     "/f.tmp " + dir + "/f; exec sleep 30"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::StatusOr<std::string> text = WaitForFile(dir + "/f", absl::Seconds(10), writer->get());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "hello\n");

  EXPECT_EQ(WaitForFile(dir + "/never", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);

  auto quitter = Process::Start(Shell("exit 7"));
  ASSERT_TRUE(quitter.ok()) << quitter.status();
  const absl::Status gone = WaitForFile(dir + "/never", absl::Seconds(10), quitter->get()).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition) << gone;
  EXPECT_THAT(std::string(gone.message()), HasSubstr("exited with code 7"));
}

TEST(SubprocessTest, WaitForLogMatch) {
  const std::string dir = NewDir("logmatch");
  ProcessOptions options =
      Shell("echo starting; sleep 0.2; echo 'listening on 127.0.0.1:4321'; exec sleep 30");
  options.log_path = dir + "/talker.log";
  auto talker = Process::Start(options);
  ASSERT_TRUE(talker.ok()) << talker.status();
  absl::StatusOr<std::string> address = WaitForLogMatch(
      options.log_path, "listening on ([0-9.]+:[0-9]+)", absl::Seconds(10), talker->get());
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "127.0.0.1:4321");
  EXPECT_EQ(*WaitForLogMatch(options.log_path, "start[a-z]+", absl::Seconds(1)), "starting");

  const absl::Status silent =
      WaitForLogMatch(options.log_path, "ready", absl::Milliseconds(100)).status();
  EXPECT_EQ(silent.code(), absl::StatusCode::kDeadlineExceeded) << silent;
  EXPECT_THAT(std::string(silent.message()), HasSubstr("listening on"));  // the log's end

  ProcessOptions quits = Shell("echo 'bind: address already in use'; exit 3");
  quits.log_path = dir + "/quitter.log";
  auto quitter = Process::Start(quits);
  ASSERT_TRUE(quitter.ok()) << quitter.status();
  const absl::Status gone =
      WaitForLogMatch(quits.log_path, "listening", absl::Seconds(10), quitter->get()).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition) << gone;
  EXPECT_THAT(std::string(gone.message()), HasSubstr("exited with code 3"));
  EXPECT_THAT(std::string(gone.message()), HasSubstr("address already in use"));
}

}  // namespace
}  // namespace onebit
