// A build without NCCL (LOOM_NCCL off, or not found): nothing to open, and a refusal.
#include "gpu/nccl/nccl.h"

#include "loom/core/error.h"

namespace loom::gpu {

bool NcclGroup::compiled() { return false; }

std::unique_ptr<NcclGroup> NcclGroup::create(comm::Communicator& /*world*/) {
  throw RuntimeError("this loom was built without NCCL (LOOM_NCCL off, or no nccl.h and libnccl where CMake looked; docs/gpu.md)");
}

NcclGroup::~NcclGroup() = default;

void NcclGroup::all_reduce(float* /*data*/, int64_t /*count*/, cudaStream_t /*stream*/) {
  check_failed(__FILE__, __LINE__, "an NcclGroup in a build without NCCL");
}

}  // namespace loom::gpu
