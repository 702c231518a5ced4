// Byte sizes on the command line: parse_bytes("8GiB"), format_bytes(n).
//
// Accepted: a non-negative number (integer or decimal fraction) followed by an
// optional unit, case-insensitive, optional space between:
//   B              bytes (also no unit at all)
//   KB MB GB TB PB decimal: 10^3, 10^6, 10^9, 10^12, 10^15
//   KiB MiB GiB TiB PiB  binary: 2^10 ... 2^50
//   K M G T P      binary as well (as dd and numfmt --from=iec read them)
// Fractions are rounded down to whole bytes ("1.5KiB" = 1536). Values that do
// not fit in 64 bits are refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moetier {

// Throws Error "WHAT: invalid size 'TEXT' (...)" naming `what` (e.g. "--arena").
uint64_t parse_bytes(std::string_view text, std::string_view what = "size");

// Shares on the command line ("--arena 25%", "--keep 40%"): "N%" with
// 0 < N <= 100 (decimals allowed) gives N; text not ending in '%' gives
// nullopt. Throws Error "WHAT: invalid percentage 'TEXT' (expected 0 < N <= 100)".
std::optional<double> parse_percent(std::string_view text, std::string_view what);

// ceil(pct% of total), at least 1 (a product within 1e-9 above an integer
// rounds down to it: 25% of 64 is 16).
uint64_t percent_of(double pct, uint64_t total);

// Human-readable, binary units with two decimals: "512 B", "1.50 KiB", "8.00 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace moetier
