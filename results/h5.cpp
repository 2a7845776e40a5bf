// Implementation of the HDF5 RAII layer (see h5.h).
#include "results/h5.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sys/stat.h>

namespace strata::h5 {
namespace {

// Every column of every table takes at least one whole chunk, and most tables are a few rows: 256 rows (2 KiB of
// numbers, 4 KiB of string references) keep a strata-step run of 14 cases at 1.0 MB instead of 6.3 MB with
// 4,096, and appending 80,000 samples was no slower.
constexpr hsize_t kChunkRows = 256;

Handle string_type() {
  hid_t type = STRATA_H5_CHECK(H5Tcopy(H5T_C_S1));
  Handle handle(type, H5Tclose);
  STRATA_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  STRATA_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  return handle;
}

Handle scalar_space() { return Handle(STRATA_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose); }

hid_t memory_type(ColumnKind kind) {
  return kind == ColumnKind::int64 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE;
}

void remove_attr_if_present(const Handle& object, const std::string& name) {
  if (has_attr(object, name)) STRATA_H5_CHECK(H5Adelete(object.get(), name.c_str()));
}

void write_scalar_attr(const Handle& object, const std::string& name, hid_t file_type, hid_t mem_type,
                       const void* value) {
  remove_attr_if_present(object, name);
  Handle space = scalar_space();
  Handle attr(STRATA_H5_CHECK(H5Acreate2(object.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                         H5P_DEFAULT)),
              H5Aclose);
  STRATA_H5_CHECK(H5Awrite(attr.get(), mem_type, value));
}

// Grows a 1-D dataset by values.size() rows and writes them at the end.
void append_raw(const Handle& group, const std::string& name, hid_t mem_type, const void* data, size_t count) {
  if (count == 0) return;
  Handle dataset = open_dataset(group, name);
  Handle old_space(STRATA_H5_CHECK(H5Dget_space(dataset.get())), H5Sclose);
  hsize_t old_rows = 0;
  STRATA_H5_CHECK(H5Sget_simple_extent_dims(old_space.get(), &old_rows, nullptr));
  hsize_t new_rows = old_rows + count;
  STRATA_H5_CHECK(H5Dset_extent(dataset.get(), &new_rows));
  Handle file_space(STRATA_H5_CHECK(H5Dget_space(dataset.get())), H5Sclose);
  hsize_t start = old_rows, n = count;
  STRATA_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr));
  Handle mem_space(STRATA_H5_CHECK(H5Screate_simple(1, &n, nullptr)), H5Sclose);
  STRATA_H5_CHECK(H5Dwrite(dataset.get(), mem_type, mem_space.get(), file_space.get(), H5P_DEFAULT, data));
}

}  // namespace

void silence_library_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

bool is_hdf5_file(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return false;
  return H5Fis_hdf5(path.c_str()) > 0;
}

namespace {
Handle file_access_v110() {
  Handle fapl(STRATA_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
  STRATA_H5_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_EARLIEST, H5F_LIBVER_V110));
  return fapl;
}
}  // namespace

Handle create_file(const std::string& path) {
  Handle fapl = file_access_v110();
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
  if (file < 0) throw ResultsError("cannot create HDF5 file " + path);
  return Handle(file, H5Fclose);
}

Handle open_file(const std::string& path, bool writable) {
  Handle fapl = file_access_v110();
  hid_t file = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (file < 0) throw ResultsError("cannot open HDF5 file " + path);
  return Handle(file, H5Fclose);
}

void flush(const Handle& file) { STRATA_H5_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL)); }

Handle create_group(const Handle& parent, const std::string& name) {
  // Track creation order so runs and columns list in the order they were written.
  Handle gcpl(STRATA_H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
  STRATA_H5_CHECK(H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  return Handle(STRATA_H5_CHECK(H5Gcreate2(parent.get(), name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)),
                H5Gclose);
}

Handle open_group(const Handle& parent, const std::string& name) {
  hid_t group = H5Gopen2(parent.get(), name.c_str(), H5P_DEFAULT);
  if (group >= 0) return Handle(group, H5Gclose);
  if (!exists(parent, name)) throw ResultsError("HDF5 group not found: " + name);
  // There, but not a group: a dataset where the schema has a group, a link to nothing, or a damaged object header.
  const hid_t id = H5Oopen(parent.get(), name.c_str(), H5P_DEFAULT);
  if (id < 0) throw ResultsError("cannot open HDF5 object " + name + " (a link to nothing, or a damaged object header)");
  const Handle object(id, H5Oclose);
  if (H5Iget_type(object.get()) != H5I_GROUP) throw ResultsError("HDF5 object " + name + " is not a group");
  throw ResultsError("cannot open the group " + name);
}

bool exists(const Handle& parent, const std::string& name) {
  return H5Lexists(parent.get(), name.c_str(), H5P_DEFAULT) > 0;
}

std::vector<std::string> child_names(const Handle& group) {
  H5G_info_t info{};
  STRATA_H5_CHECK(H5Gget_info(group.get(), &info));
  // Creation order where the group tracks it, else name order.
  H5_index_t index = H5_INDEX_NAME;
  hid_t gcpl = H5Gget_create_plist(group.get());
  if (gcpl >= 0) {
    unsigned flags = 0;
    if (H5Pget_link_creation_order(gcpl, &flags) >= 0 && (flags & H5P_CRT_ORDER_INDEXED)) index = H5_INDEX_CRT_ORDER;
    H5Pclose(gcpl);
  }
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t len = STRATA_H5_CHECK(
        H5Lget_name_by_idx(group.get(), ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string name(static_cast<size_t>(len), '\0');
    STRATA_H5_CHECK(H5Lget_name_by_idx(group.get(), ".", index, H5_ITER_INC, i, name.data(), name.size() + 1,
                                       H5P_DEFAULT));
    names.push_back(name);
  }
  return names;
}

void write_attr(const Handle& object, const std::string& name, const std::string& value) {
  Handle type = string_type();
  const char* text = value.c_str();
  write_scalar_attr(object, name, type.get(), type.get(), &text);
}

void write_attr(const Handle& object, const std::string& name, int64_t value) {
  write_scalar_attr(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attr(const Handle& object, const std::string& name, double value) {
  write_scalar_attr(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(const Handle& object, const std::string& name) {
  return H5Aexists(object.get(), name.c_str()) > 0;
}

namespace {
Handle open_attr(const Handle& object, const std::string& name) {
  return Handle(STRATA_H5_CHECK(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT)), H5Aclose);
}
H5T_class_t attr_class(const Handle& attr) {
  Handle type(STRATA_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  return H5Tget_class(type.get());
}
}  // namespace

std::optional<std::string> read_string_attr(const Handle& object, const std::string& name) {
  if (!has_attr(object, name)) return std::nullopt;
  Handle attr = open_attr(object, name);
  if (attr_class(attr) != H5T_STRING) return std::nullopt;
  Handle file_type(STRATA_H5_CHECK(H5Aget_type(attr.get())), H5Tclose);
  if (H5Tis_variable_str(file_type.get()) > 0) {
    Handle type = string_type();
    char* text = nullptr;
    STRATA_H5_CHECK(H5Aread(attr.get(), type.get(), &text));
    std::string value = text ? text : "";
    Handle space = scalar_space();
    H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, &text);
    return value;
  }
  // Fixed-length strings, as other writers (h5py with numpy bytes) may produce.
  size_t size = H5Tget_size(file_type.get());
  std::string value(size, '\0');
  STRATA_H5_CHECK(H5Aread(attr.get(), file_type.get(), value.data()));
  value.resize(value.find('\0') == std::string::npos ? value.size() : value.find('\0'));
  return value;
}

std::optional<int64_t> read_int_attr(const Handle& object, const std::string& name) {
  if (!has_attr(object, name)) return std::nullopt;
  Handle attr = open_attr(object, name);
  if (attr_class(attr) != H5T_INTEGER) return std::nullopt;
  int64_t value = 0;
  STRATA_H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value));
  return value;
}

std::optional<double> read_double_attr(const Handle& object, const std::string& name) {
  if (!has_attr(object, name)) return std::nullopt;
  Handle attr = open_attr(object, name);
  H5T_class_t cls = attr_class(attr);
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return std::nullopt;
  double value = 0;
  STRATA_H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value));
  return value;
}

std::vector<std::string> attr_names(const Handle& object) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  STRATA_H5_CHECK(H5Oget_info3(object.get(), &info, H5O_INFO_NUM_ATTRS));
#else
  H5O_info_t info{};
  STRATA_H5_CHECK(H5Oget_info2(object.get(), &info, H5O_INFO_NUM_ATTRS));
#endif
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.num_attrs; ++i) {
    ssize_t len = STRATA_H5_CHECK(
        H5Aget_name_by_idx(object.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT));
    std::string name(static_cast<size_t>(len), '\0');
    STRATA_H5_CHECK(H5Aget_name_by_idx(object.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                                       name.size() + 1, H5P_DEFAULT));
    names.push_back(name);
  }
  return names;
}

std::string read_attr_as_string(const Handle& object, const std::string& name) {
  if (auto text = read_string_attr(object, name)) return *text;
  if (auto integer = read_int_attr(object, name)) return std::to_string(*integer);
  if (auto real = read_double_attr(object, name)) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.17g", *real);
    return buffer;
  }
  return "";
}

void create_column(const Handle& group, const std::string& name, ColumnKind kind) {
  hsize_t zero = 0, unlimited = H5S_UNLIMITED, chunk = kChunkRows;
  Handle space(STRATA_H5_CHECK(H5Screate_simple(1, &zero, &unlimited)), H5Sclose);
  Handle dcpl(STRATA_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  STRATA_H5_CHECK(H5Pset_chunk(dcpl.get(), 1, &chunk));
  Handle strings;
  hid_t file_type = H5T_STD_I64LE;
  if (kind == ColumnKind::float64) file_type = H5T_IEEE_F64LE;
  if (kind == ColumnKind::string) {
    strings = string_type();
    file_type = strings.get();
  }
  // No compression: uncompressed chunks are rewritten in place, so a job killed while appending a case
  // cannot leave earlier rows in a half-written, relocated chunk.
  Handle dataset(STRATA_H5_CHECK(H5Dcreate2(group.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT,
                                            dcpl.get(), H5P_DEFAULT)),
                 H5Dclose);
}

void append_column(const Handle& group, const std::string& name, const std::vector<int64_t>& values) {
  append_raw(group, name, memory_type(ColumnKind::int64), values.data(), values.size());
}

void append_column(const Handle& group, const std::string& name, const std::vector<double>& values) {
  append_raw(group, name, memory_type(ColumnKind::float64), values.data(), values.size());
}

void append_column(const Handle& group, const std::string& name, const std::vector<std::string>& values) {
  std::vector<const char*> pointers;
  pointers.reserve(values.size());
  for (const auto& value : values) pointers.push_back(value.c_str());
  Handle type = string_type();
  append_raw(group, name, type.get(), pointers.data(), pointers.size());
}

Handle open_dataset(const Handle& group, const std::string& name) {
  hid_t dataset = H5Dopen2(group.get(), name.c_str(), H5P_DEFAULT);
  if (dataset < 0) throw ResultsError("HDF5 dataset not found: " + name);
  return Handle(dataset, H5Dclose);
}

ColumnKind column_kind(const Handle& group, const std::string& name) {
  Handle dataset = open_dataset(group, name);
  Handle type(STRATA_H5_CHECK(H5Dget_type(dataset.get())), H5Tclose);
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: return ColumnKind::int64;
    case H5T_FLOAT: return ColumnKind::float64;
    case H5T_STRING: return ColumnKind::string;
    default: throw ResultsError("column " + name + " has a type Strata does not read");
  }
}

size_t column_length(const Handle& group, const std::string& name) {
  Handle dataset = open_dataset(group, name);
  Handle space(STRATA_H5_CHECK(H5Dget_space(dataset.get())), H5Sclose);
  hsize_t rows = 0;
  STRATA_H5_CHECK(H5Sget_simple_extent_dims(space.get(), &rows, nullptr));
  return static_cast<size_t>(rows);
}

namespace {
// Selects rows [0, rows) of a 1-D dataset, in the file and in memory.
struct Prefix {
  Handle file_space, mem_space;
};
Prefix select_prefix(const Handle& dataset, size_t rows) {
  Handle file_space(STRATA_H5_CHECK(H5Dget_space(dataset.get())), H5Sclose);
  hsize_t start = 0, count = rows;
  STRATA_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr));
  Handle mem_space(STRATA_H5_CHECK(H5Screate_simple(1, &count, nullptr)), H5Sclose);
  return {std::move(file_space), std::move(mem_space)};
}

template <typename T>
std::vector<T> read_numeric(const Handle& group, const std::string& name, hid_t mem_type, size_t rows) {
  std::vector<T> values(std::min(rows, column_length(group, name)));
  if (values.empty()) return values;
  Handle dataset = open_dataset(group, name);
  Prefix prefix = select_prefix(dataset, values.size());
  STRATA_H5_CHECK(H5Dread(dataset.get(), mem_type, prefix.mem_space.get(), prefix.file_space.get(), H5P_DEFAULT,
                          values.data()));
  return values;
}
}  // namespace

std::vector<int64_t> read_int_column(const Handle& group, const std::string& name, size_t rows) {
  return read_numeric<int64_t>(group, name, H5T_NATIVE_INT64, rows);
}

std::vector<double> read_double_column(const Handle& group, const std::string& name, size_t rows) {
  return read_numeric<double>(group, name, H5T_NATIVE_DOUBLE, rows);
}

std::vector<std::string> read_string_column(const Handle& group, const std::string& name, size_t limit) {
  size_t rows = std::min(limit, column_length(group, name));
  std::vector<std::string> values;
  if (rows == 0) return values;
  Handle dataset = open_dataset(group, name);
  Handle type = string_type();
  std::vector<char*> pointers(rows, nullptr);
  Prefix prefix = select_prefix(dataset, rows);
  STRATA_H5_CHECK(H5Dread(dataset.get(), type.get(), prefix.mem_space.get(), prefix.file_space.get(), H5P_DEFAULT,
                          pointers.data()));
  values.reserve(rows);
  for (char* text : pointers) values.emplace_back(text ? text : "");
  H5Dvlen_reclaim(type.get(), prefix.mem_space.get(), H5P_DEFAULT, pointers.data());
  return values;
}

}  // namespace strata::h5

namespace strata::h5 {
namespace {

// A damaged header can claim any size; reading more than this in one piece is refused rather than attempted.
constexpr size_t kWalkSlabBytes = size_t{16} << 20;

// Frees what reading variable-length data allocated, for types that hold any.
void reclaim_if_variable(hid_t mem_type, hid_t mem_space, void* buffer) {
  if (H5Tis_variable_str(mem_type) > 0 || H5Tdetect_class(mem_type, H5T_VLEN) > 0)
    H5Dvlen_reclaim(mem_type, mem_space, H5P_DEFAULT, buffer);
}

Handle native_type_of(hid_t file_type) {
  return Handle(STRATA_H5_CHECK(H5Tget_native_type(file_type, H5T_DIR_DEFAULT)), H5Tclose);
}

void read_attribute(hid_t object, hsize_t index, const std::string& where) {
  char name_buffer[256] = {};
  H5Aget_name_by_idx(object, ".", H5_INDEX_NAME, H5_ITER_INC, index, name_buffer, sizeof name_buffer, H5P_DEFAULT);
  const std::string what = "attribute " + std::to_string(index) + (name_buffer[0] ? " ('" + std::string(name_buffer) + "')" : "") +
                           " of " + where;
  hid_t id = H5Aopen_by_idx(object, ".", H5_INDEX_NAME, H5_ITER_INC, index, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) throw ResultsError("cannot open " + what);
  Handle attr(id, H5Aclose);
  hid_t type_id = H5Aget_type(attr.get()), space_id = H5Aget_space(attr.get());
  Handle file_type(type_id, H5Tclose), space(space_id, H5Sclose);
  if (type_id < 0 || space_id < 0) throw ResultsError("cannot read the type or shape of " + what);
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  if (points < 0) throw ResultsError("cannot read the shape of " + what);
  if (points == 0) return;
  Handle mem_type = native_type_of(file_type.get());
  const size_t size = H5Tget_size(mem_type.get());
  if (size == 0 || static_cast<size_t>(points) > kWalkSlabBytes / size) throw ResultsError(what + " claims an impossible size");
  std::vector<unsigned char> buffer(size * static_cast<size_t>(points));
  if (H5Aread(attr.get(), mem_type.get(), buffer.data()) < 0) throw ResultsError("cannot read the value of " + what);
  reclaim_if_variable(mem_type.get(), space.get(), buffer.data());
}

// Every value of a dataset, read along its first dimension in slabs of at most kWalkSlabBytes.
void read_dataset(hid_t dataset, const std::string& where) {
  hid_t type_id = H5Dget_type(dataset), space_id = H5Dget_space(dataset);
  Handle file_type(type_id, H5Tclose), file_space(space_id, H5Sclose);
  if (type_id < 0 || space_id < 0) throw ResultsError("cannot read the type or shape of dataset " + where);
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  if (rank < 0 || rank > H5S_MAX_RANK) throw ResultsError("cannot read the shape of dataset " + where);
  Handle mem_type = native_type_of(file_type.get());
  const size_t size = H5Tget_size(mem_type.get());
  if (size == 0) throw ResultsError("dataset " + where + " has an element size of zero");
  if (rank == 0) {
    if (H5Sget_simple_extent_type(file_space.get()) == H5S_NULL) return;
    if (size > kWalkSlabBytes) throw ResultsError("dataset " + where + " claims an impossible element size");
    std::vector<unsigned char> buffer(size);
    Handle scalar(STRATA_H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
    if (H5Dread(dataset, mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()) < 0)
      throw ResultsError("cannot read dataset " + where);
    reclaim_if_variable(mem_type.get(), scalar.get(), buffer.data());
    return;
  }
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (H5Sget_simple_extent_dims(file_space.get(), dims.data(), nullptr) < 0)
    throw ResultsError("cannot read the extent of dataset " + where);
  size_t row_bytes = size;
  for (int d = 1; d < rank; ++d) {
    if (dims[static_cast<size_t>(d)] == 0) return;
    if (dims[static_cast<size_t>(d)] > kWalkSlabBytes / row_bytes)
      throw ResultsError("dataset " + where + " claims an impossible extent");
    row_bytes *= static_cast<size_t>(dims[static_cast<size_t>(d)]);
  }
  const hsize_t slab_rows = std::max<hsize_t>(1, kWalkSlabBytes / row_bytes);
  std::vector<unsigned char> buffer;
  for (hsize_t row = 0; row < dims[0]; row += slab_rows) {
    std::vector<hsize_t> start(static_cast<size_t>(rank), 0), count = dims;
    start[0] = row;
    count[0] = std::min(slab_rows, dims[0] - row);
    if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
      throw ResultsError("cannot select rows of dataset " + where);
    Handle mem_space(STRATA_H5_CHECK(H5Screate_simple(rank, count.data(), nullptr)), H5Sclose);
    buffer.assign(static_cast<size_t>(count[0]) * row_bytes, 0);
    if (H5Dread(dataset, mem_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, buffer.data()) < 0)
      throw ResultsError("cannot read rows " + std::to_string(row) + " to " + std::to_string(row + count[0]) +
                         " of dataset " + where);
    reclaim_if_variable(mem_type.get(), mem_space.get(), buffer.data());
  }
}

void read_attributes(hid_t object, const std::string& where) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info{};
  const herr_t got = H5Oget_info3(object, &info, H5O_INFO_NUM_ATTRS);
#else
  H5O_info_t info{};
  const herr_t got = H5Oget_info2(object, &info, H5O_INFO_NUM_ATTRS);
#endif
  if (got < 0) throw ResultsError("cannot read the header of " + where);
  for (hsize_t i = 0; i < info.num_attrs; ++i) read_attribute(object, i, where);
}

// Groups nest a few levels in a results file; a damaged one may claim a loop.
constexpr int kWalkDepth = 64;

void walk_group(hid_t group, const std::string& where, int depth) {
  if (depth > kWalkDepth) throw ResultsError("groups nest deeper than " + std::to_string(kWalkDepth) + " levels at " + where);
  read_attributes(group, where);
  H5G_info_t info{};
  if (H5Gget_info(group, &info) < 0) throw ResultsError("cannot read the links of group " + where);
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t length = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (length < 0) throw ResultsError("cannot read link " + std::to_string(i) + " of group " + where);
    std::string name(static_cast<size_t>(length), '\0');
    if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size() + 1, H5P_DEFAULT) < 0)
      throw ResultsError("cannot read link " + std::to_string(i) + " of group " + where);
    const std::string path = (where == "/" ? "" : where) + "/" + name;
    H5L_info_t link{};
    if (H5Lget_info(group, name.c_str(), &link, H5P_DEFAULT) < 0) throw ResultsError("cannot read the link " + path);
    if (link.type != H5L_TYPE_HARD) continue;  // soft and external links name other places; their targets are walked there
    hid_t id = H5Oopen(group, name.c_str(), H5P_DEFAULT);
    if (id < 0) throw ResultsError("cannot open " + path);
    Handle object(id, H5Oclose);
    switch (H5Iget_type(object.get())) {
      case H5I_GROUP: walk_group(object.get(), path, depth + 1); break;
      case H5I_DATASET:
        read_attributes(object.get(), path);
        read_dataset(object.get(), path);
        break;
      case H5I_DATATYPE: read_attributes(object.get(), path); break;
      default: throw ResultsError(path + " is an object of no known kind");
    }
  }
}

}  // namespace

void walk(const Handle& file) {
  try {
    walk_group(file.get(), "/", 0);
  } catch (const std::bad_alloc&) {
    throw ResultsError("an object claims more memory than there is");
  }
}

}  // namespace strata::h5
