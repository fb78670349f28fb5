#include "coordinator/address_file.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace onebit {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(AddressFileTest, RoundTrip) {
  const std::string path = TempPath("addresses.json");
  ASSERT_TRUE(WriteAddressFile(path, {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}).ok());
  absl::StatusOr<CoordinatorAddresses> read = ReadAddressFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->grpc, "127.0.0.1:1");
  EXPECT_EQ(read->rest, "127.0.0.1:2");
  EXPECT_EQ(read->metrics, "127.0.0.1:3");
  // Overwriting replaces the whole file.
  ASSERT_TRUE(WriteAddressFile(path, {"h:4", "h:5", ""}).ok());
  EXPECT_EQ(ReadAddressFile(path)->metrics, "");
}

TEST(AddressFileTest, Errors) {
  EXPECT_EQ(ReadAddressFile(TempPath("missing.json")).status().code(), absl::StatusCode::kNotFound);
  const std::string path = TempPath("bad.json");
  std::ofstream(path) << "{\"grpc\": 5}";
  EXPECT_EQ(ReadAddressFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << "{\"grpc\": \"a\"";
  EXPECT_EQ(ReadAddressFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(WriteAddressFile("/nonexistent-dir/x.json", {}).ok());
}

}  // namespace
}  // namespace onebit
