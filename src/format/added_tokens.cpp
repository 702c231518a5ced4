#include "format/added_tokens.h"

#include <algorithm>

#include "format/unicode.h"

namespace moetier::tok {

TokenMatcher::TokenMatcher(const std::vector<std::string>& patterns) {
  terminal_.push_back(-1);  // root
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char c : p) {
      int32_t nx = child(node, c);
      if (nx < 0) {
        nx = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        edges_[(uint64_t(node) << 8) | c] = nx;
      }
      node = nx;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(i);  // first wins
  }
}

int32_t TokenMatcher::child(int32_t node, unsigned char c) const {
  auto it = edges_.find((uint64_t(node) << 8) | c);
  return it == edges_.end() ? -1 : it->second;
}

TokenMatcher::Match TokenMatcher::find(std::string_view s, size_t from) const {
  Match m;
  if (empty()) return m;
  for (size_t i = from; i < s.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(s[i])]) continue;
    int32_t node = 0;
    for (size_t j = i; j < s.size(); ++j) {
      node = child(node, static_cast<unsigned char>(s[j]));
      if (node < 0) break;
      if (terminal_[node] >= 0) m = {i, j + 1, terminal_[node]};
    }
    if (m.index >= 0) return m;
  }
  return m;
}

namespace {

char32_t last_cp(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) --i;
  return unicode::next_cp(s, i);
}

bool ends_with_word(std::string_view s) { return !s.empty() && unicode::is_word_char(last_cp(s)); }

bool starts_with_word(std::string_view s) {
  size_t i = 0;
  return !s.empty() && unicode::is_word_char(unicode::next_cp(s, i));
}

// Start of the run of White_Space that ends s.
size_t space_leftmost_at_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t k = i;
    if (!unicode::is_white_space(unicode::next_cp(s, k))) break;
    end = i;
  }
  return end;
}

// Length of the run of White_Space that starts s.
size_t space_rightmost_at_start(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!unicode::is_white_space(unicode::next_cp(s, k))) break;
    i = k;
  }
  return i;
}

}  // namespace

void split_added(std::string_view text, const TokenMatcher& matcher,
                 const std::vector<const AddedToken*>& tokens, std::vector<Segment>& out) {
  size_t start_offset = 0;  // end of the last emitted piece
  size_t pos = 0;           // where the next search starts (the matcher's own position)
  while (pos < text.size()) {
    TokenMatcher::Match m = matcher.find(text, pos);
    if (m.index < 0) break;
    pos = m.end;
    const AddedToken& tok = *tokens[m.index];
    size_t start = m.begin, stop = m.end;
    if (start < start_offset) continue;  // swallowed by a previous rstrip
    if (tok.single_word) {
      bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) start = std::max(space_leftmost_at_end(text.substr(0, start)), start_offset);
    if (tok.rstrip) stop += space_rightmost_at_start(text.substr(stop));
    if (start_offset < start) {
      out.push_back({std::string(text.substr(start_offset, start - start_offset)), -1});
    }
    out.push_back({std::string(text.substr(start, stop - start)), tok.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) {
    out.push_back({std::string(text.substr(start_offset)), -1});
  }
}

}  // namespace moetier::tok
