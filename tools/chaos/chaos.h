// The fault schedule of onebit-chaos: at random times, SIGKILL a random member of a running
// job (the coordinator among them, sometimes twice within seconds) or cut a random host's
// link (the link set down inside its network namespace: no RST, no FIN, as a failed switch
// port or cable looks) for a while, then heal it. What a fault does goes through a
// ChaosTarget, and time and randomness are passed in, so a schedule is reproducible from
// its seed and testable without processes.
//
// Not thread-safe: the job's supervisor calls Tick from its poll loop.
#ifndef ONEBIT_TOOLS_CHAOS_CHAOS_H_
#define ONEBIT_TOOLS_CHAOS_CHAOS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace onebit::chaos {

// A process of the job and the network namespace of its host ("": this namespace, whose
// link is not cut).
struct Victim {
  std::string process;  // "coordinator", "server 0", "worker 3", ...
  std::string netns;
};

struct ChaosOptions {
  uint64_t seed = 1;
  int faults = 100;  // faults to inject, a coordinator's second kill counting as one
  // Time between one fault and the next, uniform in [min_gap, max_gap].
  absl::Duration min_gap = absl::Seconds(3);
  absl::Duration max_gap = absl::Seconds(8);
  // How long a link stays down, uniform in [min_cut, max_cut].
  absl::Duration min_cut = absl::Seconds(2);
  absl::Duration max_cut = absl::Seconds(12);
  // Shares of the faults: link cuts (when some victim has a namespace), kills of the
  // coordinator; the rest kill a worker or a shard. Of the coordinator's kills, this share
  // is followed by a second one 1 to 4 s later (the restarted coordinator killed again).
  double cut_share = 0.3;
  double coordinator_share = 0.15;
  double coordinator_twice_share = 0.4;
};

// absl::OkStatus, or INVALID_ARGUMENT naming the bad field.
absl::Status ValidateOptions(const ChaosOptions& options);

enum class FaultKind { kKill, kCut };

struct Fault {
  absl::Time at;
  FaultKind kind = FaultKind::kKill;
  std::string target;        // the process killed, or the namespace whose link was cut
  absl::Duration cut_for;    // kCut: how long
  bool second_kill = false;  // the coordinator's second kill within seconds
  std::string outcome;       // "" when done; else why not (the process was not running)
};

// What the faults act on (onebit-chaos: LocalJob and `ip`; tests: a recorder).
class ChaosTarget {
 public:
  virtual ~ChaosTarget() = default;
  // Whether the process runs now (a fault on a process between exit and restart would
  // be no fault at all).
  virtual bool Running(const std::string& process) = 0;
  virtual absl::Status Kill(const std::string& process) = 0;
  virtual absl::Status SetLink(const std::string& netns, bool up) = 0;
};

class Chaos {
 public:
  // The first fault comes one gap after `start`. `victims` must not be empty.
  Chaos(const ChaosOptions& options, std::vector<Victim> victims, absl::Time start);

  // Does what is due at `now`: heals the cuts whose time is up, then injects the next
  // fault if its time has come. A victim that is not running is skipped for another
  // (recorded with its outcome when none runs).
  void Tick(absl::Time now, ChaosTarget& target);
  // Brings every cut link up again (at the end, or when the job ended early).
  void HealAll(ChaosTarget& target);

  // Every fault injected and every link healed.
  bool Done() const;
  const std::vector<Fault>& faults() const { return faults_; }
  // Healing that failed (a link left down would spoil the next run): the errors.
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  absl::Duration Uniform(absl::Duration lo, absl::Duration hi);
  void Inject(absl::Time now, ChaosTarget& target);
  // A running victim other than the coordinator, chosen at random; "" if none runs.
  std::string RandomMember(ChaosTarget& target);

  ChaosOptions options_;
  std::vector<Victim> victims_;
  std::vector<std::string> namespaces_;  // distinct, non-empty
  std::mt19937_64 random_;
  absl::Time next_;
  absl::Time second_kill_at_ = absl::InfiniteFuture();  // the coordinator's, when due
  std::map<std::string, absl::Time> cut_until_;          // netns -> heal time
  int injected_ = 0;
  std::vector<Fault> faults_;
  std::vector<std::string> errors_;
};

}  // namespace onebit::chaos

#endif  // ONEBIT_TOOLS_CHAOS_CHAOS_H_
