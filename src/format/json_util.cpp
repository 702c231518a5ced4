#include "format/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

namespace moetier {

std::string printable(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (r.size() >= kMax) {
      r += "...";
      break;
    }
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f)
      r += char(c);
    else
      r += fmt::format("\\x{:02x}", c);
  }
  return r;
}

std::string shape_str(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

std::string_view json_kind(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::number_float:
      return "a fractional number";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    default:
      return "a binary value";
  }
}

std::optional<nlohmann::json> parse_json_text(std::string_view text, std::string& problem) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    auto at = what.find("parse error");
    problem = "invalid JSON: " + printable(at == std::string::npos ? what : what.substr(at));
  } catch (const std::exception& e) {
    problem = "invalid JSON: " + printable(e.what());
  }
  return std::nullopt;
}

std::optional<nlohmann::json> read_json_file(const std::filesystem::path& file,
                                             std::string& problem) {
  constexpr uintmax_t kMaxJson = 64ull << 20;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    problem =
        fmt::format("{}: cannot open: {}", file.string(),
                    std::filesystem::exists(file, ec) ? "not a regular file" : "no such file");
    return std::nullopt;
  }
  uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec || size > kMaxJson) {
    problem = ec ? fmt::format("{}: cannot open: {}", file.string(), ec.message())
                 : fmt::format("{}: file is {} bytes, larger than the 64 MiB limit for JSON",
                               file.string(), size);
    return std::nullopt;
  }
  std::ifstream in(file, std::ios::binary);
  std::string text(size, '\0');
  if (!in || !in.read(text.data(), std::streamsize(size))) {
    problem = fmt::format("{}: cannot read: {}", file.string(), std::strerror(errno));
    return std::nullopt;
  }
  std::string why;
  auto j = parse_json_text(text, why);
  if (!j) problem = fmt::format("{}: {}", file.string(), why);
  return j;
}

}  // namespace moetier
