// Safetensors parsing, the checkpoint loader, the writer (and the atomic
// files it writes through), and fuzzing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "qwen3_fixture.h"

using namespace moetier;
using namespace moetier::testing;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

// One shard with a few odd-shaped tensors of several dtypes.
struct OneShard {
  TempDir tmp;
  fs::path file = tmp / "x.safetensors";
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  explicit OneShard(uint64_t align = 0) {
    std::mt19937 rng(99);
    std::vector<Spec> specs = {{"a.weight", DType::BF16, {3, 7}},
                               {"b.bias", DType::F32, {5}},
                               {"c.codes", DType::U8, {11, 3}},
                               {"d.scale", DType::F8_E8M0, {2, 9}},
                               {"e.ids", DType::I64, {3}}};
    for (const auto& s : specs) data.push_back(random_bytes(s, rng));
    for (size_t i = 0; i < specs.size(); ++i)
      tensors.push_back({specs[i].name, specs[i].dtype, specs[i].shape, data[i]});
    SafetensorsWriteOptions opt;
    opt.align = align;
    opt.metadata["format"] = "pt";
    write_safetensors(file, tensors, opt);
  }
};

}  // namespace

TEST(Safetensors, WriterOutputParsesBack) {
  OneShard o;
  Shard s;
  std::vector<std::string> problems;
  auto ts = parse_safetensors_header(o.file, 3, s, problems);
  EXPECT_THAT(problems, ::testing::IsEmpty());
  ASSERT_EQ(ts.size(), 5u);
  EXPECT_EQ(s.file_size, fs::file_size(o.file));
  EXPECT_EQ(s.data_offset % 8, 0u);
  std::string raw = read_file(o.file);
  for (const auto& t : ts) {
    size_t i = size_t(std::find_if(o.tensors.begin(), o.tensors.end(),
                                   [&](const TensorToWrite& w) { return w.name == t.name; }) -
                      o.tensors.begin());
    ASSERT_LT(i, o.tensors.size()) << t.name;
    EXPECT_EQ(t.shard, 3u);
    EXPECT_EQ(t.dtype, o.tensors[i].dtype);
    EXPECT_EQ(t.shape, o.tensors[i].shape);
    ASSERT_EQ(t.nbytes(), o.data[i].size());
    EXPECT_EQ(0, std::memcmp(raw.data() + s.data_offset + t.begin, o.data[i].data(), t.nbytes()));
  }
}

TEST(Safetensors, AlignedWriterPutsEveryTensorOn4KiBAndStaysValid) {
  OneShard o(4096);
  Shard s;
  std::vector<std::string> problems;
  auto ts = parse_safetensors_header(o.file, 0, s, problems);
  EXPECT_THAT(problems, ::testing::IsEmpty());
  EXPECT_EQ(s.data_offset % 4096, 0u);
  int pads = 0;
  for (const auto& t : ts) {
    if (t.name.starts_with("__pad_")) {
      ++pads;
      EXPECT_EQ(t.dtype, DType::U8);
      continue;
    }
    EXPECT_EQ((s.data_offset + t.begin) % 4096, 0u) << t.name;
  }
  EXPECT_EQ(pads, 4);  // before each tensor but the first
}

TEST(Safetensors, TruncatedFile) {
  OneShard o;
  auto r = sorted_ranges(read_raw(o.file).header);
  std::string raw = read_file(o.file);
  uint64_t data_off = raw.size() - (r.back().end);
  write_file(o.file, raw.substr(0, raw.size() - 5));
  EXPECT_THAT(parse_problems(o.file),
              Contains(fmt::format("{}: tensor '{}': data_offsets [{}, {}] run past the end of "
                                   "the file (data section is {} bytes)",
                                   o.file.string(), r.back().name, r.back().begin, r.back().end,
                                   r.back().end - 5)));
  EXPECT_GT(data_off, 8u);
  write_file(o.file, raw.substr(0, 5));
  EXPECT_THAT(parse_problems(o.file),
              Contains(o.file.string() +
                       ": file is 5 bytes, too short for a safetensors header (needs at least 8)"));
}

TEST(Safetensors, HeaderLengthLargerThanFile) {
  OneShard o;
  std::string raw = read_file(o.file);
  write_file(o.file, length_prefix(raw.size()) + raw.substr(8));
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(fmt::format(
                  "{}: header length {} is larger than the file ({} bytes after the 8-byte "
                  "length)",
                  o.file.string(), raw.size(), raw.size() - 8)));
}

TEST(Safetensors, HeaderNotJson) {
  OneShard o;
  write_raw_text(o.file, "{not json      ", read_raw(o.file).data);
  auto p = parse_problems(o.file);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_THAT(p[0], StartsWith(o.file.string() +
                               ": header is not valid JSON: parse error at line 1, column 3:"));
}

TEST(Safetensors, HeaderIsArray) {
  OneShard o;
  write_raw_text(o.file, "[1, 2, 3]", read_raw(o.file).data);
  EXPECT_THAT(
      parse_problems(o.file),
      ::testing::ElementsAre(o.file.string() + ": header is an array, expected a JSON object"));
}

TEST(Safetensors, OverlappingRanges) {
  OneShard o;
  RawShard r = read_raw(o.file);
  auto rs = sorted_ranges(r.header);
  const Range &a = rs[1], &b = rs[2];
  r.header[b.name]["data_offsets"] = {b.begin - 2, b.end - 2};
  write_raw(o.file, r);
  EXPECT_THAT(parse_problems(o.file),
              Contains(fmt::format("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' "
                                   "[{}, {}]",
                                   o.file.string(), b.name, b.begin - 2, b.end - 2, a.name, a.begin,
                                   a.end)));
}

TEST(Safetensors, HoleBetweenTensors) {
  OneShard o;
  RawShard r = read_raw(o.file);
  auto rs = sorted_ranges(r.header);
  r.header.erase(rs[2].name);
  write_raw(o.file, r);
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(fmt::format(
                  "{}: hole of {} bytes in the data section before tensor '{}' (bytes [{}, {}] "
                  "belong to no tensor)",
                  o.file.string(), rs[2].end - rs[2].begin, rs[3].name, rs[2].begin, rs[2].end)));
}

TEST(Safetensors, TrailingBytesAfterLastTensor) {
  OneShard o;
  RawShard r = read_raw(o.file);
  auto rs = sorted_ranges(r.header);
  r.data += "xyz";
  write_raw(o.file, r);
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(fmt::format(
                  "{}: 3 bytes after the last tensor '{}' belong to no tensor (data section is "
                  "{} bytes)",
                  o.file.string(), rs.back().name, r.data.size())));
}

TEST(Safetensors, DtypeTimesShapeDiffersFromRange) {
  OneShard o;
  RawShard r = read_raw(o.file);
  auto off = r.header["a.weight"]["data_offsets"];
  r.header["a.weight"]["shape"] = {3, 5};
  write_raw(o.file, r);
  uint64_t b = off[0], e = off[1];
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(fmt::format(
                  "{}: tensor 'a.weight': dtype BF16 shape [3, 5] needs 30 bytes, data_offsets "
                  "[{}, {}] hold {}",
                  o.file.string(), b, e, e - b)));
}

TEST(Safetensors, UnknownDtype) {
  OneShard o;
  RawShard r = read_raw(o.file);
  r.header["c.codes"]["dtype"] = "F4";
  write_raw(o.file, r);
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(o.file.string() +
                                     ": tensor 'c.codes': unknown dtype 'F4' (supported: F32, "
                                     "F16, BF16, F8_E4M3, F8_E8M0, U8, I8, I32, I64)"));
}

TEST(Safetensors, RangePastEndOfFile) {
  OneShard o;
  RawShard r = read_raw(o.file);
  auto rs = sorted_ranges(r.header);
  const Range& z = rs.back();
  r.header[z.name]["data_offsets"] = {z.begin + 1000, z.end + 1000};
  write_raw(o.file, r);
  EXPECT_THAT(parse_problems(o.file),
              ::testing::ElementsAre(fmt::format(
                  "{}: tensor '{}': data_offsets [{}, {}] run past the end of the file (data "
                  "section is {} bytes)",
                  o.file.string(), z.name, z.begin + 1000, z.end + 1000, r.data.size())));
}

TEST(Safetensors, BadEntriesAndMetadata) {
  OneShard o;
  RawShard r = read_raw(o.file);
  r.header["__metadata__"] = {{"format", 3}};
  r.header["b.bias"]["shape"] = {-5};
  r.header["c.codes"]["data_offsets"] = {10};
  r.header["e.ids"] = "nope";
  write_raw(o.file, r);
  std::string f = o.file.string();
  EXPECT_THAT(parse_problems(o.file),
              ::testing::UnorderedElementsAre(
                  f + ": field '__metadata__.format': is an integer, expected a string",
                  f + ": tensor 'b.bias': shape [-5] has a dimension that is not a non-negative "
                      "integer",
                  f + ": tensor 'c.codes': field 'data_offsets' must be [begin, end] with 0 <= "
                      "begin <= end",
                  f + ": tensor 'e.ids': entry is a string, expected an object"));
}

TEST(Safetensors, DuplicateKeyAndEmptyFile) {
  OneShard o;
  RawShard r = read_raw(o.file);
  std::string h = r.header.dump();
  std::string dup = "\"a.weight\":" + r.header["a.weight"].dump() + ",";
  h.insert(1, dup);
  write_raw_text(o.file, h, r.data);
  EXPECT_THAT(parse_problems(o.file),
              Contains(o.file.string() + ": tensor 'a.weight': listed twice in the header"));
  write_file(o.file, "");
  EXPECT_THAT(parse_problems(o.file), ::testing::SizeIs(1));
  EXPECT_THAT(parse_problems(o.file / "nope"), ::testing::SizeIs(1));
}

TEST(Safetensors, EmptyTensorListIsValid) {
  TempDir tmp;
  write_safetensors(tmp / "e.safetensors", {});
  EXPECT_THAT(parse_problems(tmp / "e.safetensors"), ::testing::IsEmpty());
}

TEST(Safetensors, WriterRefusesBadInput) {
  TempDir tmp;
  std::vector<std::byte> b(6);
  std::vector<TensorToWrite> ts = {{"x", DType::BF16, {2, 2}, b}};
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", ts), Error);
  ts = {{"__pad_0", DType::U8, {6}, b}};
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", ts), Error);
  ts = {{"x", DType::U8, {6}, b}, {"x", DType::U8, {6}, b}};
  EXPECT_THROW(write_safetensors(tmp / "a.safetensors", ts), Error);
  EXPECT_FALSE(fs::exists(tmp / "a.safetensors"));
  // No temporary file is left behind.
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(Safetensors, AShardThatIsNotAFileNamesWhy) {
  TempDir tmp;
  fs::create_directories(tmp / "dir.safetensors");
  const auto dir = parse_problems(tmp / "dir.safetensors");
  ASSERT_EQ(dir.size(), 1u);
  EXPECT_NE(dir[0].find("cannot open: not a regular file"), std::string::npos) << dir[0];
  const auto missing = parse_problems(tmp / "missing.safetensors");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_NE(missing[0].find("cannot open: no such file"), std::string::npos) << missing[0];
}

TEST(Safetensors, AtomicDirRemovedUnlessCommitted) {
  TempDir tmp;
  fs::path tmp_path;
  {
    AtomicDir d(tmp / "ck");
    tmp_path = d.path();
    write_file_atomic(d.path() / "f.txt", "hello");
    EXPECT_TRUE(fs::exists(tmp_path / "f.txt"));
  }
  EXPECT_FALSE(fs::exists(tmp_path));
  EXPECT_FALSE(fs::exists(tmp / "ck"));
  {
    AtomicDir d(tmp / "ck");
    write_file_atomic(d.path() / "f.txt", "hello");
    d.commit();
  }
  EXPECT_EQ(read_file(tmp / "ck" / "f.txt"), "hello");
  // DIR exists already: refused at once, before any work goes into the temporary one
  try {
    AtomicDir again(tmp / "ck");
    ADD_FAILURE() << "an existing directory was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already exists"), std::string::npos) << e.what();
  }
  std::vector<fs::path> left;
  for (const auto& de : fs::directory_iterator(tmp.path())) left.push_back(de.path().filename());
  EXPECT_EQ(left, std::vector<fs::path>{"ck"});  // no temporary directory left
  // DIR made by someone else after the AtomicDir: commit refuses (rename would replace it)
  {
    AtomicDir late(tmp / "late");
    fs::create_directories(tmp / "late");
    EXPECT_THROW(late.commit(), Error);
  }
  EXPECT_TRUE(fs::is_empty(tmp / "late"));
  // A dangling link at DIR: refused at once too (rename would fail only after the work)
  fs::create_symlink(tmp / "nowhere", tmp / "link");
  EXPECT_THROW(AtomicDir(tmp / "link"), Error);
  // A parent that does not exist: the cause, not "Success" (errno read after mkdtemp)
  try {
    AtomicDir missing(tmp / "no" / "such" / "ck");
    ADD_FAILURE() << "a directory under a missing parent was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos) << e.what();
  }
}

// --- Checkpoint directories ---

TEST(Checkpoint, OpensShardedAndReadsBytes) {
  TempDir tmp;
  Tiny t;
  t.shards = 3;
  Written w = write_tiny(tmp / "ck", t);
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_EQ(ck->shards().size(), 3u);
  EXPECT_EQ(ck->tensors().size(), w.data.size());
  EXPECT_EQ(ck->config()["hidden_size"], 64);
  for (const auto& [name, bytes] : w.data) {
    const TensorInfo& ti = ck->get(name);
    EXPECT_EQ(ck->shards()[ti.shard].path.filename().string(), w.file[name]);
    EXPECT_EQ(ti.shape, w.spec[name].shape);
    auto got = ck->bytes(ti);
    ASSERT_EQ(got.size(), bytes.size());
    EXPECT_EQ(0, std::memcmp(got.data(), bytes.data(), bytes.size())) << name;
  }
  EXPECT_EQ(ck->find("nope"), nullptr);
  EXPECT_THROW(ck->get("nope"), Error);
}

TEST(Checkpoint, AlignedCheckpointHidesPaddingAndAligns) {
  TempDir tmp;
  Tiny t;
  t.align = 4096;
  Written w = write_tiny(tmp / "ck", t);
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_EQ(ck->tensors().size(), w.data.size());
  for (const auto& ti : ck->tensors()) {
    EXPECT_FALSE(ti.name.starts_with("__pad_"));
    EXPECT_EQ(ck->file_offset(ti) % 4096, 0u) << ti.name;
    EXPECT_EQ(0, std::memcmp(ck->bytes(ti).data(), w.data[ti.name].data(), ti.nbytes()));
  }
}

TEST(Checkpoint, SingleFile) {
  TempDir tmp;
  Tiny t;
  t.shards = 1;
  write_tiny(tmp / "ck", t);
  EXPECT_FALSE(fs::exists(tmp / "ck" / "model.safetensors.index.json"));
  auto ck = Checkpoint::open(tmp / "ck");
  EXPECT_EQ(ck->shards().size(), 1u);
}

TEST(Checkpoint, MissingShardFile) {
  TempDir tmp;
  Written w = write_tiny(tmp / "ck", Tiny{});
  fs::remove(tmp / "ck" / "model-00002-of-00002.safetensors");
  size_t n = 0;
  for (const auto& [name, f] : w.file) n += f == "model-00002-of-00002.safetensors";
  std::string want = fmt::format(
      "{}: shard named by model.safetensors.index.json does not exist ({} tensors map to it)",
      (tmp / "ck" / "model-00002-of-00002.safetensors").string(), n);
  std::vector<std::string> problems;
  Checkpoint::open(tmp / "ck", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre(want));
  try {
    Checkpoint::open(tmp / "ck");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
}

// Opens a copy of the tiny checkpoint whose index.json `edit` changed; the
// problems Checkpoint::open reports.
std::vector<std::string> problems_with_index(const TempDir& tmp,
                                             const std::function<void(nlohmann::json&)>& edit) {
  write_tiny(tmp / "ck", Tiny{});
  const fs::path idx = tmp / "ck" / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(read_file(idx));
  edit(j);
  write_file(idx, j.dump());
  std::vector<std::string> problems;
  Checkpoint::open(tmp / "ck", problems);
  return problems;
}

TEST(Checkpoint, IndexNamesTensorMissingFromShard) {
  TempDir tmp;
  const auto problems = problems_with_index(tmp, [](nlohmann::json& j) {
    j["weight_map"]["model.layers.0.extra.weight"] = "model-00001-of-00002.safetensors";
  });
  EXPECT_THAT(problems,
              ::testing::ElementsAre((tmp / "ck" / "model-00001-of-00002.safetensors").string() +
                                     ": tensor 'model.layers.0.extra.weight': listed in "
                                     "model.safetensors.index.json but absent from this shard"));
}

TEST(Checkpoint, TensorMappedToAnotherShard) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  fs::path idx = tmp / "ck" / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(read_file(idx));
  j["weight_map"]["model.embed_tokens.weight"] = "model-00002-of-00002.safetensors";
  write_file(idx, j.dump());
  std::vector<std::string> problems;
  auto ck = Checkpoint::open(tmp / "ck", problems);
  std::string s1 = (tmp / "ck" / "model-00001-of-00002.safetensors").string();
  std::string s2 = (tmp / "ck" / "model-00002-of-00002.safetensors").string();
  EXPECT_THAT(problems, ::testing::ElementsAre(
                            s1 + ": tensor 'model.embed_tokens.weight': present in this shard but "
                                 "model.safetensors.index.json maps it to "
                                 "'model-00002-of-00002.safetensors'",
                            s2 + ": tensor 'model.embed_tokens.weight': listed in "
                                 "model.safetensors.index.json but absent from this shard"));
  EXPECT_EQ(ck->find("model.embed_tokens.weight"), nullptr);
}

TEST(Checkpoint, TotalSizeMismatch) {
  TempDir tmp;
  Written w = write_tiny(tmp / "ck", Tiny{});
  uint64_t sum = 0;
  for (const auto& [n, b] : w.data) sum += b.size();
  fs::path idx = tmp / "ck" / "model.safetensors.index.json";
  auto j = nlohmann::json::parse(read_file(idx));
  EXPECT_EQ(j["metadata"]["total_size"].get<uint64_t>(), sum);
  j["metadata"]["total_size"] = sum + 2;
  write_file(idx, j.dump());
  std::vector<std::string> problems;
  Checkpoint::open(tmp / "ck", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre(fmt::format(
                            "{}: field 'metadata.total_size': {} does not match the sum of "
                            "tensor bytes {}",
                            idx.string(), sum + 2, sum)));
}

TEST(Checkpoint, BrokenConfigAndMissingFiles) {
  TempDir tmp;
  write_tiny(tmp / "ck", Tiny{});
  write_file(tmp / "ck" / "config.json", "{\"model_type\": \"qwen3_moe\",\n  \"hidden\": ,\n}");
  std::vector<std::string> problems;
  auto ck = Checkpoint::open(tmp / "ck", problems);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_THAT(problems[0], StartsWith((tmp / "ck" / "config.json").string() +
                                      ": invalid JSON: parse error at line 2, column 13:"));
  EXPECT_TRUE(ck->config().is_null());
  EXPECT_GT(ck->tensors().size(), 10u);  // shards still checked and loaded
  problems.clear();
  Checkpoint::open(tmp / "nothing", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre((tmp / "nothing").string() + ": no such directory"));
  fs::create_directory(tmp / "empty");
  problems.clear();
  Checkpoint::open(tmp / "empty", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre((tmp / "empty").string() +
                                               ": no config.json (not a checkpoint directory)"));
  problems.clear();
  Checkpoint::open(tmp / "ck" / "config.json", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre((tmp / "ck" / "config.json").string() +
                                               " is a file, not a checkpoint directory"));
  // Without config.json the shards are not looked at: one line says why.
  fs::remove(tmp / "ck" / "config.json");
  problems.clear();
  Checkpoint::open(tmp / "ck", problems);
  EXPECT_THAT(problems, ::testing::ElementsAre((tmp / "ck").string() +
                                               ": no config.json (not a checkpoint directory)"));
  EXPECT_THROW(Checkpoint::open(tmp / "ck"), Error);
}

TEST(Checkpoint, IndexShardNameEscapingDirIsRefused) {
  TempDir tmp;
  const auto problems = problems_with_index(tmp, [](nlohmann::json& j) {
    j["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  });
  EXPECT_THAT(problems, Contains(HasSubstr("tensor 'model.norm.weight': shard "
                                           "\"../model-00002-of-00002.safetensors\" is not a "
                                           "file name inside the checkpoint directory")));
}

// --- Fuzzing: random mutations of a valid header never crash ---

TEST(SafetensorsFuzz, RandomMutationsNeverCrash) {
  OneShard o;
  const std::string good = read_file(o.file);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(good[size_t(i)]);
  std::mt19937 rng(2024);
  int with_problems = 0, clean = 0;
  fs::path f = o.tmp / "fuzz.safetensors";
  for (int it = 0; it < 2000; ++it) {
    std::string m = good;
    int kind = int(rng() % 4);
    if (kind == 0) {  // truncate anywhere
      m.resize(rng() % m.size());
    } else if (kind == 1) {  // flip bytes inside the length or the header
      for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k)
        m[rng() % (8 + hlen)] = char(rng() & 0xff);
    } else if (kind == 2) {  // change digits and punctuation in the header
      for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) {
        size_t at = 8 + rng() % hlen;
        m[at] = "0123456789,:[]{}\"-e. "[rng() % 21];
      }
    } else {  // a random length prefix
      uint64_t n = rng() % 3 == 0 ? uint64_t(rng()) << 32 | rng() : rng() % (m.size() + 16);
      m.replace(0, 8, length_prefix(n));
    }
    write_file(f, m);
    Shard s;
    std::vector<std::string> problems;
    std::vector<TensorInfo> ts;
    ASSERT_NO_THROW(ts = parse_safetensors_header(f, 0, s, problems)) << "iteration " << it;
    for (const auto& p : problems) EXPECT_EQ(p.find('\n'), std::string::npos) << p;
    if (!problems.empty()) {
      ++with_problems;
      continue;
    }
    ++clean;
    for (const auto& t : ts) {  // a clean header stays inside the file
      ASSERT_LE(t.begin, t.end);
      ASSERT_LE(s.data_offset + t.end, s.file_size);
    }
  }
  EXPECT_GT(with_problems, 1000);  // most mutations are caught
  EXPECT_GT(clean, 0);             // and some (e.g. inside a metadata string) are harmless
}
