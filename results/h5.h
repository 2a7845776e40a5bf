// A thin RAII layer over the HDF5 C API: every hid_t lives in an owning handle that closes it, and the few
// operations Strata needs (string/number attributes, growable 1-D column datasets) are one call each.
// Files are created with library-version bounds no newer than 1.10, so HDF5 1.10 readers can open them.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "results/error.h"

namespace strata::h5 {

// Owns one HDF5 identifier and closes it with the matching H5*close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept { swap(other); }
  Handle& operator=(Handle&& other) noexcept {
    Handle(std::move(other)).swap(*this);
    return *this;
  }
  ~Handle() {
    if (id_ >= 0 && closer_) closer_(id_);
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void swap(Handle& other) noexcept {
    std::swap(id_, other.id_);
    std::swap(closer_, other.closer_);
  }

 private:
  hid_t id_ = -1;
  Closer closer_ = nullptr;
};

// Turns off HDF5's own error-stack printing: Strata reports failures itself, naming the call and file.
void silence_library_errors();

bool is_hdf5_file(const std::string& path);
Handle create_file(const std::string& path);  // fails if it exists
Handle open_file(const std::string& path, bool writable);
void flush(const Handle& file);

Handle create_group(const Handle& parent, const std::string& name);
Handle open_group(const Handle& parent, const std::string& name);
bool exists(const Handle& parent, const std::string& name);
std::vector<std::string> child_names(const Handle& group);

// Attributes (scalar). Writing replaces an attribute that already exists.
void write_attr(const Handle& object, const std::string& name, const std::string& value);
void write_attr(const Handle& object, const std::string& name, int64_t value);
void write_attr(const Handle& object, const std::string& name, double value);
bool has_attr(const Handle& object, const std::string& name);
std::optional<std::string> read_string_attr(const Handle& object, const std::string& name);
std::optional<int64_t> read_int_attr(const Handle& object, const std::string& name);
std::optional<double> read_double_attr(const Handle& object, const std::string& name);
std::vector<std::string> attr_names(const Handle& object);
// Any scalar attribute rendered as text (numbers in full precision).
std::string read_attr_as_string(const Handle& object, const std::string& name);

// 1-D columns that grow by appending (chunked, unlimited). Strings are variable-length UTF-8.
enum class ColumnKind { int64, float64, string };
void create_column(const Handle& group, const std::string& name, ColumnKind kind);
void append_column(const Handle& group, const std::string& name, const std::vector<int64_t>& values);
void append_column(const Handle& group, const std::string& name, const std::vector<double>& values);
void append_column(const Handle& group, const std::string& name, const std::vector<std::string>& values);
ColumnKind column_kind(const Handle& group, const std::string& name);
size_t column_length(const Handle& group, const std::string& name);
// Reads the first min(rows, length) values: a reader truncates every column of a table to the same length.
std::vector<int64_t> read_int_column(const Handle& group, const std::string& name, size_t rows = SIZE_MAX);
std::vector<double> read_double_column(const Handle& group, const std::string& name, size_t rows = SIZE_MAX);
std::vector<std::string> read_string_column(const Handle& group, const std::string& name, size_t rows = SIZE_MAX);
Handle open_dataset(const Handle& group, const std::string& name);

// Reads the whole file as any reader may: every group's links, every object's attributes (values included) and
// every dataset's values, in slabs. A damaged file fails here rather than in a later reader, which may be
// another program. Throws ResultsError naming the first object that cannot be read.
void walk(const Handle& file);

}  // namespace strata::h5
