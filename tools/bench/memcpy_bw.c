// The machine's memcpy bandwidth, the baseline of the bench's bound: P processes (default:
// one per core) each copy a 256 MiB buffer REPEAT times at the same time; prints the
// aggregate bandwidth over all of them, counting a copy of B bytes as 2B moved (B read,
// B written), as kernels/cpu_kernels_benchmark does. Best of REPEAT per process.
//
//   memcpy_bw [P] [REPEAT]      -> "memcpy_gbps <aggregate> per_process <best single>"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int procs = argc > 1 ? atoi(argv[1]) : (int)(cores > 0 ? cores : 1);
  const int repeat = argc > 2 ? atoi(argv[2]) : 5;
  const size_t bytes = (size_t)256 << 20;
  if (procs < 1 || procs > 64 || repeat < 1) {
    fprintf(stderr, "usage: memcpy_bw [P in 1..64] [REPEAT >= 1]\n");
    return 2;
  }
  int fds[64][2];
  for (int p = 0; p < procs; ++p) {
    if (pipe(fds[p]) != 0) return perror("pipe"), 1;
    if (fork() == 0) {
      char* src = malloc(bytes);
      char* dst = malloc(bytes);
      if (!src || !dst) _exit(1);
      memset(src, 1, bytes);
      memset(dst, 0, bytes);  // touch every page before timing
      double best = 1e30;
      for (int r = 0; r < repeat; ++r) {
        const double t = now();
        memcpy(dst, src, bytes);
        __asm__ volatile("" : : "r"(dst) : "memory");
        const double s = now() - t;
        if (s < best) best = s;
      }
      double gbps = 2.0 * bytes / best / 1e9;
      if (write(fds[p][1], &gbps, sizeof gbps) != sizeof gbps) _exit(1);
      _exit(0);
    }
  }
  double total = 0, single = 0;
  for (int p = 0; p < procs; ++p) {
    double g = 0;
    if (read(fds[p][0], &g, sizeof g) != sizeof g) {
      fprintf(stderr, "memcpy_bw: a process failed\n");
      return 1;
    }
    total += g;
    if (g > single) single = g;
  }
  while (wait(NULL) > 0) {
  }
  printf("memcpy_gbps %.3f per_process %.3f processes %d\n", total, single, procs);
  return 0;
}
