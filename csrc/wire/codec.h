// Little-endian encoder/decoder. The Reader checks every bound and throws
// DecodeError instead of reading past the end or allocating what a peer asks for.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace hoplite {
namespace wire {

class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  void u8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) { fixed(v); }
  void u64(uint64_t v) { fixed(v); }
  void i32(int32_t v) { fixed(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { fixed(static_cast<uint64_t>(v)); }
  // Length-prefixed byte string.
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    buf_.append(s);
  }
  std::string take() { return std::move(buf_); }

 private:
  template <typename T>
  void fixed(T v) {
    for (size_t i = 0; i < sizeof(T); ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string buf_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t u8() { return static_cast<uint8_t>(fixed<uint8_t>()); }
  uint32_t u32() { return fixed<uint32_t>(); }
  uint64_t u64() { return fixed<uint64_t>(); }
  int32_t i32() { return static_cast<int32_t>(fixed<uint32_t>()); }
  int64_t i64() { return static_cast<int64_t>(fixed<uint64_t>()); }
  std::string str(size_t maxLen, const char* what) {
    uint32_t n = u32();
    if (n > maxLen) throw DecodeError(std::string(what) + " longer than its bound");
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  void expectEnd(const char* what) const {
    if (pos_ != size_) throw DecodeError(std::string("trailing bytes after ") + what);
  }
  size_t remaining() const { return size_ - pos_; }

 private:
  void need(size_t n, const char* what) const {
    if (n > size_ - pos_) throw DecodeError(std::string("truncated ") + what);
  }
  template <typename T>
  T fixed() {
    need(sizeof(T), "integer");
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(data_[pos_ + i]) << (8 * i));
    pos_ += sizeof(T);
    return v;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace wire
}  // namespace hoplite
