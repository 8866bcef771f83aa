#include "comm/forwarding.h"

#include "absl/strings/str_cat.h"

namespace tandem::comm {

absl::Status ForwardingCommunicator::Retarget(Communicator* target) {
  if (target == nullptr) return absl::InvalidArgumentError("retargeting a group to nothing");
  if (target->rank() != target_->rank() || target->size() != target_->size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retargeting rank ", target_->rank(), " of a group of ", target_->size(), " (",
        target_->backend(), ") to rank ", target->rank(), " of a group of ", target->size(),
        " (", target->backend(), ")"));
  }
  target_ = target;
  return absl::OkStatus();
}

}  // namespace tandem::comm
