// io/: aligned superset reads through both readers, direct and buffered, at
// odd offsets and lengths; the O_DIRECT fallback; every injected fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "io/direct_file.h"
#include "io/fault.h"
#include "io/reader.h"
#include "io/sysinfo.h"

using namespace moetier;
using namespace moetier::io;
namespace fs = std::filesystem;

namespace {

struct TempFile {
  fs::path dir, path;
  std::vector<std::byte> bytes;
  explicit TempFile(size_t size, uint32_t seed, const fs::path& base = fs::temp_directory_path()) {
    std::mt19937 rng(seed);
    dir = base / ("moetier_io_" + std::to_string(::getpid()) + "_" + std::to_string(seed));
    fs::create_directories(dir);
    path = dir / "data.bin";
    bytes.resize(size);
    for (auto& b : bytes) b = std::byte(rng() & 0xff);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(size));
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::vector<std::unique_ptr<Reader>> all_readers() {
  std::vector<std::unique_ptr<Reader>> rs;
  rs.push_back(make_pool_reader(1));
  rs.push_back(make_pool_reader(3));
  std::string why;
  if (auto u = make_uring_reader(4, &why)) rs.push_back(std::move(u));
  return rs;
}

// n random requests into one buffer; each lands in its own aligned region.
struct Batch {
  std::vector<ReadRequest> reqs;
  AlignedBuffer buf;
  Batch(DirectFile* f, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    size_t total = 0;
    for (auto [o, l] : ranges) total += aligned_span(o, l).length;
    buf.reset(total);
    size_t at = 0;
    for (auto [o, l] : ranges) {
      ReadRequest r;
      r.file = f;
      r.offset = o;
      r.length = l;
      r.dst = buf.as<std::byte>() + at;
      at += r.capacity();
      reqs.push_back(r);
    }
  }
};

struct FaultGuard {
  ~FaultGuard() { FaultInjector::global().disarm(); }
};

}  // namespace

TEST(IoAlign, SupersetCoversRange) {
  for (auto [o, l] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 1}, {1, 4095}, {4095, 2}, {4096, 4096}, {12345, 67890}, {8191, 1}}) {
    AlignedSpan s = aligned_span(o, l);
    EXPECT_EQ(s.offset % kAlign, 0u);
    EXPECT_EQ(s.length % kAlign, 0u);
    EXPECT_EQ(s.offset + s.head, o);
    EXPECT_GE(s.offset + s.length, o + l);
    EXPECT_LT(s.head, kAlign);
    EXPECT_LT(s.offset + s.length - (o + l), kAlign);
  }
}

TEST(IoReader, OddOffsetsMatchFileBytes) {
  TempFile tf(3 * 1024 * 1024 + 777, 11);
  std::mt19937 rng(5);
  for (bool direct : {true, false}) {
    auto f = DirectFile::open(tf.path, direct);
    EXPECT_EQ(f->size_at_open(), tf.bytes.size());
    for (auto& reader : all_readers()) {
      std::vector<std::pair<uint64_t, uint64_t>> ranges;
      for (int i = 0; i < 37; ++i) {
        uint64_t o = rng() % tf.bytes.size();
        uint64_t l = 1 + rng() % std::min<uint64_t>(300000, tf.bytes.size() - o);
        ranges.push_back({o, l});
      }
      ranges.push_back({tf.bytes.size() - 13, 13});  // ends at EOF, unaligned
      ranges.push_back({0, tf.bytes.size()});        // the whole file
      Batch b(f.get(), ranges);
      reader->read(b.reqs);
      for (const auto& r : b.reqs) {
        ASSERT_TRUE(r.ok()) << reader->name() << ": " << describe_failure(r);
        ASSERT_EQ(std::memcmp(r.data(), tf.bytes.data() + r.offset, r.length), 0)
            << reader->name() << " offset " << r.offset << " length " << r.length;
      }
      const IoCounters& c = reader->counters();
      EXPECT_EQ(c.requests, ranges.size());
      EXPECT_EQ(c.failures, 0u);
      EXPECT_EQ(direct ? c.direct_reads : c.buffered_reads, ranges.size()) << reader->name();
    }
  }
}

// Many tiny batches back to back: a pool worker that wakes after its batch is
// over must not claim a request of the next one (it used to, and read_batch
// then waited forever for the request it skipped).
TEST(IoReader, PoolReaderNeverLosesARequestBetweenBatches) {
  TempFile tf(64 * 1024, 17);
  auto f = DirectFile::open(tf.path, /*direct=*/false);
  auto reader = make_pool_reader(4);
  auto done = std::async(std::launch::async, [&] {
    for (int i = 0; i < 20000; ++i) {
      Batch b(f.get(), {{uint64_t(i % 1000) * 61, 1 + uint64_t(i % 3)}});
      reader->read(b.reqs);
      if (!b.reqs[0].ok()) return false;
    }
    return true;
  });
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "pool reader: a batch never completed (deadlock)\n");
    std::_Exit(1);  // the reading thread cannot be stopped
  }
  EXPECT_TRUE(done.get());
  EXPECT_EQ(reader->counters().requests, 20000u);
}

TEST(IoReader, ReadPastEndIsAShortRead) {
  TempFile tf(10000, 12);
  auto f = DirectFile::open(tf.path);
  for (auto& reader : all_readers()) {
    Batch b(f.get(), {{9000, 2000}, {100, 50}});
    reader->read(b.reqs);
    EXPECT_FALSE(b.reqs[0].ok());
    EXPECT_EQ(b.reqs[0].err, 0);
    EXPECT_NE(describe_failure(b.reqs[0]).find("short read"), std::string::npos);
    EXPECT_NE(describe_failure(b.reqs[0]).find(tf.path.string()), std::string::npos);
    EXPECT_TRUE(b.reqs[1].ok());
    EXPECT_EQ(reader->counters().failures, 1u);
  }
}

TEST(IoReader, UnalignedDestinationIsRefused) {
  TempFile tf(8192, 13);
  auto f = DirectFile::open(tf.path);
  AlignedBuffer buf(3 * kAlign);
  ReadRequest r;
  r.file = f.get();
  r.length = 10;
  r.dst = buf.as<std::byte>() + 1;
  auto reader = make_pool_reader(2);
  EXPECT_THROW(reader->read(std::span(&r, 1)), Error);
}

TEST(IoFallback, RefusedDirectOpenIsCountedAndReadsStillWork) {
  FaultGuard guard;
  TempFile tf(50000, 14);
  FaultSpec s;
  s.kind = FaultKind::RefuseDirect;
  s.count = 0;
  FaultInjector::global().arm(s);
  auto f = DirectFile::open(tf.path);
  EXPECT_FALSE(f->direct());
  EXPECT_EQ(f->fallbacks(), 1u);
  EXPECT_NE(f->fallback_reason().find("O_DIRECT"), std::string::npos);
  for (auto& reader : all_readers()) {
    Batch b(f.get(), {{4097, 30000}, {3, 5}});
    reader->read(b.reqs);
    for (const auto& r : b.reqs) {
      ASSERT_TRUE(r.ok()) << describe_failure(r);
      EXPECT_EQ(std::memcmp(r.data(), tf.bytes.data() + r.offset, r.length), 0);
    }
    EXPECT_EQ(reader->counters().buffered_reads, 2u);
    EXPECT_EQ(reader->counters().direct_reads, 0u);
  }
}

TEST(IoFallback, TmpfsEitherRefusesDirectOrReadsCorrectly) {
  if (!fs::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempFile tf(20000, 15, "/dev/shm");
  auto f = DirectFile::open(tf.path);
  // Kernels before 6.6 refuse O_DIRECT on tmpfs; newer ones accept it.
  EXPECT_EQ(f->fallbacks(), f->direct() ? 0u : 1u);
  auto reader = make_reader();
  Batch b(f.get(), {{1, 19999}});
  reader->read(b.reqs);
  ASSERT_TRUE(b.reqs[0].ok());
  EXPECT_EQ(std::memcmp(b.reqs[0].data(), tf.bytes.data() + 1, 19999), 0);
}

TEST(IoFault, EachInjectedFaultFailsOnlyItsRead) {
  FaultGuard guard;
  TempFile tf(200000, 16);
  auto f = DirectFile::open(tf.path);
  for (FaultKind kind :
       {FaultKind::ShortRead, FaultKind::Eio, FaultKind::Truncate, FaultKind::Corrupt}) {
    for (auto& reader : all_readers()) {
      FaultSpec s;
      s.kind = kind;
      s.skip = 1;                         // the second read of the batch
      if (kind == FaultKind::Truncate) {  // every read; only the one past 100000 fails
        s.skip = 0;
        s.count = 0;
        s.size = 100000;
      }
      FaultInjector::global().arm(s);
      Batch b(f.get(), {{10, 100}, {70001, 9999}, {150000, 3}});
      // With several threads the "second" read is whichever completes second:
      // count outcomes instead of positions.
      reader->read(b.reqs);
      EXPECT_EQ(FaultInjector::global().fired(), kind == FaultKind::Truncate ? 3u : 1u)
          << fault_kind_name(kind);
      int bad = 0, corrupt = 0;
      for (const auto& r : b.reqs) {
        if (!r.ok()) {
          ++bad;
          std::string why = describe_failure(r);
          EXPECT_NE(why.find(tf.path.string()), std::string::npos) << why;
          if (kind == FaultKind::Eio) {
            EXPECT_NE(why.find("Input/output error"), std::string::npos);
          }
          continue;
        }
        if (std::memcmp(r.data(), tf.bytes.data() + r.offset, r.length) != 0) {
          ++corrupt;
          EXPECT_EQ(r.data()[0], std::byte{0xff});
        }
      }
      if (kind == FaultKind::Corrupt) {
        EXPECT_EQ(bad, 0);
        EXPECT_EQ(corrupt, 1);
      } else {
        EXPECT_EQ(bad, 1) << fault_kind_name(kind) << " " << reader->name();
        EXPECT_EQ(corrupt, 0);
      }
      FaultInjector::global().disarm();
      reader->read(b.reqs);  // and the next read is clean
      for (const auto& r : b.reqs) ASSERT_TRUE(r.ok());
    }
  }
}

TEST(IoFault, RealTruncationAfterOpenIsAShortRead) {
  TempFile tf(100000, 17);
  auto f = DirectFile::open(tf.path);
  fs::resize_file(tf.path, 30000);
  for (auto& reader : all_readers()) {
    Batch b(f.get(), {{40000, 1000}, {29990, 20}, {100, 1000}});
    reader->read(b.reqs);
    EXPECT_FALSE(b.reqs[0].ok());
    EXPECT_FALSE(b.reqs[1].ok());
    EXPECT_TRUE(b.reqs[2].ok());
  }
}

TEST(IoFault, SpecParsing) {
  FaultSpec s = parse_fault_spec("truncate:path=model-0002:skip=3:count=0:size=4096");
  EXPECT_EQ(s.kind, FaultKind::Truncate);
  EXPECT_EQ(s.path_contains, "model-0002");
  EXPECT_EQ(s.skip, 3u);
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.size, 4096u);
  EXPECT_EQ(parse_fault_spec("eio").count, 1u);
  EXPECT_THROW(parse_fault_spec("explode"), Error);
  EXPECT_THROW(parse_fault_spec("eio:skip=x"), Error);
  EXPECT_THROW(parse_fault_spec("eio:colour=red"), Error);
  EXPECT_THROW(parse_fault_spec("eio:skip"), Error);
}

TEST(IoFault, PathFilterAndCount) {
  FaultGuard guard;
  TempFile a(10000, 18), b(10000, 19);
  auto fa = DirectFile::open(a.path), fb = DirectFile::open(b.path);
  FaultSpec s;
  s.kind = FaultKind::Eio;
  s.path_contains = b.dir.filename().string();
  s.count = 2;
  FaultInjector::global().arm(s);
  auto reader = make_pool_reader(1);
  int failed_b = 0;
  for (int i = 0; i < 4; ++i) {
    Batch ba(fa.get(), {{1, 10}}), bb(fb.get(), {{1, 10}});
    reader->read(ba.reqs);
    reader->read(bb.reqs);
    EXPECT_TRUE(ba.reqs[0].ok());
    failed_b += !bb.reqs[0].ok();
  }
  EXPECT_EQ(failed_b, 2);
}

TEST(IoSysinfo, ProcessReadBytesCountDirectReads) {
  auto before = process_io();
  if (!before) GTEST_SKIP() << "/proc/self/io unreadable";
  TempFile tf(4 * 1024 * 1024, 20);
  auto f = DirectFile::open(tf.path);
  if (!f->direct()) GTEST_SKIP() << "no O_DIRECT here";
  auto reader = make_reader();
  Batch b(f.get(), {{0, tf.bytes.size()}});
  auto start = process_io();
  reader->read(b.reqs);
  ASSERT_TRUE(b.reqs[0].ok());
  auto end = process_io();
  EXPECT_GE(end->read_bytes - start->read_bytes, tf.bytes.size());
  EXPECT_GT(mem_available_bytes().value_or(0), 0u);
  EXPECT_GE(mem_total_bytes().value_or(0), mem_available_bytes().value_or(0));
}
