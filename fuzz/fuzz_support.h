// What every fuzz target shares: a heap budget per input, and a scratch directory for
// decoders that read files.
//
// HEAP BUDGET. Decoders promise to allocate in proportion to their input, never what a
// length field claims. HeapBudget watches the sanitizer allocator (malloc hooks) while one
// input runs and aborts, like any other crash, when the heap grew by more than
// factor * input size + slack at any moment during the call. A target calls
// HeapBudget::Begin() first and End(size) last; it warms its decoder up in
// LLVMFuzzerInitialize, so one-time set-up (descriptor pools, static tables) is not charged
// to the first input.
#ifndef ONEBIT_FUZZ_FUZZ_SUPPORT_H_
#define ONEBIT_FUZZ_FUZZ_SUPPORT_H_

#include <sanitizer/allocator_interface.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/string_view.h"

namespace onebit::fuzz {

class HeapBudget {
 public:
  // Installs the hooks; call once, from LLVMFuzzerInitialize.
  static void Install() {
    static bool installed = [] {
      __sanitizer_install_malloc_and_free_hooks(&OnMalloc, &OnFree);
      return true;
    }();
    (void)installed;
  }

  static void Begin() {
    live().store(0, std::memory_order_relaxed);
    peak().store(0, std::memory_order_relaxed);
  }

  // Aborts when the heap grew by more than factor * input_size + slack during the input.
  static void End(size_t input_size, size_t factor, size_t slack) {
    const int64_t limit = static_cast<int64_t>(factor * input_size + slack);
    const int64_t used = peak().load(std::memory_order_relaxed);
    if (used > limit) {
      std::fprintf(stderr,
                   "fuzz: heap budget exceeded: the heap grew by %lld bytes for an input of "
                   "%zu bytes (budget %zu * size + %zu = %lld)\n",
                   static_cast<long long>(used), input_size, factor, slack,
                   static_cast<long long>(limit));
      std::abort();
    }
  }

 private:
  static std::atomic<int64_t>& live() {
    static std::atomic<int64_t> v{0};
    return v;
  }
  static std::atomic<int64_t>& peak() {
    static std::atomic<int64_t> v{0};
    return v;
  }
  static void OnMalloc(const volatile void* /*ptr*/, size_t size) {
    const int64_t now = live().fetch_add(static_cast<int64_t>(size), std::memory_order_relaxed) +
                        static_cast<int64_t>(size);
    int64_t seen = peak().load(std::memory_order_relaxed);
    while (now > seen && !peak().compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  static void OnFree(const volatile void* ptr) {
    if (ptr == nullptr || !__sanitizer_get_ownership(const_cast<const void*>(ptr))) return;
    live().fetch_sub(
        static_cast<int64_t>(__sanitizer_get_allocated_size(const_cast<const void*>(ptr))),
        std::memory_order_relaxed);
  }
};

// A directory of this process's own, made once (under $TEST_TMPDIR or $TMPDIR or /tmp) and
// removed when the process exits normally. Every input overwrites the same few files.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr || *base == '\0') base = std::getenv("TMPDIR");
    if (base == nullptr || *base == '\0') base = "/tmp";
    std::string pattern = std::string(base) + "/onebit-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] { std::filesystem::remove_all(ScratchDir()); });
    return new std::string(pattern);
  }();
  return *dir;
}

// ONEBIT_FUZZ_VERBOSE=1 in the environment: targets say on stderr what each input did
// (the decoder's status), to check seeds and to read a crash's input.
inline bool Verbose() {
  static const bool verbose = [] {
    const char* v = std::getenv("ONEBIT_FUZZ_VERBOSE");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }();
  return verbose;
}

template <typename StatusLike>
void Say(const char* what, const StatusLike& status) {
  if (!Verbose()) return;
  std::fprintf(stderr, "fuzz: %s: %s\n", what, status.ToString().c_str());
}

// The canary proves that a crash fails the run (fuzz_test.sh checks it): with
// ONEBIT_FUZZ_CANARY=1 in the environment, an input starting with "ONEBIT-FUZZ-CANARY"
// makes a target write past a heap block (AddressSanitizer must stop it), and one starting
// with "ONEBIT-FUZZ-CANARY-HEAP" makes it hold 64 MiB (the heap budget must stop it).
// Every target calls Canary first; without the variable it does nothing.
inline void Canary(const uint8_t* data, size_t size) {
  static const bool armed = [] {
    const char* v = std::getenv("ONEBIT_FUZZ_CANARY");
    return v != nullptr && std::string(v) == "1";
  }();
  if (!armed) return;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  if (input.substr(0, 23) == "ONEBIT-FUZZ-CANARY-HEAP") {
    static volatile char* hold;
    hold = new char[64 << 20];
    hold[0] = 1;
    delete[] hold;
  } else if (input.substr(0, 18) == "ONEBIT-FUZZ-CANARY") {
    volatile char* block = new char[size];
    block[size] = 1;  // one past the end
    delete[] block;
  }
}

// Silences the coordinator's log lines (coordinator/log.h) unless ONEBIT_FUZZ_VERBOSE is
// set: a line per input would cost more than the input. Call from LLVMFuzzerInitialize.
inline void QuietLogs() {
  if (!Verbose()) setenv("ONEBIT_QUIET", "1", /*overwrite=*/0);
}

// Writes `bytes` to `path` (replacing it); aborts on failure, which is the harness's, not
// the decoder's.
inline void WriteFileOrDie(const std::string& path, absl::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) ||
      std::fclose(f) != 0) {
    std::perror(("fuzz: writing " + path).c_str());
    std::abort();
  }
}

// Fails the run, like a crash, when an invariant of a successful decode does not hold.
#define ONEBIT_FUZZ_CHECK(cond)                                                   \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "fuzz: %s:%d: check failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                        \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

}  // namespace onebit::fuzz

#endif  // ONEBIT_FUZZ_FUZZ_SUPPORT_H_
