// Added tokens of a tokenizer.json ("added_tokens"), matched in the input
// before pre-tokenization the way tokenizers' AddedVocabulary does:
//   - tokens with normalized=false are found in the raw text, tokens with
//     normalized=true in the normalized text (their content normalized too);
//   - leftmost-longest matching (Aho-Corasick LeftmostLongest semantics);
//   - single_word: the match must not touch a \w character on either side;
//   - lstrip / rstrip: the match swallows the White_Space next to it.
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moetier::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One piece of the input: either an added token (id >= 0) or text (id < 0).
struct Segment {
  std::string text;
  int32_t id = -1;
};

// A byte trie over token contents with leftmost-longest search.
class TokenMatcher {
 public:
  // patterns[i] is matched; the value reported is i.
  explicit TokenMatcher(const std::vector<std::string>& patterns);
  bool empty() const { return terminal_.size() <= 1; }
  // The leftmost match at or after `from`, longest among those starting
  // there: {begin, end, index}; begin == npos when there is none.
  struct Match {
    size_t begin = std::string_view::npos, end = 0;
    int32_t index = -1;
  };
  Match find(std::string_view s, size_t from) const;

 private:
  int32_t child(int32_t node, unsigned char c) const;
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> node
  std::vector<int32_t> terminal_;                // [nodes] pattern index or -1
  bool first_byte_[256] = {};
};

// Splits `text` at the tokens of `tokens` found by `matcher` (built from the
// same list, in order), appending segments to out. Non-token text segments are
// never empty.
void split_added(std::string_view text, const TokenMatcher& matcher,
                 const std::vector<const AddedToken*>& tokens, std::vector<Segment>& out);

}  // namespace moetier::tok
