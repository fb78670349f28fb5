// Parameter-server shards as services in this process, on free ports of 127.0.0.1, without
// /metrics: for tests of the worker side of ps mode.
#ifndef ONEBIT_SERVER_IN_PROCESS_SHARDS_H_
#define ONEBIT_SERVER_IN_PROCESS_SHARDS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/server_process.h"

namespace onebit::server {

// S shards of a tensor of n elements for `workers` workers, compressed blocks in
// `codec`'s format. A shard that fails to start is a test failure.
struct InProcessShards {
  InProcessShards(int num_shards, int workers, size_t n,
                  const Codec& codec = OnebitCodec(),
                  bool allow_step_gaps = false) {
    for (int s = 0; s < num_shards; ++s) {
      ServerProcessOptions options;
      options.shard = ShardConfig{s, num_shards, workers, n, 2};
      options.shard.codec = &codec;
      options.shard.allow_step_gaps = allow_step_gaps;
      options.serve_metrics = false;
      options.shutdown_grace = absl::Milliseconds(200);
      auto process = ServerProcess::Start(options);
      EXPECT_TRUE(process.ok()) << process.status();
      if (!process.ok()) return;
      addresses.push_back((*process)->grpc_address());
      processes.push_back(std::move(*process));
    }
  }
  std::vector<std::unique_ptr<ServerProcess>> processes;
  std::vector<std::string> addresses;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_IN_PROCESS_SHARDS_H_
