// Process-wide signal set-up every onebit main (binaries and test mains) does first.
//
// SIGPIPE: a peer that vanishes while this process writes to its socket must surface as an
// EPIPE error from the write (and then a clear status from the transport), never kill the
// process. gloo, gRPC and cpp-httplib do not all pass MSG_NOSIGNAL on every send, so the
// signal is ignored for the whole process.
#ifndef ONEBIT_COMMON_SIGNALS_H_
#define ONEBIT_COMMON_SIGNALS_H_

namespace onebit {

// Sets SIGPIPE to SIG_IGN. Idempotent; call it at the top of main().
void IgnoreSigpipe();

}  // namespace onebit

#endif  // ONEBIT_COMMON_SIGNALS_H_
