// The JSON of one safetensors header, parsed in time linear in its entries
// (internal to format/safetensors.cpp; declared here to be tested and timed).
//
// Why not json::parse: the top-level object of a real header has one entry per
// tensor (tens of thousands), and refusing a key listed twice needs to see
// every key; nlohmann's parser callback can, but with a callback the parser
// rescans the parent object after every nested value, which is quadratic
// (worse in practice: an 8,665-tensor header took 0.83 s, a 30,000-tensor one
// 31 s). Building one std::map of all entries also costs a string comparison
// of long shared prefixes ("model.layers.12.mlp.experts.") per level.
//
// parse_header_entries() reads SAX events: each top-level value becomes its
// own small json (the entry object), kept in file order with its key; a key
// seen before (hashed) is noted and its second value dropped. Nothing is
// reported before the whole text parsed: a syntax error gives only `error`.
#pragma once

#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace moetier::detail {

struct HeaderJson {
  struct Entry {
    std::string name;
    nlohmann::json value;
  };
  bool is_object = false;     // else `other` holds the whole (non-object) header
  std::deque<Entry> entries;  // top-level entries in file order, first of each key
  nlohmann::json other;
  std::string duplicate;  // the first key listed twice, or ""
  std::string error;      // nlohmann's parse error (what()), or ""
};

// False on a syntax error (out.error set).
bool parse_header_entries(const std::string& text, HeaderJson& out);

}  // namespace moetier::detail
