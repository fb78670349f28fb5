// The hierarchical exchange on an emulated cluster: 2 network namespaces as nodes with 2
// workers each, their links limited with tc, the coordinator on a host of its own
// (tools/emulated_cluster.sh). The job trains to the end; its parameters are bit-identical
// to the same job on loopback (placement changes nothing but the wires); the traffic
// inside a node stays in its namespace, so what leaves a node (its link's own byte
// counter) is well under what flat peer mode sends over the same links.
//
// Needs root and network namespaces: elsewhere it skips and says why.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

using launcher::ClusterHost;
using launcher::LocalJob;
using launcher::LocalJobOptions;

constexpr int kNodes = 2, kLocal = 2;
// Its own names and addresses, so that it can run beside a benchmark's cluster.
constexpr char kCluster[] = "obtest";
constexpr char kSubnet[] = "10.214.0";

std::string Script() { return testing_paths::Runfile("tools/emulated_cluster.sh"); }

// Runs the cluster script with `args`; its output, or nullopt when it failed.
std::optional<std::string> Cluster(const std::vector<std::string>& args) {
  static int runs = 0;
  ProcessOptions options;
  options.argv = {Script()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.env_set = {absl::StrCat("ONEBIT_CLUSTER=", kCluster),
                     absl::StrCat("ONEBIT_CLUSTER_SUBNET=", kSubnet)};
  options.log_path = absl::StrCat(testing_paths::TestTmpDir(), "/cluster-", runs++, ".log");
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(options);
  absl::StatusOr<int> code = p.ok() ? (*p)->Wait(absl::Seconds(60)) : p.status();
  std::ifstream in(options.log_path);
  const std::string out(std::istreambuf_iterator<char>(in), {});
  if (!code.ok() || *code != 0) {
    ADD_FAILURE() << "emulated_cluster.sh " << absl::StrJoin(args, " ") << ": "
                  << (code.ok() ? absl::StrCat("exit ", *code) : code.status().ToString())
                  << "\n" << out;
    return std::nullopt;
  }
  return out;
}

// Bytes that left each node so far (its eth0's tx counter), summed.
uint64_t NodeTxBytes() {
  std::optional<std::string> out = Cluster({"bytes"});
  uint64_t total = 0;
  if (!out) return 0;
  for (absl::string_view line : absl::StrSplit(*out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t tx = 0;
    if (f.size() == 3 && absl::SimpleAtoi(f[1], &tx)) total += tx;
  }
  return total;
}

class EmulatedClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root for network namespaces: skipped";
    if (system("/sbin/ip netns list > /dev/null 2>&1") != 0) {
      GTEST_SKIP() << "no network namespaces here (ip netns fails): skipped";
    }
    std::optional<std::string> up = Cluster({"up", absl::StrCat(kNodes), "200mbit"});
    ASSERT_TRUE(up.has_value());
    control_ = {absl::StrCat(kCluster, "-ctl"), absl::StrCat(kSubnet, ".1")};
    for (int i = 0; i < kNodes; ++i) {
      nodes_.push_back({absl::StrCat(kCluster, "-node", i), absl::StrCat(kSubnet, ".", 10 + i)});
    }
  }
  void TearDown() override {
    if (!nodes_.empty()) Cluster({"down"});
  }

  // Runs `config` to the end (on the cluster, or on loopback); returns worker 0's final
  // parameters as the bytes of its .npy file.
  std::string RunJob(const std::string& name, const JobConfig& config, bool on_cluster) {
    const std::string dir = testing_paths::TestTmpDir() + "/" + name;
    mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/job.json";
    std::ofstream(path) << JobConfigToJson(config);
    LocalJobOptions options;
    options.bin_dir = testing_paths::RunfilesRoot();
    options.dir = dir;
    options.config_path = path;
    options.echo_all = false;
    options.worker_flags = {"--params_out=" + dir + "/params-{i}.npy"};
    options.coordinator_flags = {"--linger=0s"};
    if (on_cluster) {
      options.control = control_;
      options.nodes = nodes_;
    }
    LocalJob job(options, config);
    absl::Status status = job.Start();
    if (status.ok()) status = job.WaitForWorkers(absl::Seconds(180));
    job.Stop();
    EXPECT_TRUE(status.ok()) << name << ": " << status;
    std::string first;
    for (int i = 0; i < config.workers; ++i) {
      std::ifstream in(absl::StrCat(dir, "/params-", i, ".npy"), std::ios::binary);
      const std::string bytes(std::istreambuf_iterator<char>(in), {});
      if (i == 0) first = bytes;
      EXPECT_EQ(bytes, first) << name << ": worker " << i << " differs from worker 0";
    }
    return first;
  }

  ClusterHost control_;
  std::vector<ClusterHost> nodes_;
};

JobConfig Job(const std::string& mode) {
  JobConfig c;
  c.workers = kNodes * kLocal;
  c.steps = 20;
  c.micro_batch = 8;
  c.lease_steps = 5;
  c.log_every = 10;
  c.workload.type = "synthetic";
  c.workload.parameters = 200003;
  c.optimizer.lr = 1e-2;
  c.optimizer.freeze_step = 5;
  c.exchange.mode = mode;
  if (mode == "hierarchical") c.exchange.local_size = kLocal;
  return c;
}

TEST_F(EmulatedClusterTest, HierarchicalKeepsNodeTrafficInsideAndSendsLessBetweenNodes) {
  const uint64_t t0 = NodeTxBytes();
  const std::string on_cluster = RunJob("hierarchical-cluster", Job("hierarchical"), true);
  const uint64_t t1 = NodeTxBytes();
  const std::string flat = RunJob("flat-cluster", Job("peer"), true);
  const uint64_t t2 = NodeTxBytes();
  const std::string on_loopback = RunJob("hierarchical-loopback", Job("hierarchical"), false);

  ASSERT_GT(on_cluster.size(), 200003u * 4);
  EXPECT_EQ(on_cluster, on_loopback) << "the cluster placement changed the result";
  EXPECT_NE(on_cluster, flat);  // a different algorithm: the compression sees node averages
  const uint64_t hierarchical_bytes = t1 - t0, flat_bytes = t2 - t1;
  std::printf("bytes out of the nodes: hierarchical %llu, flat peer %llu (%.2fx)\n",
              static_cast<unsigned long long>(hierarchical_bytes),
              static_cast<unsigned long long>(flat_bytes),
              static_cast<double>(flat_bytes) / hierarchical_bytes);
  // Per step the hierarchical exchange sends one node-sized worker's share between the
  // nodes; flat peer mode sends what two separate workers exchange with the other node.
  EXPECT_GT(hierarchical_bytes, 0u);
  EXPECT_LT(hierarchical_bytes, flat_bytes * 3 / 4);
}

}  // namespace
}  // namespace onebit
