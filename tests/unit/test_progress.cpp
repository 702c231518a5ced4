// core/progress.h: off a terminal, plain lines at each tenth of the total
// crossed (each step for small totals, none for 0 done), notes as they are, a
// last "done" line, nothing else; on a terminal, one bar redrawn with \r and
// erase-to-end-of-line, notes above it, and the line ended by finish() or, for
// an error on its way, by the destructor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "core/progress.h"

namespace moetier {
namespace {

// What a Progress wrote to a memory stream.
struct Captured {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  ~Captured() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
};

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  for (size_t nl; (nl = s.find('\n', p)) != std::string::npos; p = nl + 1)
    out.push_back(s.substr(p, nl - p));
  EXPECT_EQ(p, s.size()) << "output ends with a newline";
  return out;
}

TEST(Progress, PlainLinesAtEachTenth) {
  Captured c;
  {
    Progress p("trace", 1000, c.f, false);
    EXPECT_FALSE(p.tty());
    for (int i = 0; i <= 1000; i += 7) p.update(i, "tokens");
    p.update(1000, "tokens");
    p.finish();
  }
  const auto l = lines(c.text());
  ASSERT_EQ(l.size(), 11u) << c.text();  // 10%, 20%, ... 100%, done
  EXPECT_EQ(l[0], "moetier: trace: 105/1000 (10%) tokens");
  EXPECT_EQ(l[4], "moetier: trace: 504/1000 (50%) tokens");
  EXPECT_EQ(l[9], "moetier: trace: 1000/1000 (100%) tokens");
  EXPECT_TRUE(
      std::regex_match(l[10], std::regex(R"(moetier: trace: done, 1000/1000 in \d+\.\d s)")))
      << l[10];
  EXPECT_EQ(c.text().find('\r'), std::string::npos);
  EXPECT_EQ(c.text().find('\x1b'), std::string::npos);
}

TEST(Progress, PlainSmallTotalsEveryStepNotesAndSummary) {
  Captured c;
  {
    Progress p("bench: load m", 3, c.f, false);
    p.update(0, "backend");  // nothing done yet: no line
    p.update(1, "core weights");
    p.note("moetier: a line of its own");
    p.update(2, "experts");
    p.update(3, "ready");
    p.finish("loaded");
    p.finish("twice");  // idempotent
    p.update(3, "after");
  }
  EXPECT_EQ(c.text(),
            "moetier: bench: load m: 1/3 (33%) core weights\n"
            "moetier: a line of its own\n"
            "moetier: bench: load m: 2/3 (66%) experts\n"
            "moetier: bench: load m: 3/3 (100%) ready\n"
            "moetier: bench: load m: loaded\n");
}

TEST(Progress, UnknownTotalCountsWithoutPercent) {
  Captured c;
  {
    Progress p("scan", 0, c.f, false);
    p.update(5);
    p.finish();
  }
  const auto l = lines(c.text());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0], "moetier: scan: 5");
  EXPECT_EQ(l[1].rfind("moetier: scan: done, 5 in ", 0), 0u) << l[1];
}

TEST(Progress, TerminalBarRedrawsInPlace) {
  Captured c;
  {
    Progress p("eval a code", 4, c.f, true);
    EXPECT_EQ(p.bar(1, "windows"), "[######..................] 1/4 25% windows");
    EXPECT_EQ(p.bar(4, ""), "[########################] 4/4 100%");
    p.update(1, "windows");
    p.update(4, "windows");  // the last step is always drawn
    p.finish("4 windows");
  }
  const std::string t = c.text();
  EXPECT_NE(t.find("\rmoetier: eval a code [######..................] 1/4 25% windows\x1b[K"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\rmoetier: eval a code [########################] 4/4 100% windows\x1b[K"),
            std::string::npos);
  EXPECT_EQ(t.substr(t.rfind('\r')), "\rmoetier: eval a code: 4 windows\x1b[K\n");
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 1) << "one line in the end";
}

TEST(Progress, TerminalNotesGoAboveTheBarAndAnErrorGetsItsOwnLine) {
  Captured c;
  {
    Progress p("bench", 2, c.f, true);
    p.update(1, "runs");
    p.note("moetier: run 1 done");
  }  // destroyed unfinished: an error message follows
  const std::string t = c.text();
  EXPECT_NE(t.find("\r\x1b[Kmoetier: run 1 done\nmoetier: bench [############............] 1/2"),
            std::string::npos)
      << t;
  EXPECT_EQ(t.back(), '\n');
}

}  // namespace
}  // namespace moetier
