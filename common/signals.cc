#include "common/signals.h"

#include <csignal>

namespace onebit {

void IgnoreSigpipe() { std::signal(SIGPIPE, SIG_IGN); }

}  // namespace onebit
