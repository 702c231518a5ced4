#include <gtest/gtest.h>

#include "core/error.h"
#include "core/units.h"

using namespace moetier;

TEST(Units, ParsesDecimalAndBinarySizes) {
  EXPECT_EQ(parse_bytes("0"), 0u);
  EXPECT_EQ(parse_bytes("4097"), 4097u);
  EXPECT_EQ(parse_bytes("17B"), 17u);
  EXPECT_EQ(parse_bytes("512MB"), 512000000u);
  EXPECT_EQ(parse_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("8GiB"), 8ull << 30);
  EXPECT_EQ(parse_bytes("81GB"), 81000000000ull);
  EXPECT_EQ(parse_bytes("81gb"), 81000000000ull);
  EXPECT_EQ(parse_bytes(" 3 kib "), 3072u);
  EXPECT_EQ(parse_bytes("3K"), 3072u);
  EXPECT_EQ(parse_bytes("2T"), 2ull << 40);
  EXPECT_EQ(parse_bytes("1.5KiB"), 1536u);
  EXPECT_EQ(parse_bytes("0.1GB"), 100000000u);
  EXPECT_EQ(parse_bytes("1.5"), 1u);  // whole bytes, rounded down
  EXPECT_EQ(parse_bytes("16383PiB"), 16383ull << 50);
}

TEST(Units, RefusesBadSizesWithOneLineNamingTheFlag) {
  for (const char* bad : {"", "GB", "-1GB", "8XB", "8 G B", "1e9", "99999999999999999999",
                          "16384PiB", "abc", "8GiB\x01"}) {
    try {
      parse_bytes(bad, "--arena");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(m.rfind("--arena: invalid size '", 0), 0u) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
  try {
    parse_bytes("8XB", "--budget");
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "--budget: invalid size '8XB' (unknown unit 'xb'; e.g. 512MB, 8GiB, 81GB)");
  }
}

TEST(Units, Formats) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(8ull << 30), "8.00 GiB");
  EXPECT_EQ(format_bytes((1ull << 20) - 1), "1.00 MiB");
  EXPECT_EQ(format_bytes(81000000000ull), "75.44 GiB");
  for (uint64_t v : {1ull, 999ull, 4097ull, 123456789ull, 81000000000ull}) {
    // Round trip within the printed precision.
    std::string s = format_bytes(v);
    std::string num = s.substr(0, s.find(' '));
    std::string unit = s.substr(s.find(' ') + 1);
    double back = double(parse_bytes(num + unit));
    EXPECT_NEAR(back, double(v), double(v) * 0.005 + 1) << s;
  }
}

TEST(Units, PercentagesAndTheirShareOfACount) {
  EXPECT_EQ(parse_percent("40%", "--keep"), 40.0);
  EXPECT_EQ(parse_percent("12.5%", "--keep"), 12.5);
  EXPECT_EQ(parse_percent("100%", "--keep"), 100.0);
  EXPECT_EQ(parse_percent("40", "--keep"), std::nullopt);  // not a percentage: the caller's
  EXPECT_EQ(parse_percent("8GiB", "--arena"), std::nullopt);
  for (const char* bad : {"%", "0%", "-5%", "101%", "5%%", " 5%", "1e1%", "nan%", "abc%"}) {
    try {
      parse_percent(bad, "--keep");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("--keep: invalid percentage '") + bad + "' (expected 0 < N <= 100)");
    }
  }
  EXPECT_EQ(percent_of(40, 64), 26u);   // 25.6, rounded up
  EXPECT_EQ(percent_of(25, 64), 16u);   // exact
  EXPECT_EQ(percent_of(10, 512), 52u);  // 51.2
  EXPECT_EQ(percent_of(0.1, 16), 1u);   // at least one
  EXPECT_EQ(percent_of(100, 16), 16u);
}
