#include "cluster/policies.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cluster {
namespace {

struct Entry {
  const char* name;
  std::function<std::unique_ptr<Policy>()> make;
};

// Every policy MakePolicy knows. A new policy adds its line here.
const std::vector<Entry>& Table() {
  static const auto* table = new std::vector<Entry>{
      {"fifo", [] { return MakeFifoPolicy(); }},
      {"tiresias", [] { return MakeTiresiasPolicy(); }},
      {"optimus", [] { return MakeOptimusPolicy(); }},
  };
  return *table;
}

}  // namespace

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const Entry& entry : Table()) names.push_back(entry.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(const std::string& name) {
  for (const Entry& entry : Table()) {
    if (name == entry.name) return entry.make();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown policy '", name, "' (known: ",
                                                 absl::StrJoin(PolicyNames(), ", "), ")"));
}

}  // namespace tandem::cluster
