// NCCL, opened on first use (nccl.h); built where CMake found NCCL (LOOM_NCCL).
#include "gpu/nccl/nccl.h"

#include <nccl.h>

#include <optional>
#include <string>

#include "core/dl_library.h"
#include "loom/comm/comm.h"
#include "loom/core/error.h"

namespace loom::gpu {
namespace {

// The entry points Loom calls, with NCCL's own signatures.
struct Nccl {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

// The soname of the NCCL this was compiled against, then the library CMake found.
Nccl open_nccl() {
  const std::string soname = cat("libnccl.so.", NCCL_MAJOR), found = LOOM_NCCL_LIBRARY;
  std::string reason;
  const std::optional<DlLibrary> lib = DlLibrary::open("NCCL", {soname, found}, &reason);
  if (!lib)
    throw RuntimeError(cat("cannot open NCCL as ", soname, " or ", found, ": ", reason,
                           " (LD_LIBRARY_PATH may need NCCL's lib directory; docs/gpu.md)"));
  Nccl n;
  lib->resolve("ncclGetUniqueId", n.get_unique_id);
  lib->resolve("ncclCommInitRank", n.init_rank);
  lib->resolve("ncclAllReduce", n.all_reduce);
  lib->resolve("ncclCommDestroy", n.destroy);
  lib->resolve("ncclGetErrorString", n.error_string);
  return n;
}

const Nccl& nccl() {
  static const Nccl n = open_nccl();
  return n;
}

void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) throw RuntimeError(cat(call, " failed: ", nccl().error_string(status)));
}

}  // namespace

bool NcclGroup::compiled() { return true; }

std::unique_ptr<NcclGroup> NcclGroup::create(comm::Communicator& world) {
  ncclUniqueId id{};
  std::string error;
  if (world.rank() == 0) {  // rank 0 makes the id; a failure goes to every rank as an empty id
    try {
      check(nccl().get_unique_id(&id), "ncclGetUniqueId");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  comm::broadcast(world, {.buffer = &id, .count = sizeof id, .dtype = DType::kU8});
  if (!error.empty()) throw RuntimeError(error);
  std::unique_ptr<NcclGroup> g(new NcclGroup);
  ncclComm_t c = nullptr;
  check(nccl().init_rank(&c, world.size(), id, world.rank()), "ncclCommInitRank");
  g->comm_ = c;
  return g;
}

NcclGroup::~NcclGroup() {
  if (comm_ != nullptr) nccl().destroy(static_cast<ncclComm_t>(comm_));
}

void NcclGroup::all_reduce(float* data, int64_t count, cudaStream_t stream) {
  check(nccl().all_reduce(data, data, static_cast<size_t>(count), ncclFloat32, ncclSum, static_cast<ncclComm_t>(comm_),
                          stream),
        "ncclAllReduce");
}

}  // namespace loom::gpu
