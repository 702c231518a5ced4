// The linear safetensors header parser (format/header_json.h): file order,
// duplicates refused wherever they are, nothing reported before the whole
// header parsed, and the same one-line errors through parse_safetensors_header.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "format/header_json.h"
#include "format/safetensors.h"
#include "qwen3_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using ::testing::ElementsAre;
using ::testing::StartsWith;

namespace {

std::string entry(const std::string& name, uint64_t begin) {
  return fmt::format(R"("{}":{{"dtype":"U8","shape":[2],"data_offsets":[{},{}]}})", name, begin,
                     begin + 2);
}

// A header of n entries t0 .. t{n-1}, each 2 bytes of U8, in that order.
std::string many(int n) {
  std::string h = "{";
  for (int i = 0; i < n; ++i) h += (i ? "," : "") + entry(fmt::format("t{}", i), 2 * uint64_t(i));
  return h + "}";
}

}  // namespace

TEST(HeaderJson, EntriesInFileOrderWithValues) {
  detail::HeaderJson h;
  ASSERT_TRUE(detail::parse_header_entries(
      R"({"z":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},"__metadata__":{"k":"v"},"a":[1,{"x":null}]})",
      h));
  ASSERT_TRUE(h.is_object);
  ASSERT_EQ(h.entries.size(), 3u);
  EXPECT_EQ(h.entries[0].name, "z");
  EXPECT_EQ(h.entries[0].value["shape"], nlohmann::json::parse("[1,2]"));
  EXPECT_EQ(h.entries[1].name, "__metadata__");
  EXPECT_EQ(h.entries[1].value, nlohmann::json::parse(R"({"k":"v"})"));
  EXPECT_EQ(h.entries[2].value, nlohmann::json::parse(R"([1,{"x":null}])"));
  EXPECT_TRUE(h.duplicate.empty());
}

TEST(HeaderJson, DuplicateFarApartIsFoundOnceAndItsSecondValueDropped) {
  std::string text = many(20000);
  text.insert(text.size() - 1, "," + entry("t0", 0));  // t0 again, as the last key
  detail::HeaderJson h;
  ASSERT_TRUE(detail::parse_header_entries(text, h));
  EXPECT_EQ(h.duplicate, "t0");
  ASSERT_EQ(h.entries.size(), 20000u);
  EXPECT_EQ(h.entries.back().name, "t19999");
}

TEST(HeaderJson, RepeatedKeyInsideAnEntryIsNotATensorListedTwice) {
  detail::HeaderJson h;
  ASSERT_TRUE(detail::parse_header_entries(R"({"a":{"dtype":"F32","dtype":"U8"}})", h));
  EXPECT_TRUE(h.duplicate.empty());
  EXPECT_EQ(h.entries[0].value["dtype"], "U8");  // as json::parse: the last one wins
}

TEST(HeaderJson, NonObjectHeadersAreKeptWhole) {
  for (const char* text : {"42", "\"x\"", "null", "[[1], {\"a\": 2}]"}) {
    detail::HeaderJson h;
    ASSERT_TRUE(detail::parse_header_entries(text, h)) << text;
    EXPECT_FALSE(h.is_object) << text;
    EXPECT_EQ(h.other, nlohmann::json::parse(text)) << text;
  }
}

TEST(HeaderJson, SyntaxErrorAfterEntriesGivesOnlyTheJsonError) {
  TempDir tmp;
  const fs::path f = tmp / "x.safetensors";
  // a bad dtype first, then a truncated entry: one line, the syntax error
  write_raw_text(f, R"({"a":{"dtype":"XX","shape":[1],"data_offsets":[0,1]},"b":{"dtype")",
                 std::string(1, '\0'));
  auto p = parse_problems(f);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(p[0], StartsWith(f.string() + ": header is not valid JSON: parse error"));
}

TEST(HeaderJson, ManyTensorsParseWithTheDuplicateNamed) {
  TempDir tmp;
  const fs::path f = tmp / "x.safetensors";
  const int n = 30000;
  write_raw_text(f, many(n), std::string(2 * size_t(n), '\1'));
  Shard s;
  std::vector<std::string> problems;
  auto ts = parse_safetensors_header(f, 0, s, problems);
  EXPECT_TRUE(problems.empty()) << problems[0];
  ASSERT_EQ(ts.size(), size_t(n));
  EXPECT_EQ(ts[12345].name, "t12345");
  EXPECT_EQ(ts[12345].begin, 2u * 12345);

  std::string text = many(n);
  text.insert(text.size() - 1, "," + entry("t777", 2 * uint64_t(n)));
  write_raw_text(f, text, std::string(2 * size_t(n) + 2, '\1'));
  EXPECT_THAT(
      parse_problems(f),
      ElementsAre(f.string() + ": tensor 't777': listed twice in the header",
                  f.string() + ": 2 bytes after the last tensor 't29999' belong to no tensor "
                               "(data section is 60002 bytes)"));
}

TEST(HeaderJson, BadEntriesAreReportedInFileOrder) {
  TempDir tmp;
  const fs::path f = tmp / "x.safetensors";
  write_raw_text(f, R"({"z":1,"a":"s"})", "");
  EXPECT_THAT(parse_problems(f),
              ElementsAre(f.string() + ": tensor 'z': entry is an integer, expected an object",
                          f.string() + ": tensor 'a': entry is a string, expected an object"));
}
