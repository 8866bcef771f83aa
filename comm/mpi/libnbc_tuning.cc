#include "comm/mpi/libnbc_tuning.h"

#include <mpi.h>

namespace tandem::comm::mpi_internal {
namespace {

constexpr int kLibnbcAuto = 0;
constexpr int kLibnbcRing = 1;

struct Cvar {
  std::mutex mu;
  bool usable = false;
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
};

Cvar& AllreduceAlgorithm() {
  static Cvar* cvar = [] {
    auto* c = new Cvar;  // lives until exit, like the MPI_T session
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return c;
    int index = 0;
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) != MPI_SUCCESS) return c;
    int elements = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &c->handle, &elements) != MPI_SUCCESS ||
        elements != 1) {
      return c;
    }
    int current = -1;
    if (MPI_T_cvar_read(c->handle, &current) != MPI_SUCCESS) return c;
    c->usable = current == kLibnbcAuto;  // an explicit user choice wins
    return c;
  }();
  return *cvar;
}

}  // namespace

IallreduceAlgorithmScope::IallreduceAlgorithmScope(int64_t bytes, int64_t count, int group_size) {
  Cvar& cvar = AllreduceAlgorithm();
  if (!cvar.usable) return;
  lock_ = std::unique_lock<std::mutex>(cvar.mu);
  if (bytes >= kRingAllreduceMinBytes && count >= group_size && group_size > 1) {
    int ring = kLibnbcRing;
    changed_ = MPI_T_cvar_write(cvar.handle, &ring) == MPI_SUCCESS;
  }
}

IallreduceAlgorithmScope::~IallreduceAlgorithmScope() {
  if (!changed_) return;
  int automatic = kLibnbcAuto;
  MPI_T_cvar_write(AllreduceAlgorithm().handle, &automatic);
}

}  // namespace tandem::comm::mpi_internal
