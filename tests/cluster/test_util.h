// Helpers shared by the cluster tests.
#pragma once

#include <string>

#include "cluster/application.h"
#include "gtest/gtest.h"

namespace tandem::cluster::testing {

inline std::string DataPath(const std::string& relative) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/cluster/" + relative;
}

inline const ApplicationCatalog& PolluxApps() {
  static const ApplicationCatalog* catalog = [] {
    auto loaded = LoadPolluxApplications(DataPath("pollux/apps"));
    if (!loaded.ok()) {
      ADD_FAILURE() << loaded.status();
      return new ApplicationCatalog();
    }
    return new ApplicationCatalog(std::move(*loaded));
  }();
  return *catalog;
}

}  // namespace tandem::cluster::testing
