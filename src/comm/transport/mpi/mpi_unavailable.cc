// Built instead of mpi_transport.cc when CMake found no MPI or LOOM_WITH_MPI is off.
#include "comm/transport/transport.h"

namespace loom::comm {

std::unique_ptr<Transport> make_mpi_transport(int, int, const CommConfig&) {
  throw InputError("comm.transport = \"mpi\": this build has no MPI transport (install libopenmpi-dev, "
                   "then reconfigure with -DLOOM_WITH_MPI=ON)");
}

}  // namespace loom::comm
