#include "cluster/policies.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cluster {
namespace {

struct Entry {
  const char* name;
  std::function<absl::StatusOr<std::unique_ptr<Policy>>()> make;
  // False when this build lacks what the policy needs: MakePolicy returns its error, and
  // PolicyNames leaves it out.
  bool available = true;
};

// Every policy MakePolicy knows. A new policy adds its line here.
const std::vector<Entry>& Table() {
  static const auto* table = new std::vector<Entry>{
      {"fifo", [] { return MakeFifoPolicy(); }},
      {"tiresias", [] { return MakeTiresiasPolicy(); }},
      {"optimus", [] { return MakeOptimusPolicy(); }},
      {"tandem", [] { return MakeTandemPolicy(); }},
      {"tandem-elastic", [] { return MakeTandemPolicy(TandemElasticOptions()); }},
      {"pollux", [] { return MakePolluxPolicy(); }},
      {"gavel", [] { return MakeGavelPolicy(); }, GavelPolicyAvailable()},
  };
  return *table;
}

}  // namespace

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const Entry& entry : Table()) {
    if (entry.available) names.push_back(entry.name);
  }
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
