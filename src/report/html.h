// Internal to the report module: HTML text helpers and the table writers
// (tables.cpp) that page.cpp puts beside each chart.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "report/report.h"

namespace moetier::report::detail {

std::string escape(const std::string& s);  // &, <, >, ", '
// "2.80 GB" (SI units, 3 significant digits); "512 B" below 1 kB.
std::string human_bytes(double bytes);
// A number at PATH ("median.decode_tps") in OBJ, if present.
std::optional<double> number_at(const nlohmann::json& obj, const std::string& path);

// One arm with the file it came from (index into the files).
struct ArmRef {
  size_t file;
  const nlohmann::json* arm;
};
std::vector<ArmRef> all_arms(const std::vector<ResultFile>& files);

std::string files_table(const std::vector<ResultFile>& files);
std::string arms_table(const std::vector<ArmRef>& arms);
std::string throughput_table(const std::vector<ArmRef>& arms);
std::string memory_table(const std::vector<ArmRef>& arms);
std::string storage_table(const std::vector<ArmRef>& arms);
std::string simulate_table(const std::vector<ResultFile>& files);
std::string monitor_table(const std::vector<ResultFile>& files);

}  // namespace moetier::report::detail
