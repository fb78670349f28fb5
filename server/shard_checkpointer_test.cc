// ShardCheckpointer's stop against a coordinator that never answers: a TCP socket that
// listens and never accepts, the way a stopped pod's address behaves to a client whose
// connection the kernel completes but no server reads (gRPC waits out every attempt's
// deadline, then retries for coordinator_retry_s). Finish must return in its budget, say
// what it dropped, and leave the part it was reporting on disk.
#include "server/shard_checkpointer.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "gtest/gtest.h"

namespace onebit::server {
namespace {

// A listening socket on 127.0.0.1 that never accepts; closed at destruction.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

std::unique_ptr<CoordinatorClient> ClientOf(const std::string& address) {
  GrpcClientOptions options;
  options.address = address;
  options.rpc_timeout = absl::Seconds(10);
  options.retry_for = absl::Seconds(120);  // as a member's coordinator_retry_s
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

std::string TempDir(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TEST(ShardCheckpointerTest, FinishDoesNotWaitOnACoordinatorThatNeverAnswers) {
  SilentListener silent;
  std::unique_ptr<CoordinatorClient> client = ClientOf(silent.address());
  const std::string dir = TempDir("silent");
  ShardCheckpointer checkpointer(dir, /*index=*/1, "topology");
  checkpointer.Enqueue(40, std::vector<float>(1000, 0.5f));
  checkpointer.Enqueue(80, std::vector<float>(1000, 0.25f));
  checkpointer.Start(client.get(), "host:1:shard1");
  absl::SleepFor(absl::Milliseconds(300));  // step 40's part is written, its report hangs

  const absl::Time began = absl::Now();
  const int dropped = checkpointer.Finish(absl::Milliseconds(500));
  const absl::Duration took = absl::Now() - began;
  EXPECT_LT(took, absl::Seconds(3)) << "Finish waited on the silent coordinator";
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_EQ(dropped, 1);  // step 80's part: never written
  EXPECT_EQ(checkpointer.status().code(), absl::StatusCode::kCancelled)
      << checkpointer.status();
  // Step 40's part is whole on disk (the coordinator never heard of it, so no manifest
  // names it: a resumed job cannot pick it up by mistake).
  absl::StatusOr<checkpoint::Part> part = checkpoint::ReadPart(checkpoint::JoinPath(
      checkpoint::JoinPath(dir, checkpoint::StepDirName(40)),
      checkpoint::PartFileName(v1::ROLE_SERVER, 1)));
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->MetaInt("step").value_or(-1), 40);
  // Finish again, and the destructor after it: nothing left to wait for.
  const absl::Time again = absl::Now();
  EXPECT_EQ(checkpointer.Finish(absl::Seconds(10)), 1);
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(100));
}

TEST(ShardCheckpointerTest, PartsQueuedBeforeAClientAreDroppedAtFinish) {
  ShardCheckpointer checkpointer(TempDir("unstarted"), 0, "topology");
  checkpointer.Enqueue(10, std::vector<float>(10, 1.0f));
  EXPECT_EQ(checkpointer.Finish(absl::Seconds(1)), 1);
  EXPECT_TRUE(checkpointer.status().ok());
}

TEST(GrpcCoordinatorClientTest, CancelEndsACallInFlightAndFailsLaterOnesAtOnce) {
  SilentListener silent;
  std::unique_ptr<CoordinatorClient> client = ClientOf(silent.address());
  absl::Status in_flight;
  std::thread caller([&] { in_flight = client->GetJob({}).status(); });
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time began = absl::Now();
  client->Cancel();
  caller.join();
  EXPECT_LT(absl::Now() - began, absl::Seconds(2));
  EXPECT_EQ(in_flight.code(), absl::StatusCode::kCancelled) << in_flight;
  const absl::Time later = absl::Now();
  EXPECT_EQ(client->ListMembers({}).status().code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - later, absl::Milliseconds(100));
}

}  // namespace
}  // namespace onebit::server
