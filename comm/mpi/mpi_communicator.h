// The MPI backend: a Communicator over Open MPI for CPU buffers.
//
// MPI runs with MPI_THREAD_MULTIPLE. Each communicator owns two duplicates of its MPI group:
// one for data, one for control traffic (collective signatures, liveness probes, group
// creation), both with MPI_ERRORS_RETURN so that MPI errors become statuses, never aborts.
// Requests are progressed by the waiting thread or by a process-wide progress thread
// (comm/mpi/progress_engine.h), so non-blocking operations overlap computation.
//
// Threading: operations are issued from one thread at a time per communicator (the contract
// of comm/communicator.h); Work handles may be tested and waited on from any thread.
//
// Failures: a dead peer makes operations that involve it time out (DeadlineExceeded from
// Work::Wait). Survivors then call DetectDeadRanks (every survivor, within the timeout of each
// other) to agree on who is gone, and Shrink to get a communicator of the survivors, built
// with MPI_Comm_create_group without the dead ranks' participation (needs
// `mpirun --enable-recovery`, or Open MPI terminates the job when a rank dies).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/options.h"

namespace tandem::comm {

namespace mpi_internal {
struct CommState;
struct EarlyPost;
struct Op;
struct OpLabel;
}

class MpiCommunicator : public Communicator {
 public:
  // All processes of the job. Initialises MPI with MPI_THREAD_MULTIPLE if nobody did (and
  // then finalises it at exit); fails with FailedPrecondition if MPI was initialised with a
  // lower thread level. Collective over MPI_COMM_WORLD.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> World(const CommOptions& options);
  // Same, with CommOptions::FromEnvironment() (TANDEM_COMM_* variables).
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> World();
  // A communicator over duplicates of `comm` (collective over `comm`).
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> FromMpiComm(
      MPI_Comm comm, const CommOptions& options = CommOptions());

  // Growing a running job (MPI_Comm_spawn + MPI_Intercomm_merge; Open MPI adds the processes
  // to the job, also under `mpirun --enable-recovery` after deaths). Collective over this
  // communicator: its rank 0 starts `count` processes running `argv` (argv[0] the program),
  // and the call returns once they called JoinParents, with a communicator of this one's ranks
  // (same order) followed by theirs. Blocking: a rank that dies meanwhile is not noticed.
  absl::StatusOr<std::unique_ptr<Communicator>> SpawnAndMerge(
      const std::vector<std::string>& argv, int count) override;
  // Whether this process was started by SpawnAndMerge (MPI must be initialised).
  static bool Spawned();
  // In a process started by SpawnAndMerge: the communicator it returns to the parents (their
  // ranks first, then the started processes in their MPI_COMM_WORLD order). Collective over
  // the parents and every started process; `options` must agree with the parents' on
  // verify_collectives (the signature check is a protocol of its own). FailedPrecondition when
  // not Spawned().
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> JoinParents(
      const CommOptions& options = CommOptions());

  ~MpiCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "mpi"; }
  // -1 for ranks outside this process's MPI_COMM_WORLD (started by SpawnAndMerge, or the
  // parents of a started process).
  const std::vector<int>& world_ranks() const override { return world_ranks_; }

  WorkPtr Send(const Buffer& buffer, int peer, int tag = 0) override;
  WorkPtr Recv(const Buffer& buffer, int peer, int tag = 0) override;
  WorkPtr AllReduce(const Buffer& buffer, ReduceOp op = ReduceOp::kSum) override;
  WorkPtr ReduceScatter(const Buffer& input, const Buffer& output,
                        ReduceOp op = ReduceOp::kSum) override;
  WorkPtr AllGather(const Buffer& input, const Buffer& output) override;
  WorkPtr Broadcast(const Buffer& buffer, int root) override;
  WorkPtr Barrier() override;

  absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;
  absl::StatusOr<std::unique_ptr<Communicator>> Shrink(
      const std::vector<int>& dead_ranks) override;
  absl::StatusOr<std::vector<int>> DetectDeadRanks(absl::Duration timeout) override;
  void Abort(const absl::Status& reason) override;

  void set_timeout(absl::Duration timeout) override { options_.timeout = timeout; }
  // The progress engine (process-wide) polls MPI while any such handle lives.
  std::shared_ptr<void> KeepProgressing() override;
  absl::Duration timeout() const override { return options_.timeout; }

  // The data communicator (for code that must call MPI directly, e.g. benchmarks).
  MPI_Comm mpi_comm() const;

 private:
  MpiCommunicator(std::shared_ptr<mpi_internal::CommState> state, const CommOptions& options);
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Adopt(MPI_Comm data, MPI_Comm control,
                                                                const CommOptions& options);

  enum class Kind : int64_t {
    kAllReduce = 1, kReduceScatter, kAllGather, kBroadcast, kBarrier, kSplit,
  };
  // Issues a collective that is one MPI request: its signature check (if enabled) and its data
  // request. `post` (int(MPI_Request*)) is called now by this thread, or kept for the progress
  // side when the signature check runs first. `eager_receive`: the request is a receive that
  // needs nothing of this rank's progress when small (its message leaves the sender eagerly).
  template <typename Post>
  WorkPtr IssueCollective(Kind kind, mpi_internal::OpLabel label, int64_t count,
                          DataType dtype, ReduceOp op, int root, Post post,
                          std::function<absl::Status(const MPI_Status&)> finish,
                          bool eager_receive = false);
  // Issues a collective run by a tandem algorithm (comm/mpi/ring.h: Start posts its first
  // step, Progress tests and advances it), kept in the operation's Work.
  template <typename Algorithm>
  WorkPtr IssueAlgorithm(Kind kind, mpi_internal::OpLabel label, int64_t count, DataType dtype,
                         ReduceOp op, int root,
                         std::function<absl::Status(const MPI_Status&)> finish,
                         Algorithm algorithm);
  // What the two share once the operation has its Work: queues it (posted early, posted now,
  // or after its signature check).
  template <typename Post>
  WorkPtr Queue(Kind kind, mpi_internal::OpLabel label, int64_t count, DataType dtype,
                ReduceOp op, int root, Post& post,
                std::function<absl::Status(const MPI_Status&)> finish, bool verify,
                const mpi_internal::EarlyPost& early, WorkPtr work,
                std::shared_ptr<mpi_internal::Op> op_state);
  // What every collective does first: counts it as issued, numbers its label (the same
  // sequence on every rank); returns whether its signature is checked first.
  bool BeginCollective(mpi_internal::OpLabel& label);
  // Whether a collective is posted and tested (TestsAtIssueCount times) by the issuing thread
  // before anything is allocated (small, no signature check, not aborted).
  bool TestsAtIssue(const mpi_internal::OpLabel& label, bool verify) const;
  // How many times the issuing thread tests a small collective before it allocates anything
  // and queues it (mpi_internal::kCollectiveTestsAtIssue; once with polite waits).
  static int TestsAtIssueCount();
  // The Work every operation of `kind` that completed when issued shares.
  static const WorkPtr& DoneAtIssue(Kind kind);
  // Posts MPI_Isend (`send`) or MPI_Irecv of `buffer` now and hands it to the progress side
  // (a small one: IssueSmallPointToPoint).
  WorkPtr IssuePointToPoint(mpi_internal::OpLabel label, bool send, const Buffer& buffer,
                            MPI_Datatype type, int peer, int tag);
  // A checked point-to-point operation of at most kTestAtIssueMaxBytes, posted now: a send is
  // tested, then done (the usual case) or queued (it did not leave); a receive is
  // waiter-driven (Op::waiter_driven).
  // Nothing is allocated and no operation label is built unless it is still pending.
  WorkPtr IssueSmallPointToPoint(bool send, const Buffer& buffer, MPI_Datatype type, int peer,
                                 int tag, int64_t sequence);
  // The MPI type of a point-to-point operation that takes the small path with no further check
  // (a CPU buffer of a plain type up to kTestAtIssueMaxBytes, a valid peer and tag, a usable
  // communicator); MPI_DATATYPE_NULL otherwise, and the general path checks and describes it.
  MPI_Datatype SmallPointToPointType(const Buffer& buffer, int peer, int tag) const;
  static mpi_internal::OpLabel PointToPointLabel(const char* name, const Buffer& buffer,
                                                 int peer, int tag, int64_t sequence);
  mpi_internal::OpLabel CollectiveLabel(const char* name, const Buffer* buffer,
                                        const char* reduction, int root) const;
  // Algorithms over point-to-point messages (comm/mpi/ring.h) send on the control
  // communicator with a tag from the sequence number the collective being issued is about to
  // get (the same on every rank), so several in flight cannot mix.
  int NextAlgorithmTag() const;
  // Non-OK if the communicator was aborted.
  absl::Status CheckUsable(const char* what);
  std::string GroupText() const;
  // Checks a point-to-point buffer (CPU), peer and tag; returns the MPI type of its elements.
  absl::StatusOr<MPI_Datatype> CheckPointToPoint(const Buffer& buffer, int peer, int tag,
                                                 const char* what) const;
  // Checks that `op` applies to `dtype` and the communicator is usable; returns the MPI type
  // and operation. `name` prefixes errors ("all_reduce: ...").
  struct MpiReduction {
    MPI_Datatype type;
    MPI_Op op;
  };
  absl::StatusOr<MpiReduction> CheckReduction(DataType dtype, ReduceOp op, const char* name);

  std::shared_ptr<mpi_internal::CommState> state_;
  CommOptions options_;
  std::vector<int> world_ranks_;
  int64_t collective_sequence_ = 0;
  int64_t p2p_sequence_ = 0;
  int64_t liveness_round_ = 0;
};

}  // namespace tandem::comm
