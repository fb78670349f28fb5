// The fp8 kernels on host memory (fp8_e4m3.h is the contract): what the codec runs on a
// backend with host addresses (the CPU backend, the simulated device). Plain loops on the
// calling thread: the blocks are independent and simple, and one thread is enough for the
// CPU jobs (BENCHMARKS.md, "fp8 compressor", has its cost). They evaluate the functions of
// fp8_e4m3.h that the CUDA kernels evaluate too, so both give the same bits.
//
// The arguments are the codec's (compression/codec.h), already checked by it, with host
// pointers.
#ifndef ONEBIT_COMPRESSION_FP8_FP8_CPU_H_
#define ONEBIT_COMPRESSION_FP8_FP8_CPU_H_

#include <cstddef>
#include <cstdint>

namespace onebit::fp8::cpu {

void CompressWorker(const float* m, const float* g, float beta1, size_t n, size_t num_chunks,
                    size_t chunk, float* err, uint8_t* out);

void ServerAggregate(const uint8_t* blocks, int num_workers, size_t chunk, float* err,
                     uint8_t* out);

void Decode(const uint8_t* blocks, size_t num_chunks, size_t chunk, size_t n, float* out);

}  // namespace onebit::fp8::cpu

#endif  // ONEBIT_COMPRESSION_FP8_FP8_CPU_H_
