// CB3: the 3-bit codebook weight encoding written by `moetier repack --experts
// cb3` (docs/formats.md, "cb3 experts"). Shared by the scalar reference, the
// CPU kernels and the converter; a CUDA kernel reads the same bytes.
//
// A matrix [rows, cols] is two arrays:
//   codes    [rows, cb3_row_bytes(cols)] U8: each row is a little-endian bit
//            stream; the code of column c occupies bits 3c, 3c+1, 3c+2, where
//            bit i of the stream is bit (i mod 8) (LSB first) of byte i / 8.
//            Equivalently, columns 8g..8g+7 live in bytes 3g..3g+2: with
//            v = b0 | b1 << 8 | b2 << 16, code(8g + j) = (v >> 3j) & 7.
//            Unused high bits of a row's last byte are zero. Rows start on a
//            byte boundary; any cols >= 1 is allowed.
//   codebook [rows, 8] F16: element (r, c) = codebook[r][code(r, c)].
#pragma once

#include <cstdint>
#include <cstring>

namespace moetier::kernels {

inline constexpr int kCb3Centroids = 8;

// Bytes of one row of codes: ceil(3 * cols / 8).
inline constexpr int64_t cb3_row_bytes(int64_t cols) { return (3 * cols + 7) / 8; }

// Code of column c of a row of codes.
inline uint8_t cb3_code(const uint8_t* row, int64_t c) {
  const int64_t bit = 3 * c;
  const int sh = int(bit & 7);
  unsigned v = row[bit >> 3];
  if (sh > 5) v |= unsigned(row[(bit >> 3) + 1]) << 8;  // straddles two bytes
  return uint8_t((v >> sh) & 7u);
}

// The 24 bits of group g (columns 8g..8g+7) of a row.
inline uint32_t cb3_group(const uint8_t* row, int64_t g) {
  const uint8_t* p = row + 3 * g;
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16;
}

// Packs codes [cols] (values 0..7) into out [cb3_row_bytes(cols)].
inline void cb3_pack_row(const uint8_t* codes, int64_t cols, uint8_t* out) {
  std::memset(out, 0, size_t(cb3_row_bytes(cols)));
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t bit = 3 * c;
    const int sh = int(bit & 7);
    const unsigned v = codes[c] & 7u;
    out[bit >> 3] = uint8_t(out[bit >> 3] | (v << sh));
    if (sh > 5) out[(bit >> 3) + 1] = uint8_t(out[(bit >> 3) + 1] | (v >> (8 - sh)));
  }
}

// Centroid k of row r of a codebook [rows, 8] f16, as raw f16 bits (the
// codebook may sit at any byte offset, so it is read with memcpy).
inline uint16_t cb3_centroid_bits(const uint8_t* codebook, int64_t r, int k) {
  uint16_t h;
  std::memcpy(&h, codebook + (r * kCb3Centroids + k) * 2, 2);
  return h;
}

}  // namespace moetier::kernels
