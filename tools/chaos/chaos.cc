#include "tools/chaos/chaos.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace onebit::chaos {
namespace {

constexpr char kCoordinator[] = "coordinator";
// A coordinator's second kill waits this long at most for the restarted one to run.
constexpr absl::Duration kSecondKillPatience = absl::Seconds(10);

}  // namespace

absl::Status ValidateOptions(const ChaosOptions& o) {
  const auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (o.faults < 0) return bad(absl::StrCat("faults must be >= 0, got ", o.faults));
  if (o.min_gap <= absl::ZeroDuration() || o.max_gap < o.min_gap) {
    return bad("the gap between faults must be > 0 and min <= max");
  }
  if (o.min_cut <= absl::ZeroDuration() || o.max_cut < o.min_cut) {
    return bad("a cut's length must be > 0 and min <= max");
  }
  for (const auto& [name, share] : {std::pair<const char*, double>{"cut_share", o.cut_share},
                                    {"coordinator_share", o.coordinator_share},
                                    {"coordinator_twice_share", o.coordinator_twice_share}}) {
    if (!(share >= 0 && share <= 1)) return bad(absl::StrCat(name, " must be in [0, 1]"));
  }
  if (o.cut_share + o.coordinator_share > 1) {
    return bad("cut_share + coordinator_share must be <= 1");
  }
  return absl::OkStatus();
}

Chaos::Chaos(const ChaosOptions& options, std::vector<Victim> victims, absl::Time start)
    : options_(options), victims_(std::move(victims)), random_(options.seed) {
  for (const Victim& v : victims_) {
    if (!v.netns.empty() &&
        std::find(namespaces_.begin(), namespaces_.end(), v.netns) == namespaces_.end()) {
      namespaces_.push_back(v.netns);
    }
  }
  next_ = start + Uniform(options_.min_gap, options_.max_gap);
}

absl::Duration Chaos::Uniform(absl::Duration lo, absl::Duration hi) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  return lo + (hi - lo) * u(random_);
}

std::string Chaos::RandomMember(ChaosTarget& target) {
  std::vector<std::string> running;
  for (const Victim& v : victims_) {
    if (v.process != kCoordinator && target.Running(v.process)) running.push_back(v.process);
  }
  if (running.empty()) return "";
  std::uniform_int_distribution<size_t> pick(0, running.size() - 1);
  return running[pick(random_)];
}

void Chaos::Tick(absl::Time now, ChaosTarget& target) {
  for (auto it = cut_until_.begin(); it != cut_until_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    if (absl::Status s = target.SetLink(it->first, true); !s.ok()) {
      errors_.push_back(absl::StrCat("healing ", it->first, ": ", s.ToString()));
    }
    it = cut_until_.erase(it);
  }
  if (second_kill_at_ <= now) {
    if (target.Running(kCoordinator) || now > second_kill_at_ + kSecondKillPatience) {
      Fault f;
      f.at = now;
      f.target = kCoordinator;
      f.second_kill = true;
      if (!target.Running(kCoordinator)) {
        f.outcome = "not running";
      } else if (absl::Status s = target.Kill(kCoordinator); !s.ok()) {
        f.outcome = s.ToString();
      }
      faults_.push_back(f);
      ++injected_;
      second_kill_at_ = absl::InfiniteFuture();
      next_ = now + Uniform(options_.min_gap, options_.max_gap);
    }
    return;
  }
  if (injected_ >= options_.faults || now < next_ || second_kill_at_ != absl::InfiniteFuture()) {
    return;
  }
  Inject(now, target);
  next_ = now + Uniform(options_.min_gap, options_.max_gap);
}

void Chaos::Inject(absl::Time now, ChaosTarget& target) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double r = u(random_);
  Fault f;
  f.at = now;
  const double cut_share = namespaces_.empty() ? 0.0 : options_.cut_share;
  const bool has_coordinator =
      std::any_of(victims_.begin(), victims_.end(),
                  [](const Victim& v) { return v.process == kCoordinator; });
  if (r < cut_share) {
    std::vector<std::string> whole;  // links not cut now
    for (const std::string& ns : namespaces_) {
      if (cut_until_.count(ns) == 0) whole.push_back(ns);
    }
    if (!whole.empty()) {
      std::uniform_int_distribution<size_t> pick(0, whole.size() - 1);
      f.kind = FaultKind::kCut;
      f.target = whole[pick(random_)];
      f.cut_for = Uniform(options_.min_cut, options_.max_cut);
      if (absl::Status s = target.SetLink(f.target, false); !s.ok()) {
        f.outcome = s.ToString();
      } else {
        cut_until_[f.target] = now + f.cut_for;
      }
      faults_.push_back(f);
      ++injected_;
      return;
    }
  }
  f.kind = FaultKind::kKill;
  if (has_coordinator && r >= cut_share && r < cut_share + options_.coordinator_share) {
    f.target = kCoordinator;
    if (u(random_) < options_.coordinator_twice_share && injected_ + 2 <= options_.faults) {
      second_kill_at_ = now + Uniform(absl::Seconds(1), absl::Seconds(4));
    }
  } else {
    f.target = RandomMember(target);
  }
  if (f.target.empty()) {
    f.outcome = "no member running";
  } else if (!target.Running(f.target)) {
    f.outcome = "not running";
  } else if (absl::Status s = target.Kill(f.target); !s.ok()) {
    f.outcome = s.ToString();
  }
  faults_.push_back(f);
  ++injected_;
}

void Chaos::HealAll(ChaosTarget& target) {
  for (const auto& [ns, until] : cut_until_) {
    if (absl::Status s = target.SetLink(ns, true); !s.ok()) {
      errors_.push_back(absl::StrCat("healing ", ns, ": ", s.ToString()));
    }
  }
  cut_until_.clear();
  second_kill_at_ = absl::InfiniteFuture();
}

bool Chaos::Done() const {
  return injected_ >= options_.faults && cut_until_.empty() &&
         second_kill_at_ == absl::InfiniteFuture();
}

}  // namespace onebit::chaos
