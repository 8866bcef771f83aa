// Where a rank's CPU threads may run. Torch-free and MPI-free (environment and the affinity
// mask only), so that `tandem` can fix the binding before it execs `tandem-torch`.
#pragma once

namespace tandem::cli {

// Ranks of this job on this host (Open MPI's and MPICH's launchers say; 1 otherwise).
int LocalRanks();

// CPUs this process may run on (its affinity mask, which mpirun's binding narrows).
int UsableCores();

// Open MPI binds each rank to one core when it starts one or two and the launch names no
// binding, which leaves a rank's intra-op threads a single core. When the launch did not ask
// for that binding (Open MPI passes an explicit --bind-to on to its ranks), this process takes
// its rank's share of the host's CPUs instead (the host's cores over its local ranks, from
// local rank x share), for every thread it has. Best done before LibTorch is loaded: its
// OpenMP and BLAS size their waits by the CPUs they see at start-up. Returns the cores the
// process was bound to before, or 0 if it left the binding alone.
int WidenDefaultMpiBinding();

// The environment variable through which `tandem` tells the program it execs that it widened
// the binding (the core count before), for that program's start-up line.
inline constexpr char kWidenedBindingVariable[] = "TANDEM_WIDENED_BINDING_FROM";

}  // namespace tandem::cli
