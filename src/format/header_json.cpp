#include "format/header_json.h"

#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace moetier::detail {

namespace {

using json = nlohmann::json;

// Builds one json value from SAX events (as json::parse's DOM parser does).
class ValueBuilder {
 public:
  void reset(json& root) {
    root_ = &root;
    stack_.clear();
    slot_ = nullptr;
  }
  template <typename V>
  void put(V&& v) {
    place(std::forward<V>(v));
  }
  void open(json v) { stack_.push_back(place(std::move(v))); }
  void close() { stack_.pop_back(); }
  void key(json::string_t& k) {
    auto& obj = stack_.back()->get_ref<json::object_t&>();
    slot_ = &obj[std::move(k)];  // a key repeated inside an entry: the last value wins
  }

 private:
  template <typename V>
  json* place(V&& v) {
    if (stack_.empty()) {
      *root_ = json(std::forward<V>(v));
      return root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      auto& arr = parent.get_ref<json::array_t&>();
      arr.emplace_back(std::forward<V>(v));
      return &arr.back();
    }
    *slot_ = json(std::forward<V>(v));
    return slot_;
  }

  json* root_ = nullptr;
  std::vector<json*> stack_;  // open objects and arrays, outermost first (pointers stay
                              // valid: a container grows only once its child closed)
  json* slot_ = nullptr;      // the value of the key just read
};

// The SAX handler (nlohmann's json_sax interface): the top-level object's
// keys are handled here, everything below them goes to `sub_`.
class HeaderSax {
 public:
  explicit HeaderSax(HeaderJson& out) : out_(out) {}

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(json::number_integer_t v) { return value(v); }
  bool number_unsigned(json::number_unsigned_t v) { return value(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(v); }
  bool string(json::string_t& v) { return value(std::move(v)); }
  bool binary(json::binary_t& v) { return value(json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    if (!started_) {
      started_ = true;
      out_.is_object = true;
      depth_ = 1;
      return true;
    }
    ++depth_;
    sub_.open(json::object());
    return true;
  }
  bool start_array(std::size_t) {
    begin_other();
    ++depth_;
    sub_.open(json::array());
    return true;
  }
  bool end_object() {
    if (out_.is_object && depth_ == 1) {
      depth_ = 0;
      return true;
    }
    --depth_;
    sub_.close();
    return true;
  }
  bool end_array() {
    --depth_;
    sub_.close();
    return true;
  }
  bool key(json::string_t& k) {
    if (!out_.is_object || depth_ != 1) {
      sub_.key(k);
      return true;
    }
    if (seen_.count(k)) {
      if (out_.duplicate.empty()) out_.duplicate = k;
      sub_.reset(discard_);
      return true;
    }
    out_.entries.push_back({std::move(k), json()});
    seen_.insert(out_.entries.back().name);  // a deque element never moves
    sub_.reset(out_.entries.back().value);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    out_.error = e.what();
    return false;
  }

 private:
  void begin_other() {  // a header that is not an object: build it whole
    if (started_) return;
    started_ = true;
    sub_.reset(out_.other);
  }
  template <typename V>
  bool value(V&& v) {
    begin_other();
    sub_.put(std::forward<V>(v));
    return true;
  }

  HeaderJson& out_;
  ValueBuilder sub_;
  std::unordered_set<std::string_view> seen_;  // views of out_.entries' names
  json discard_;                               // the value of a repeated key
  bool started_ = false;
  int64_t depth_ = 0;  // open objects and arrays, the top-level object included
};

}  // namespace

bool parse_header_entries(const std::string& text, HeaderJson& out) {
  HeaderSax sax(out);
  return json::sax_parse(text.begin(), text.end(), &sax);
}

}  // namespace moetier::detail
