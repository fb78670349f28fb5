#include "tools/chaos/chaos.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace onebit::chaos {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// Records what the faults do; a killed process runs again after `restart_after` (what the
// supervisor does), and a link is down between SetLink(false) and SetLink(true).
class Recorder final : public ChaosTarget {
 public:
  explicit Recorder(std::vector<std::string> processes) {
    for (const std::string& p : processes) back_at_[p] = absl::InfinitePast();
  }
  absl::Time now = kT0;
  absl::Duration restart_after = absl::Milliseconds(500);
  std::vector<std::string> kills;
  std::vector<std::pair<std::string, bool>> links;
  std::set<std::string> down;

  bool Running(const std::string& process) override {
    auto it = back_at_.find(process);
    return it != back_at_.end() && now >= it->second;
  }
  absl::Status Kill(const std::string& process) override {
    EXPECT_TRUE(Running(process)) << process << " was killed while not running";
    kills.push_back(process);
    back_at_[process] = now + restart_after;
    return absl::OkStatus();
  }
  absl::Status SetLink(const std::string& netns, bool up) override {
    EXPECT_NE(down.count(netns) == 0, up) << netns << (up ? " healed twice" : " cut twice");
    links.emplace_back(netns, up);
    if (up) {
      down.erase(netns);
    } else {
      down.insert(netns);
    }
    return absl::OkStatus();
  }

 private:
  std::map<std::string, absl::Time> back_at_;
};

std::vector<Victim> Cluster() {
  return {{"coordinator", "ctl"}, {"server 0", "ctl"}, {"worker 0", "node0"},
          {"worker 1", "node0"},  {"worker 2", "node1"}, {"worker 3", "node1"}};
}

// Runs a schedule to its end at 50 ms ticks (the launcher's poll).
void RunToEnd(Chaos& chaos, Recorder& target) {
  for (int i = 0; i < 200000 && !chaos.Done(); ++i) {
    target.now += absl::Milliseconds(50);
    chaos.Tick(target.now, target);
  }
  ASSERT_TRUE(chaos.Done());
}

TEST(ChaosTest, InjectsEveryFaultOfEachKindAndHealsEveryCut) {
  ChaosOptions options;
  options.seed = 7;
  options.faults = 200;
  Chaos chaos(options, Cluster(), kT0);
  Recorder target({"coordinator", "server 0", "worker 0", "worker 1", "worker 2", "worker 3"});
  RunToEnd(chaos, target);

  ASSERT_EQ(chaos.faults().size(), 200u);
  EXPECT_TRUE(target.down.empty()) << "a link left down";
  EXPECT_TRUE(chaos.errors().empty());
  std::map<std::string, int> kills;
  for (const std::string& k : target.kills) ++kills[k];
  int cuts = 0, second_kills = 0, coordinator_kills = 0;
  absl::Time last = kT0;
  for (const Fault& f : chaos.faults()) {
    EXPECT_EQ(f.outcome, "") << f.target;
    EXPECT_GE(f.at, last);
    last = f.at;
    if (f.kind == FaultKind::kCut) {
      ++cuts;
      EXPECT_TRUE(f.target == "ctl" || f.target == "node0" || f.target == "node1") << f.target;
      EXPECT_GE(f.cut_for, options.min_cut);
      EXPECT_LE(f.cut_for, options.max_cut);
    }
    if (f.target == "coordinator") ++coordinator_kills;
    if (f.second_kill) ++second_kills;
  }
  // Shares near the options' (200 faults: loose bounds that a broken mix fails).
  EXPECT_GT(cuts, 35);
  EXPECT_LT(cuts, 85);
  EXPECT_GT(coordinator_kills, 15);
  EXPECT_GT(second_kills, 3);
  for (const char* p : {"server 0", "worker 0", "worker 1", "worker 2", "worker 3"}) {
    EXPECT_GT(kills[p], 5) << p;
  }
  // A second kill follows its first within 1 to 4 s (plus a tick).
  for (size_t i = 1; i < chaos.faults().size(); ++i) {
    const Fault& f = chaos.faults()[i];
    if (!f.second_kill) continue;
    const Fault& first = chaos.faults()[i - 1];
    EXPECT_EQ(first.target, "coordinator");
    EXPECT_GE(f.at - first.at, absl::Seconds(1));
    EXPECT_LE(f.at - first.at, absl::Seconds(4) + absl::Milliseconds(600));
  }
  // Gaps between the other faults stay within the options.
  for (size_t i = 1; i < chaos.faults().size(); ++i) {
    if (chaos.faults()[i].second_kill || chaos.faults()[i - 1].second_kill) continue;
    const absl::Duration gap = chaos.faults()[i].at - chaos.faults()[i - 1].at;
    EXPECT_GE(gap, options.min_gap);
    EXPECT_LE(gap, options.max_gap + absl::Milliseconds(50));
  }
}

TEST(ChaosTest, TheSameSeedGivesTheSameSchedule) {
  ChaosOptions options;
  options.faults = 40;
  auto run = [&](uint64_t seed) {
    options.seed = seed;
    Chaos chaos(options, Cluster(), kT0);
    Recorder target({"coordinator", "server 0", "worker 0", "worker 1", "worker 2", "worker 3"});
    RunToEnd(chaos, target);
    std::vector<std::string> out;
    for (const Fault& f : chaos.faults()) {
      out.push_back(absl::StrCat(absl::FormatTime(f.at), f.target, f.second_kill));
    }
    return out;
  };
  EXPECT_EQ(run(3), run(3));
  EXPECT_NE(run(3), run(4));
}

TEST(ChaosTest, WithoutNamespacesOnlyKillsAndNeverAProcessThatIsDown) {
  ChaosOptions options;
  options.faults = 60;
  options.min_gap = absl::Milliseconds(100);  // faster than the restarts
  options.max_gap = absl::Milliseconds(200);
  Chaos chaos(options, {{"coordinator", ""}, {"worker 0", ""}, {"worker 1", ""}}, kT0);
  Recorder target({"coordinator", "worker 0", "worker 1"});
  target.restart_after = absl::Seconds(2);
  RunToEnd(chaos, target);
  EXPECT_TRUE(target.links.empty());
  int skipped = 0;
  for (const Fault& f : chaos.faults()) {
    EXPECT_EQ(f.kind, FaultKind::kKill);
    if (!f.outcome.empty()) ++skipped;  // recorded, not done (Recorder checks Running)
  }
  EXPECT_GT(skipped, 0) << "every victim was down at some fault: those are recorded as such";
}

TEST(ChaosTest, HealAllBringsOpenCutsUp) {
  ChaosOptions options;
  options.faults = 1;
  options.cut_share = 1.0;
  options.coordinator_share = 0.0;
  options.min_cut = options.max_cut = absl::Hours(1);
  Chaos chaos(options, Cluster(), kT0);
  Recorder target({"coordinator", "server 0", "worker 0", "worker 1", "worker 2", "worker 3"});
  target.now = kT0 + absl::Seconds(10);
  chaos.Tick(target.now, target);
  ASSERT_EQ(target.down.size(), 1u);
  EXPECT_FALSE(chaos.Done());
  chaos.HealAll(target);
  EXPECT_TRUE(target.down.empty());
  EXPECT_TRUE(chaos.Done());
}

TEST(ChaosTest, BadOptionsAreRefused) {
  ChaosOptions o;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.max_gap = absl::Seconds(1);
  EXPECT_FALSE(ValidateOptions(o).ok());
  o = ChaosOptions();
  o.cut_share = 0.9;
  o.coordinator_share = 0.2;
  EXPECT_FALSE(ValidateOptions(o).ok());
  o = ChaosOptions();
  o.coordinator_twice_share = -1;
  EXPECT_FALSE(ValidateOptions(o).ok());
  o = ChaosOptions();
  o.faults = -1;
  EXPECT_FALSE(ValidateOptions(o).ok());
}

}  // namespace
}  // namespace onebit::chaos
