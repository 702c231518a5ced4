// Small helpers shared by the format and model parsers: one-line printable
// text for messages, shape strings, and JSON files read with one-line errors.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace moetier {

// `s` made safe for a one-line message: bytes outside printable ASCII become
// \xNN, and text longer than 200 characters is cut with "...".
std::string printable(std::string_view s);

// "[3, 5]"
std::string shape_str(std::span<const int64_t> shape);

// "an object", "an array", "a string", "a number", "a boolean", "null".
std::string_view json_kind(const nlohmann::json& j);

// Reads and parses a JSON file (at most 64 MiB). On failure returns nullopt and
// sets `problem` to one line: "FILE: cannot open: REASON" or
// "FILE: invalid JSON: parse error at line L, column C: ...".
std::optional<nlohmann::json> read_json_file(const std::filesystem::path& file,
                                             std::string& problem);

// Parses `text` as JSON; on failure returns nullopt and sets `problem` to
// "invalid JSON: parse error at line L, column C: ..." (no file name).
std::optional<nlohmann::json> parse_json_text(std::string_view text, std::string& problem);

}  // namespace moetier
