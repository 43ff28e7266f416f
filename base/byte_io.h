// ByteWriter / ByteReader: a flat little-endian encoding of numbers, strings and arrays for
// messages between processes of the same build (the data-parallel front end's step mail).
//
// The reader treats its input as untrusted: every read is bounds-checked, every length is
// checked against what is left before anything is allocated, and the first failure sticks
// (later reads return zeros) so a decoder checks ok() once at the end.
//
// Thread-safety: none; one writer or reader per thread.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace peerserve {

static_assert(std::endian::native == std::endian::little, "byte_io assumes a little-endian host");

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>* out) : out_(out) {}

  template <typename T>
  requires std::is_arithmetic_v<T>
  void put(T value) {
    const size_t at = out_->size();
    out_->resize(at + sizeof(T));
    std::memcpy(out_->data() + at, &value, sizeof(T));
  }
  void put_bool(bool value) { put<uint8_t>(value ? 1 : 0); }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    const size_t at = out_->size();
    out_->resize(at + s.size());
    if (!s.empty()) std::memcpy(out_->data() + at, s.data(), s.size());
  }
  template <typename T>
  requires std::is_arithmetic_v<T>
  void put_array(std::span<const T> values) {
    put<uint64_t>(values.size());
    const size_t at = out_->size();
    out_->resize(at + values.size_bytes());
    if (!values.empty()) std::memcpy(out_->data() + at, values.data(), values.size_bytes());
  }

 private:
  std::vector<std::byte>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}

  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  size_t remaining() const { return in_.size() - pos_; }

  template <typename T>
  requires std::is_arithmetic_v<T> T get() {
    T value{};
    if (!take(sizeof(T))) return value;
    std::memcpy(&value, in_.data() + pos_ - sizeof(T), sizeof(T));
    return value;
  }
  bool get_bool() {
    const uint8_t b = get<uint8_t>();
    if (b > 1) ok_ = false;
    return b == 1;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    if (!ok_ || n > remaining()) return fail_string();
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  requires std::is_arithmetic_v<T> std::vector<T> get_array() {
    const uint64_t n = get<uint64_t>();
    if (!ok_ || n > remaining() / sizeof(T)) {
      ok_ = false;
      return {};
    }
    std::vector<T> values(n);
    if (n > 0) std::memcpy(values.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return values;
  }
  // A count of items that each take at least `min_item_bytes` more bytes: larger than what
  // is left can hold is a failure (so a forged count never drives a huge loop).
  uint64_t get_count(size_t min_item_bytes) {
    const uint64_t n = get<uint64_t>();
    if (!ok_ || (min_item_bytes > 0 && n > remaining() / min_item_bytes)) {
      ok_ = false;
      return 0;
    }
    return n;
  }

 private:
  bool take(size_t n) {
    if (!ok_ || n > remaining()) {
      ok_ = false;
      return false;
    }
    pos_ += n;
    return true;
  }
  std::string fail_string() {
    ok_ = false;
    return {};
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace peerserve
