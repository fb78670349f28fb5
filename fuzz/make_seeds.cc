// Writes the binary seeds of fuzz/corpus/ with the project's own encoders, so the seeds are
// what the decoders really meet: checkpoint parts (EncodePart), manifests (WriteManifest),
// .npy files (WriteFloat32), a job config (JobConfigToJson), compressed blocks
// (CompressWorker) and shard push scripts made of real blocks. The text seeds (REST
// scripts, configs) are written by hand in the corpus.
//
//   bazel run //fuzz:make_seeds -- "$PWD/fuzz/corpus"
//
// Deterministic: running it again rewrites the same bytes.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "common/npy.h"
#include "compression/layout.h"
#include "config/job_config.h"
#include "kernels/kernels.h"

namespace onebit {
namespace {

namespace fs = std::filesystem;

std::string root;  // the corpus directory

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(root) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.7f * static_cast<float>(i) + 0.3f);
  return v;
}

template <typename T>
void Append(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void Parts() {
  checkpoint::Part worker;
  worker.PutMetaInt("step", 10);
  worker.meta["role"] = "worker";
  worker.PutMetaInt("rank", 1);
  worker.meta["topology"] = "ps servers=2";
  worker.PutMetaInt("slice_begin", 40);
  worker.PutMetaInt("slice_end", 77);
  worker.Put("params", Ramp(37, 1.0f));
  worker.Put("exp_avg", Ramp(37, 0.01f));
  worker.Put("exp_avg_sq", Ramp(37, 1e-4f));
  worker.Put("worker_error", Ramp(80, 0.001f));
  Write("part_fuzzer", "worker.part", checkpoint::EncodePart(worker));

  checkpoint::Part server;
  server.PutMetaInt("step", 10);
  server.meta["role"] = "server";
  server.PutMetaInt("rank", 0);
  server.Put("server_error", Ramp(40, 0.002f));
  Write("part_fuzzer", "server.part", checkpoint::EncodePart(server));

  Write("part_fuzzer", "empty.part", checkpoint::EncodePart(checkpoint::Part()));

  checkpoint::Part shapes;
  checkpoint::Tensor matrix;
  matrix.shape = {2, 3};
  matrix.data = Ramp(6, 1.0f);
  shapes.tensors["matrix"] = matrix;
  checkpoint::Tensor empty;
  empty.shape = {0};
  shapes.tensors["empty"] = empty;
  checkpoint::Tensor scalar;
  scalar.data = {1.5f};
  shapes.tensors["scalar"] = scalar;
  // Empty, though its first dimension is more than the bytes after it (last by name).
  checkpoint::Tensor no_columns;
  no_columns.shape = {30, 0};
  shapes.tensors["zz_no_columns"] = no_columns;
  Write("part_fuzzer", "shapes.part", checkpoint::EncodePart(shapes));
}

void Manifests() {
  const std::string dir = (fs::temp_directory_path() / "onebit-make-seeds-step-000000010").string();
  fs::create_directories(dir);
  v1::CheckpointManifest m;
  m.set_version(checkpoint::kManifestVersion);
  m.set_job_id("onebit-job");
  m.set_step(10);
  m.set_freeze_step(50);
  m.set_world_size(2);
  m.set_num_servers(0);
  m.set_exchange_mode("peer");
  m.set_num_parameters(1000);
  m.set_optimizer("OneBitAdam");
  m.set_created_unix_ms(1700000000000);
  m.set_reason("every 10 steps");
  for (int rank = 0; rank < 2; ++rank) {
    v1::CheckpointPart* part = m.add_parts();
    part->set_role(v1::ROLE_WORKER);
    part->set_rank(rank);
    part->set_file(checkpoint::PartFileName(v1::ROLE_WORKER, rank));
    part->set_bytes(1234 + rank);
    part->set_crc32(0xdeadbeef);
  }
  if (!checkpoint::WriteManifest(dir, m).ok()) std::exit(1);
  Write("manifest_fuzzer", "two_workers.json", ReadFile(checkpoint::JoinPath(dir, "MANIFEST.json")));

  m.set_exchange_mode("ps servers=1");
  m.set_num_servers(1);
  m.set_freeze_step(-1);
  v1::CheckpointPart* server = m.add_parts();
  server->set_role(v1::ROLE_SERVER);
  server->set_rank(0);
  server->set_file(checkpoint::PartFileName(v1::ROLE_SERVER, 0));
  server->set_bytes(200);
  server->set_crc32(7);
  if (!checkpoint::WriteManifest(dir, m).ok()) std::exit(1);
  Write("manifest_fuzzer", "with_server.json", ReadFile(checkpoint::JoinPath(dir, "MANIFEST.json")));

  fs::remove_all(dir);
  Write("manifest_fuzzer", "minimal.json", R"({"version": 1, "step": "10"})");
}

void Npy() {
  const std::string path = (fs::temp_directory_path() / "onebit-make-seeds.npy").string();
  auto one = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::vector<float> data = Ramp(static_cast<size_t>(npy::NumElements(shape)), 1.0f);
    if (!npy::WriteFloat32(path, shape, data.data()).ok()) std::exit(1);
    Write("npy_fuzzer", name, ReadFile(path));
  };
  one("vector.npy", {5});
  one("matrix.npy", {2, 3});
  one("scalar.npy", {});
  one("empty.npy", {0});
  one("stream.npy", {2, 2, 3});
  fs::remove(path);

  // Version 2.0 (4-byte header length), which WriteFloat32 only writes for huge headers.
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  while ((12 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string v2 = "\x93NUMPY";
  v2 += '\x02';
  v2 += '\x00';
  Append<uint32_t>(&v2, static_cast<uint32_t>(header.size()));
  v2 += header;
  Append<float>(&v2, 1.0f);
  Append<float>(&v2, -2.5f);
  Write("npy_fuzzer", "version2.npy", v2);
}

void JobConfigs() {
  Write("job_config_fuzzer", "defaults.json", JobConfigToJson(JobConfig()));
}

// kernels_fuzzer's input: u8 num_chunks-1, u8 chunk code, u16 n, u8 workers-1, blocks, then
// v, m, p, mask values.
void KernelBlocks() {
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend(false);
  auto seed = [&](const std::string& name, size_t num_chunks, size_t chunk, size_t n, int workers) {
    std::vector<float> m = Ramp(n, 0.1f), err(num_chunks * chunk, 0.0f);
    std::vector<uint8_t> blocks(num_chunks * kernels::CompressedBlockBytes(chunk));
    if (!backend->CompressWorker(m.data(), nullptr, 0.9f, n, num_chunks, chunk, err.data(),
                                 blocks.data())
             .ok()) {
      std::exit(1);
    }
    std::string out;
    Append<uint8_t>(&out, static_cast<uint8_t>(num_chunks - 1));
    Append<uint8_t>(&out, static_cast<uint8_t>(chunk / 8 - 1));
    Append<uint16_t>(&out, static_cast<uint16_t>(n));
    Append<uint8_t>(&out, static_cast<uint8_t>(workers - 1));
    out.append(reinterpret_cast<const char*>(blocks.data()), blocks.size());
    for (size_t i = 0; i < n; ++i) {
      Append<float>(&out, 1e-4f * static_cast<float>(i + 1));  // v
      Append<float>(&out, m[i]);                                  // m
      Append<float>(&out, 1.0f);                                  // p
      Append<uint8_t>(&out, static_cast<uint8_t>(i % 5 != 0));    // mask
    }
    Write("kernels_fuzzer", name, out);
  };
  seed("one_chunk.bin", 1, 64, 60, 1);
  seed("four_chunks.bin", 4, 16, 64, 3);
  seed("padded.bin", 2, 8, 13, 2);
  // int8 (bit 7 of the workers byte): int8 blocks, then m values.
  auto seed_int8 = [&](const std::string& name, size_t num_chunks, size_t chunk, size_t n,
                       int workers) {
    std::vector<float> m = Ramp(n, 0.1f), err(num_chunks * chunk, 0.0f);
    std::vector<uint8_t> blocks(num_chunks * kernels::Int8BlockBytes(chunk));
    if (!backend->CompressWorkerInt8(m.data(), nullptr, 0.9f, n, num_chunks, chunk, err.data(),
                                     blocks.data())
             .ok()) {
      std::exit(1);
    }
    std::string out;
    Append<uint8_t>(&out, static_cast<uint8_t>(num_chunks - 1));
    Append<uint8_t>(&out, static_cast<uint8_t>(chunk / 8 - 1));
    Append<uint16_t>(&out, static_cast<uint16_t>(n));
    Append<uint8_t>(&out, static_cast<uint8_t>(0x80 | (workers - 1)));
    out.append(reinterpret_cast<const char*>(blocks.data()), blocks.size());
    for (size_t i = 0; i < n; ++i) Append<float>(&out, m[i]);
    Write("kernels_fuzzer", name, out);
  };
  seed_int8("int8_one_chunk.bin", 1, 64, 60, 1);
  seed_int8("int8_padded.bin", 3, 8, 19, 3);
}

// shard_push_fuzzer's input: header (u8 workers-1, u8 shards-1, u8 shard, u16 n-1, u8 flags)
// then operations (u8 worker, u8 step code, u8 chunk, u8 kind, u8 op, payload).
void ShardPushes() {
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend(false);
  auto header = [](int workers, int shards, int shard, int n, uint8_t flags) {
    std::string out;
    Append<uint8_t>(&out, static_cast<uint8_t>(workers - 1));
    Append<uint8_t>(&out, static_cast<uint8_t>(shards - 1));
    Append<uint8_t>(&out, static_cast<uint8_t>(shard));
    Append<uint16_t>(&out, static_cast<uint16_t>(n - 1));
    Append<uint8_t>(&out, flags);
    return out;
  };
  // step code 0 repeats the current step, 1 is the next one.
  auto op = [](std::string* out, int worker, uint8_t step_code, int shard, ChunkKind kind,
               uint8_t flags, const std::string& payload) {
    Append<uint8_t>(out, static_cast<uint8_t>(worker));
    Append<uint8_t>(out, step_code);
    Append<uint8_t>(out, static_cast<uint8_t>(shard));
    Append<uint8_t>(out, static_cast<uint8_t>(static_cast<int>(kind) - 1));
    Append<uint8_t>(out, flags);
    *out += payload;
  };
  const int workers = 2, shards = 2, shard = 1, n = 37;
  absl::StatusOr<PsLayout> layout = PsLayout::Create(n, shards);
  if (!layout.ok()) std::exit(1);
  auto fp32 = [&](int worker) {
    const std::vector<float> g = Ramp(n, 0.5f + static_cast<float>(worker));
    return std::string(reinterpret_cast<const char*>(g.data() + layout->fp32_offset(shard)),
                       layout->fp32_count(shard) * sizeof(float));
  };
  auto onebit = [&](int worker) {
    std::vector<float> m = Ramp(n, 0.1f * static_cast<float>(worker + 1));
    std::vector<float> err(layout->padded_size(), 0.0f);
    std::vector<uint8_t> blocks(shards * layout->block_bytes());
    if (!backend
             ->CompressWorker(m.data(), nullptr, 0.9f, n, shards, layout->chunk(), err.data(),
                              blocks.data())
             .ok()) {
      std::exit(1);
    }
    return std::string(reinterpret_cast<const char*>(blocks.data()) + shard * layout->block_bytes(),
                       layout->block_bytes());
  };

  // Warmup step 1, then compression steps 2 and 3, with a retry and a checkpoint flag.
  std::string steps = header(workers, shards, shard, n, 0x81);
  op(&steps, 0, 0, shard, ChunkKind::kFp32, 0, fp32(0));
  op(&steps, 1, 0, shard, ChunkKind::kFp32, 0, fp32(1));
  op(&steps, 1, 0, shard, ChunkKind::kFp32, 0, fp32(1));  // retry of a finished step
  op(&steps, 0, 1, shard, ChunkKind::kOnebit, 0, onebit(0));
  op(&steps, 1, 0, shard, ChunkKind::kOnebit, 1, onebit(1));  // completes, checkpoint
  op(&steps, 0, 1, shard, ChunkKind::kOnebit, 4, "");         // asks for step 3's result
  op(&steps, 0, 1, shard, ChunkKind::kOnebit, 0, onebit(1));
  op(&steps, 1, 0, shard, ChunkKind::kOnebit, 0, onebit(0));
  Write("shard_push_fuzzer", "warmup_then_compression.bin", steps);

  // A conflicting duplicate and a wrong-size push.
  std::string conflicts = header(workers, shards, shard, n, 0x00);
  op(&conflicts, 0, 0, shard, ChunkKind::kOnebit, 0, onebit(0));
  op(&conflicts, 0, 0, shard, ChunkKind::kOnebit, 0, onebit(1));
  std::string wrong_size;
  Append<uint16_t>(&wrong_size, 3);
  wrong_size += "abc";
  op(&conflicts, 1, 0, shard, ChunkKind::kOnebit, 2, wrong_size);
  Write("shard_push_fuzzer", "conflicts.bin", conflicts);

  // Restoring the server error before the first push, then one worker alone.
  std::string restore = header(1, 1, 0, 16, 0x01);
  absl::StatusOr<PsLayout> single = PsLayout::Create(16, 1);
  const std::vector<float> error = Ramp(single->chunk(), 0.01f);
  std::string floats;
  Append<uint16_t>(&floats, static_cast<uint16_t>(error.size() * sizeof(float)));
  floats.append(reinterpret_cast<const char*>(error.data()), error.size() * sizeof(float));
  op(&restore, 0, 0, 0, ChunkKind::kOnebit, 8 | 2, floats);
  std::string block(single->block_bytes(), '\x5a');
  const float scale = 0.25f;
  std::memcpy(block.data(), &scale, sizeof(scale));
  op(&restore, 0, 0, 0, ChunkKind::kOnebit, 0, block);
  Write("shard_push_fuzzer", "restore.bin", restore);

  // int8 (flags bit 6): two compression steps of real int8 blocks.
  absl::StatusOr<PsLayout> layout8 = PsLayout::Create(n, shards, Int8Codec());
  if (!layout8.ok()) std::exit(1);
  auto int8 = [&](int worker) {
    std::vector<float> m = Ramp(n, 0.1f * static_cast<float>(worker + 1));
    std::vector<float> err(layout8->padded_size(), 0.0f);
    std::vector<uint8_t> blocks(shards * layout8->block_bytes());
    if (!backend
             ->CompressWorkerInt8(m.data(), nullptr, 0.9f, n, shards, layout8->chunk(), err.data(),
                                  blocks.data())
             .ok()) {
      std::exit(1);
    }
    return std::string(reinterpret_cast<const char*>(blocks.data()) + shard * layout8->block_bytes(),
                       layout8->block_bytes());
  };
  std::string steps8 = header(workers, shards, shard, n, 0x41);
  op(&steps8, 0, 0, shard, ChunkKind::kOnebit, 0, int8(0));
  op(&steps8, 1, 0, shard, ChunkKind::kOnebit, 0, int8(1));
  op(&steps8, 0, 1, shard, ChunkKind::kOnebit, 0, int8(1));
  op(&steps8, 1, 0, shard, ChunkKind::kOnebit, 0, int8(0));
  op(&steps8, 1, 0, shard, ChunkKind::kOnebit, 0, onebit(0));  // a 1-bit block: wrong size
  Write("shard_push_fuzzer", "int8_compression.bin", steps8);
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  onebit::root = argv[1];
  onebit::Parts();
  onebit::Manifests();
  onebit::Npy();
  onebit::JobConfigs();
  onebit::KernelBlocks();
  onebit::ShardPushes();
  return 0;
}
