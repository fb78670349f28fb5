// Watches a worker's loss for the compression stage's silent blow-up. After the freeze the
// compressed momentum moves every element by +-scale, and an element whose variance froze
// at (nearly) zero moves by about scale / eps: with a small eps the loss jumps by orders of
// magnitude within a few steps, often without reaching NaN (which the trainer already
// stops on). The watch compares each compression-stage loss with the warmup's last losses
// and says once, with the likely cause and the fixes, when it exceeds them by `factor`.
// Not thread-safe: the trainer's thread calls it.
#ifndef ONEBIT_WORKER_DIVERGENCE_WATCH_H_
#define ONEBIT_WORKER_DIVERGENCE_WATCH_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace onebit {

class DivergenceWatch {
 public:
  // `factor`: how many times the warmup's baseline (the mean of its last `window` losses)
  // a compression-stage loss must exceed to be reported.
  explicit DivergenceWatch(double factor = 100.0, int window = 10)
      : factor_(factor), window_(window) {}

  // Step t's loss (finite; a step without one is not observed) in the warmup or the
  // compression stage. Returns the warning the first time a compression-stage loss exceeds
  // the baseline by `factor`; nullopt otherwise, and always after that once. `eps` and
  // `update_clip` are the optimizer's (the warning names them).
  std::optional<std::string> Observe(int64_t step, bool compression, double loss, double eps,
                                     double update_clip);

 private:
  const double factor_;
  const size_t window_;
  std::deque<double> warmup_;  // the last `window` warmup losses
  bool warned_ = false;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_DIVERGENCE_WATCH_H_
