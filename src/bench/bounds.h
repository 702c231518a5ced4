// The physical bounds a benchmark figure stands beside (DESIGN.md "How speed is
// shown"): the bytes a decode step must read and the FLOPs a prefill token
// costs, from the checkpoint; and the machine's rates, measured by the same
// run through the backend seam (so a CUDA run measures device memory and the
// pinned-host-to-device link, a CPU run host memory).
//
// Not thread-safe; probes run on the caller's thread and synchronize the
// backend.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace moetier {

class Backend;
class Checkpoint;
class ExpertIndex;
struct ModelSpec;

struct ModelBytes {
  uint64_t total = 0;         // every tensor of the checkpoint
  uint64_t experts = 0;       // every routed expert (logical bytes)
  uint64_t core = 0;          // total - experts
  uint64_t expert_bytes = 0;  // one expert (the largest)
  // Read by one decode step: the core (of the embedding table only one row)
  // plus experts_per_token experts of every MoE layer.
  uint64_t active_per_token = 0;
  // Matrix FLOPs of one prefill token: 2 x (core matrix parameters without the
  // embedding + k x 3 x H x I per MoE layer). Attention's T-dependent FLOPs
  // are not counted (the bound is optimistic by that much).
  double flops_per_token = 0;
  nlohmann::json to_json() const;
};

ModelBytes model_bytes(const Checkpoint& ck, const ModelSpec& spec, const ExpertIndex& index);

struct Bounds {
  std::optional<double> device_copy;     // bytes read + written per second
  std::optional<double> host_read;       // bytes/s read by every kernel thread (host backends)
  std::optional<double> host_to_device;  // bytes/s from pinned host memory
  std::optional<double> storage;         // bytes/s, random O_DIRECT expert reads
  std::optional<double> tensor_flops;    // bf16 matmul FLOP/s (a large chunk)
  nlohmann::json to_json() const;
};

// Device-to-device copy of 1 GiB (64 MiB on the host), best of 5.
double probe_device_copy(Backend& be);
// Host memory read by the kernels' threads (core/thread_pool.h) side by side,
// 1 GiB (past any cache; written first by the threads that read it), best of
// 3: a host backend's decode bound. `moetier bench` takes it before loading
// the model, so its buffer is not in the run's peak resident memory.
double probe_host_read();
// Pinned host to device, 256 MiB (32 MiB on the host), best of 5.
double probe_host_to_device(Backend& be);
// bf16 weight [4096, 4096] times 4096 tokens (on the host [1024, 1024] x 128), best of 3.
double probe_tensor_flops(Backend& be);
// Up to 64 random experts (at most 1 GiB) read with O_DIRECT at queue depth 16
// from the checkpoint's shards; nullopt when the model has no experts.
std::optional<double> probe_storage(const Checkpoint& ck, const ExpertIndex& index);

}  // namespace moetier
