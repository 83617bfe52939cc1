// NCCL between GPUs (docs/gpu.md, "Data parallel"): a communicator over the ranks of a Loom
// communicator, each on its own CUDA device, for the gradients' all-reduce on the devices.
// nccl_group.cc where CMake finds NCCL (LOOM_NCCL, AUTO by default), nccl_unavailable.cc
// otherwise; the library is opened on first use (dlopen, as cuBLAS: cublas.h says why), so
// a loom that never trains on several GPUs never loads it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

namespace loom::comm {
class Communicator;
}

namespace loom::gpu {

class NcclGroup {
 public:
  // Whether this build has NCCL (its header was found).
  static bool compiled();
  // An NCCL communicator over `world`'s ranks, each on its current CUDA device: rank 0's
  // unique id reaches the others through `world`. Collective over world. RuntimeError
  // naming NCCL's reason when it cannot be opened or initialised (two ranks on one device
  // among them), or where this build has no NCCL.
  static std::unique_ptr<NcclGroup> create(comm::Communicator& world);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  // data (count f32 on the device) summed over the ranks in place, queued on `stream`.
  void all_reduce(float* data, int64_t count, cudaStream_t stream);

 private:
  NcclGroup() = default;
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace loom::gpu
