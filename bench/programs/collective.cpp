// strata-collective: collective operations over MPI (the library's algorithms and Strata's own: ring,
// recursive doubling, hierarchical) or NCCL, with nccl-tests' flags, sizes and bandwidth conventions, in
// any layout: the world, each node, one rank per node, or the TP/PP/DP groups of a process grid, all groups
// at once. Every size, dtype, operation and algorithm is checked on an untimed iteration with inputs whose
// exact result is known; every rank's every timed iteration is kept.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <chrono>

#include "bench/harness/axes.h"
#include "bench/harness/buffers.h"
#include "bench/harness/gpu_device.h"
#include "bench/harness/harness.h"
#include "collectives/process_group.h"
#include "collectives/algorithms.h"
#include "collectives/check.h"
#include "collectives/layout.h"
#include "collectives/types.h"
#ifdef STRATA_HAVE_CUDA
#include "bench/harness/timer_cuda.h"
#include "collectives/nccl_backend.h"
#include "kernels/cuda_info.h"
#endif

namespace {

using namespace strata;
using coll::Algo;
using coll::DataType;
using coll::Operation;
using coll::RedOp;
using coll::Counts;
using coll::bus_factor;
using coll::counts_for;
using coll::is_reduction;

struct Options {
  std::string collectives = "allreduce";
  std::string minbytes = "8", maxbytes = "64M", stepbytes = "0";
  int stepfactor = 2;
  std::string datatypes = "float";
  std::string redops;  // empty: sum (an explicit value on a non-reduction is a usage error)
  int check = 1;
  int root = 0;
  std::string backend = "mpi";
  std::string algos = "library";
  std::string mode = "pipelined";
  int ops_per_sample = 8;
  std::string placement = "both";
  int ranks_per_node = 0;
  std::string group = "world";
  std::string grid;
  std::string grid_dim;
  bool mixed = false;
  bool device_buffers = false;
  std::string segment_bytes = "1M";      // ring reduction segments (Strata's algorithms)
  std::string max_message_bytes = "1G";  // larger point-to-point messages are split (Strata's algorithms)
  std::string flush_bytes = "0";         // blocking mode: bytes each rank writes before each timed operation
};

// One rank's group: the communicator it runs the collective on, and that group's node map.
struct Group {
  std::string kind;
  MPI_Comm comm = MPI_COMM_WORLD;
  int index = 0;   // which group of this kind
  int count = 1;   // how many groups of this kind
  std::vector<int> node_of_rank;
  Comm intra, inter;  // the group's ranks on my node; the group's ranks with my local index
};

Group make_group(const std::string& kind, const coll::Layout& layout, const coll::Grid* grid) {
  Group g;
  g.kind = kind;
  if (kind == "intra") {
    g.comm = layout.intra(), g.index = layout.node(), g.count = layout.node_count();
  } else if (kind == "inter") {
    g.comm = layout.inter(), g.index = layout.local_rank(), g.count = layout.world_size() / layout.node_count();
  } else if (kind == "tp") {
    g.comm = grid->tp(), g.index = grid->tp_group(), g.count = grid->shape().pp * grid->shape().dp;
  } else if (kind == "pp") {
    g.comm = grid->pp(), g.index = grid->pp_group(), g.count = grid->shape().tp * grid->shape().dp;
  } else if (kind == "dp") {
    g.comm = grid->dp(), g.index = grid->dp_group(), g.count = grid->shape().tp * grid->shape().pp;
  }
  g.node_of_rank = layout.node_of_ranks_in(g.comm);
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(g.comm, &rank));
  g.intra = split(g.comm, g.node_of_rank[static_cast<size_t>(rank)], rank);
  g.inter = split(g.comm, g.intra.rank(), g.node_of_rank[static_cast<size_t>(rank)]);
  return g;
}

template <typename T>
std::vector<T> parse_list(const std::string& text, const char* flag, const char* what, auto parse, auto all) {
  if (text == "all") return std::vector<T>(all.begin(), all.end());
  std::vector<T> out;
  for (const auto& item : split_list(text, flag)) {
    auto value = parse(item);
    if (!value) throw UsageError(std::string(flag) + ": unknown " + what + " '" + item + "'");
    out.push_back(*value);
  }
  return out;
}

// --inject-wrong-element: flips a high exponent (or value) bit of output element 0 on the host image, so the
// element differs from the exact result in every dtype, whatever the backend that produced it.
void corrupt_first_element(std::vector<unsigned char>& out, DataType dtype) {
  const size_t elem = coll::size_of(dtype);
  if (out.size() >= elem) out[elem - 1] ^= 0x40;  // little-endian: the top byte of element 0
}

struct Case {
  Operation op;
  Algo algo;
  DataType dtype;
  RedOp redop;
  bool has_redop;
  size_t bytes;
  bool in_place;
  AxisPoint point;  // the parameter values it was made of, for its `cases` row
};

// The columns a case's parameters fill: operation, dtype and reduction step together (a reduction only for
// the operations that have one), then the requested size S, the algorithm and the placement, so the algorithms
// and placements compared at one size run next to each other in time. The group kind and the concurrent
// operation are single values here; --mixed varies them.
Axes collective_axes(const std::vector<Operation>& ops, const std::vector<DataType>& dtypes,
                     const std::vector<RedOp>& redops, const std::vector<size_t>& sizes,
                     const std::vector<Algo>& algos, const std::vector<int64_t>& placements) {
  std::vector<std::vector<AxisValue>> op_dtype_redop;
  for (Operation op : ops)
    for (DataType d : dtypes)
      for (RedOp r : is_reduction(op) ? redops : std::vector<RedOp>{RedOp::sum})
        op_dtype_redop.push_back({std::string(coll::name(op)), std::string(coll::name(d)),
                                  is_reduction(op) ? std::string(coll::name(r)) : std::string("none")});
  std::vector<std::string> algo_names;
  for (Algo a : algos) algo_names.emplace_back(coll::name(a));
  Axes axes;
  axes.add_zipped({{"operation", ""}, {"dtype", ""}, {"redop", ""}}, std::move(op_dtype_redop))
      .add("requested_bytes", std::vector<int64_t>(sizes.begin(), sizes.end()), "B")
      .add("algo", std::move(algo_names))
      .add("in_place", placements, "1");
  return axes;
}

// Where one case's buffers live and how an operation runs on them: host memory for MPI, device memory
// (staged through the host for inputs and checks) for NCCL. In place, the input sits inside the output as
// the operations table says (NCCL's layout).
class Executor {
 public:
  virtual ~Executor() = default;
  void prepare(const Case& c, const Counts& counts, int group_rank) {
    const size_t elem = coll::size_of(c.dtype);
    send_bytes_ = counts.send_elems * elem;
    recv_bytes_ = counts.recv_elems * elem;
    if (!c.in_place) {
      send_ = allocate(send_bytes_, 0);
      recv_ = allocate(recv_bytes_, 1);
      return;
    }
    char* buffer = static_cast<char*>(allocate(std::max(send_bytes_, recv_bytes_), 0));
    const coll::InPlaceOffsets at = coll::in_place_offsets(c.op, counts, elem, group_rank);
    send_ = buffer + at.send, recv_ = buffer + at.recv;
  }
  virtual void load_inputs(const std::vector<unsigned char>& host) = 0;  // send_bytes_ of them
  virtual void read_outputs(std::vector<unsigned char>& host) = 0;       // recv_bytes_ of them
  virtual coll::Traffic run(const Case& c, size_t count, int root) = 0;
  virtual void finish_timed() {}
  virtual Timer& timer() = 0;
  // Before the first case: both buffers at the largest size any case needs, so no case allocates (a plain C
  // benchmark's buffers, allocated once; page-aligned, as MPI's internal copies are slow on unaligned ones).
  void reserve(size_t bytes) {
    allocate(bytes, 0);
    allocate(bytes, 1);
  }

 protected:
  virtual void* allocate(size_t bytes, int slot) = 0;  // slot 0 or 1; reused across cases
  void* send_ = nullptr;
  void* recv_ = nullptr;
  size_t send_bytes_ = 0, recv_bytes_ = 0;
};

// MPI on host buffers, or on device buffers (--device-buffers) where the MPI library is CUDA-aware. An
// operation the process groups have runs through them (started, then waited for at once), the code the
// training step runs; the rest, and device buffers, take the blocking algorithms of algorithms.h.
// shm_buffers: the host buffers are registered with the group's shared-memory node (collectives/shm.h), so
// the shm algorithm runs its direct path on them, as NCCL runs on registered user buffers.
class MpiExecutor final : public Executor {
 public:
  // group: the process group over the case's communicator, or null for the blocking path throughout.
  MpiExecutor(coll::Context ctx, std::unique_ptr<coll::Group> group, bool device_buffers, bool shm_buffers)
      : ctx_(std::move(ctx)), group_(std::move(group)), device_(device_buffers), shm_buffers_(shm_buffers && group_) {}
  void load_inputs(const std::vector<unsigned char>& host) override {
#ifdef STRATA_HAVE_CUDA
    if (device_) return cuda::copy_to_device(send_, host.data(), send_bytes_);
#endif
    if (send_bytes_) std::memcpy(send_, host.data(), send_bytes_);
  }
  void read_outputs(std::vector<unsigned char>& host) override {
    host.resize(recv_bytes_);
#ifdef STRATA_HAVE_CUDA
    if (device_) return cuda::copy_to_host(host.data(), recv_, recv_bytes_);
#endif
    if (recv_bytes_) std::memcpy(host.data(), recv_, recv_bytes_);
  }
  coll::Traffic run(const Case& c, size_t count, int root) override {
    const coll::OperationInfo& op = coll::info(c.op);
    const coll::OpArgs args{send_, recv_, count, c.dtype, c.redop, root};
    if (group_ && op.group_algos.has(c.algo)) {
      coll::Work work = op.start(*group_, c.algo, args, coll::Waiting::at_once);
      work.wait();
      return work.traffic();
    }
    return op.run(c.algo, args, ctx_);
  }
  Timer& timer() override { return timer_; }

 private:
  void* allocate(size_t bytes, int slot) override {
#ifdef STRATA_HAVE_CUDA
    if (device_) {
      if (!device_buffers_[slot] || device_buffers_[slot]->size() < bytes)
        device_buffers_[slot] = std::make_unique<cuda::DeviceMemory>(bytes);
      return device_buffers_[slot]->get();
    }
#endif
    if (shm_buffers_) {  // collective over the group: every rank reserves the same largest size first
      if (!registered_[slot].data() || bytes > registered_[slot].size()) registered_[slot] = group_->allocate_shm(bytes);
      return registered_[slot].data();
    }
    PageBuffer& buffer = buffers_[slot];
    if (bytes > buffer.size) {
      void* memory = std::aligned_alloc(kPage, (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage);
      if (!memory) throw std::bad_alloc();
      buffer.data.reset(static_cast<unsigned char*>(memory));
      buffer.size = bytes;
    }
    return buffer.data.get();
  }
  static constexpr size_t kPage = 4096;
  struct FreeMemory {
    void operator()(unsigned char* memory) const { std::free(memory); }
  };
  struct PageBuffer {
    std::unique_ptr<unsigned char, FreeMemory> data;
    size_t size = 0;
  };
  coll::Context ctx_;
  std::unique_ptr<coll::Group> group_;
  bool device_;
  bool shm_buffers_;
  coll::ShmBuffer registered_[2];  // destroyed before group_, whose node they belong to
  PageBuffer buffers_[2];
#ifdef STRATA_HAVE_CUDA
  std::unique_ptr<cuda::DeviceMemory> device_buffers_[2];
#endif
  HostTimer timer_;
};

#ifdef STRATA_HAVE_CUDA
class NcclExecutor final : public Executor {
 public:
  NcclExecutor(MPI_Comm group, int group_index, int device)
      : nccl_(group, group_index, device), timer_(make_cuda_event_timer(nccl_.stream())) {}
  void load_inputs(const std::vector<unsigned char>& host) override {
    nccl_.copy_to_device(send_, host.data(), send_bytes_);
  }
  void read_outputs(std::vector<unsigned char>& host) override {
    nccl_.synchronize();
    host.resize(recv_bytes_);
    nccl_.copy_to_host(host.data(), recv_, recv_bytes_);
  }
  coll::Traffic run(const Case& c, size_t count, int root) override {
    nccl_.run(c.op, send_, recv_, count, c.dtype, c.redop, root);
    return {};
  }
  Timer& timer() override { return *timer_; }

 private:
  void* allocate(size_t bytes, int slot) override {
    if (bytes > capacity_[slot]) {
      buffers_[slot] = nccl_.device_alloc(bytes);
      capacity_[slot] = bytes;
    }
    return buffers_[slot];
  }
  coll::NcclBackend nccl_;
  std::unique_ptr<Timer> timer_;
  void* buffers_[2] = {nullptr, nullptr};
  size_t capacity_[2] = {0, 0};
};
#endif

// The columns besides the parameter axes': constant within a run, or derived from a case.
void describe_columns(Run& run) {
  run.cases()
      .add_column("backend", ColumnKind::string, "")
      .add_column("mode", ColumnKind::string, "", "pipelined: back-to-back operations per sample; blocking: one per sample")
      .add_column("ops_per_sample", ColumnKind::int64, "1")
      .add_column("flush_bytes", ColumnKind::int64, "B",
                  "bytes each rank wrote (and its inputs) before each timed operation")
      .add_column("root", ColumnKind::int64, "1", "-1 for unrooted operations")
      .add_column("count", ColumnKind::int64, "1", "the operation's count argument")
      .add_column("size_bytes", ColumnKind::float64, "B", "nccl-tests' S: allreduce, broadcast, reduce, sendrecv: the "
                  "buffer; allgather: the gathered buffer; reduce_scatter: the whole input; alltoall: one rank's send buffer")
      .add_column("bytes_per_rank", ColumnKind::float64, "B", "OSU's size: one rank's share")
      .add_column("n_groups", ColumnKind::int64, "1")
      .add_column("group_size", ColumnKind::int64, "1").add_column("n_nodes", ColumnKind::int64, "1")
      .add_column("ranks_per_node", ColumnKind::int64, "1").add_column("emulated_nodes", ColumnKind::int64, "1")
      .add_column("grid", ColumnKind::string, "");
  run.summary()
      .add_column("algbw", ColumnKind::float64, "B/s", "size_bytes / median over iterations of the per-iteration max over ranks")
      .add_column("busbw", ColumnKind::float64, "B/s", "algbw x bus_factor (nccl-tests)")
      .add_column("bus_factor", ColumnKind::float64, "1", "allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; else 1")
      .add_column("busbw_rankmean", ColumnKind::float64, "B/s", "as busbw, from the per-iteration mean over ranks")
      .add_column("intra_bytes_per_rank", ColumnKind::float64, "B", "bytes a rank sent inside its node per operation, mean over ranks; NaN for library algorithms")
      .add_column("inter_bytes_per_rank", ColumnKind::float64, "B", "bytes a rank sent to other nodes per operation, mean over ranks; NaN for library algorithms")
      .add_column("slowdown_vs_alone", ColumnKind::float64, "1", "median time with the concurrent operation / median time alone");
}

// Per-group results of one case: each group's per-iteration max over its ranks.
void append_group_rows(Run& run, const CaseResult& r, const std::vector<int>& group_of_rank, int n_groups,
                       const Counts& n, double factor) {
  Table groups("groups");
  groups.add_column("case", ColumnKind::int64, "1").add_column("group", ColumnKind::int64, "1")
      .add_column("group_size", ColumnKind::int64, "1").add_column("world_ranks", ColumnKind::string, "")
      .add_column("time_median", ColumnKind::float64, "s", "median over iterations of the per-iteration max over the group's ranks")
      .add_column("algbw", ColumnKind::float64, "B/s").add_column("busbw", ColumnKind::float64, "B/s");
  const int ranks = static_cast<int>(group_of_rank.size());
  for (int g = 0; g < n_groups; ++g) {
    std::vector<double> per_iteration(static_cast<size_t>(r.iterations), 0.0);
    std::string members;
    int size = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      if (group_of_rank[static_cast<size_t>(rank)] != g) continue;
      members += (members.empty() ? "" : ",") + std::to_string(rank);
      ++size;
      for (int i = 0; i < r.iterations; ++i)
        per_iteration[static_cast<size_t>(i)] = std::max(per_iteration[static_cast<size_t>(i)],
                                                         r.samples[static_cast<size_t>(rank) * r.iterations + i]);
    }
    double median = summarize(per_iteration).median;
    groups.set("case", r.index).set("group", g).set("group_size", size).set("world_ranks", members);
    groups.set("time_median", median).set("algbw", n.size_bytes / median).set("busbw", n.size_bytes / median * factor);
    groups.end_row();
  }
  run.append_table(groups);
}


// --mixed: an allreduce in every TP group and a reduce-scatter in every DP group at the same time (the
// overlap of tensor-parallel and data-parallel traffic in a training step), each also alone, through the
// process groups' non-blocking operations (collectives/process_group.h), the code the training step runs.
// Each operation's time runs from the common start to the moment this rank sees it complete; both are tested
// in turn, as the step progresses its operations.
int run_mixed(int argc, char** argv, const HarnessOptions& h, const Options& o, const Cli& cli,
              const coll::Layout& layout, const coll::Grid& grid, Algo algo, const std::vector<size_t>& sizes) {
  const DataType dtype = coll::parse_datatype(split_list(o.datatypes, "--datatype").front()).value_or(DataType::float32);
  const size_t elem = coll::size_of(dtype);
  const int tp = grid.shape().tp, dp = grid.shape().dp;
  // Per size, four rows: each operation alone, then each beside the other.
  Axes axes;
  axes.add("requested_bytes", std::vector<int64_t>(sizes.begin(), sizes.end()), "B")
      .add("algo", std::vector<std::string>{std::string(coll::name(algo))})
      .add("in_place", std::vector<int64_t>{0}, "1")
      .add_zipped({{"operation", ""}, {"dtype", ""}, {"redop", ""}, {"group_kind", ""}, {"concurrent_with", ""}},
                  {{"allreduce", std::string(coll::name(dtype)), "sum", "tp", ""},
                   {"reduce_scatter", std::string(coll::name(dtype)), "sum", "dp", ""},
                   {"allreduce", std::string(coll::name(dtype)), "sum", "tp", "reduce_scatter/dp"},
                   {"reduce_scatter", std::string(coll::name(dtype)), "sum", "dp", "allreduce/tp"}});
  const std::vector<AxisPoint> points = axes.product();
  // Each size holds an allreduce's and a reduce-scatter's inputs, outputs and expected values: about six buffers
  // of the size at most.
  const size_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  check_fits_in_memory("strata-collective --mixed at " + format_gib(double(largest)), 6.0 * double(largest),
                       host_memory_per_rank(), "the node's available memory over its ranks");
  Run run("strata-collective", argc, argv, h, cli.resolved_json(), "cpu");
  run.set_case_count(static_cast<int>(points.size()));
  describe_columns(run);
  axes.declare_columns(run.cases());
  ConsoleTable table({{"size(B)", 11}, {"op", 14}, {"group", 5}, {"with", 16}, {"time(us)", 10}, {"busbw", 8},
                      {"slowdown", 8}, {"#wrong", 6}});
  if (run.is_root()) {
    std::printf("# strata-collective --mixed: grid %s; allreduce in TP groups, reduce_scatter in DP groups; %s\n",
                coll::format_grid(grid.shape()).c_str(), std::string(coll::name(dtype)).c_str());
    std::printf("# time: median over iterations of the per-iteration max over ranks; slowdown = concurrent / alone\n");
    table.print_header();
  }
  int tp_rank = grid.tp_index(), dp_rank = grid.dp_index();
  coll::ProcessGroups groups(grid.shape(), layout.emulated() ? layout.world_size() / layout.node_count() : 0);
  for (size_t size_index = 0; size_index < sizes.size(); ++size_index) {
    const size_t bytes = sizes[size_index];
    Counts ar = counts_for(Operation::allreduce, bytes, elem, tp), rs = counts_for(Operation::reduce_scatter, bytes, elem, dp);
    const coll::CheckSpec ar_spec{Operation::allreduce, dtype, RedOp::sum};
    const coll::CheckSpec rs_spec{Operation::reduce_scatter, dtype, RedOp::sum};
    std::vector<unsigned char> ar_in = coll::check_inputs(ar_spec, ar, tp_rank);
    std::vector<unsigned char> rs_in = coll::check_inputs(rs_spec, rs, dp_rank);
    std::vector<unsigned char> ar_out(ar.recv_elems * elem + 1), rs_out(rs.recv_elems * elem + 1);
    // Times both (or one) from a common start: element 0 the allreduce, 1 the reduce-scatter.
    auto timed = [&](bool with_ar, bool with_rs) {
      double done[2] = {0, 0};
      STRATA_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      auto begin = std::chrono::steady_clock::now();
      coll::Work work[2];
      if (with_ar) work[0] = groups.tp().allreduce(algo, ar_in.data(), ar_out.data(), ar.count, dtype, RedOp::sum);
      if (with_rs) work[1] = groups.dp().reduce_scatter(algo, rs_in.data(), rs_out.data(), rs.count, dtype, RedOp::sum);
      bool pending[2] = {with_ar, with_rs};
      while (pending[0] || pending[1])
        for (int k = 0; k < 2; ++k)
          if (pending[k] && work[k].test()) {
            done[k] = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
            pending[k] = false;
          }
      return std::pair{done[0], done[1]};
    };
    const std::string what = "mixed allreduce/reduce_scatter " + std::to_string(bytes) + " B";
    run.begin_case(what, 4);
    std::vector<double> alone_ar, alone_rs, both_ar, both_rs;
    run.progress("the warm-up of " + what);
    for (int i = 0; i < h.warmup; ++i) run.tick(), timed(true, false), timed(false, true), timed(true, true);
    run.progress("the timed iterations of " + what);
    for (int i = 0; i < h.iters; ++i) {
      run.tick();
      alone_ar.push_back(timed(true, false).first);
      alone_rs.push_back(timed(false, true).second);
      auto [a, r] = timed(true, true);
      both_ar.push_back(a), both_rs.push_back(r);
    }
    if (injects_wrong_element(h, run.context().self.rank)) corrupt_first_element(ar_out, dtype);
    int64_t wrong_ar = coll::count_wrong(ar_spec, ar, ar_out, tp_rank, tp, 0);
    int64_t wrong_rs = coll::count_wrong(rs_spec, rs, rs_out, dp_rank, dp, 0);

    double alone_median[2] = {0, 0};
    // In the order of the zipped axis: each operation alone, then each beside the other.
    struct Row { const Counts* n; std::vector<double>* samples; int64_t wrong; int slot; int size; };
    Row rows[4] = {{&ar, &alone_ar, wrong_ar, 0, tp}, {&rs, &alone_rs, wrong_rs, 1, dp},
                   {&ar, &both_ar, wrong_ar, 0, tp}, {&rs, &both_rs, wrong_rs, 1, dp}};
    for (size_t k = 0; k < 4; ++k) {
      const Row& row = rows[k];
      const AxisPoint& point = points[size_index * 4 + k];
      const std::string& op_name = point.text("operation");
      const std::string& with = point.text("concurrent_with");
      const bool concurrent = !with.empty();
      const double factor = bus_factor(row.slot == 0 ? Operation::allreduce : Operation::reduce_scatter, row.size);
      CaseResult r = run.record(*row.samples, row.wrong, op_name + " " + point.text("group_kind") + (concurrent ? " concurrent" : " alone") + " " + std::to_string(row.n->size_bytes) + " B",
          [&](Table& t) {
            axes.fill(t, point);
            t.set("backend", "mpi").set("mode", "blocking").set("ops_per_sample", 1).set("flush_bytes", 0)
                .set("root", -1)
                .set("count", row.n->count).set("size_bytes", double(row.n->size_bytes))
                .set("bytes_per_rank", double(row.n->bytes_per_rank))
                .set("n_groups", layout.world_size() / row.size).set("group_size", row.size)
                .set("n_nodes", layout.node_count()).set("ranks_per_node", layout.world_size() / layout.node_count())
                .set("emulated_nodes", layout.emulated() ? 1 : 0).set("grid", coll::format_grid(grid.shape()));
          },
          [&](Table& t, const CaseResult& res) {
            double algbw = row.n->size_bytes / res.rankmax.median;
            if (!concurrent) alone_median[row.slot] = res.rankmax.median;
            t.set("algbw", algbw).set("busbw", algbw * factor).set("bus_factor", factor)
                .set("busbw_rankmean", row.n->size_bytes / res.rankmean.median * factor)
                .set("intra_bytes_per_rank", std::nan("")).set("inter_bytes_per_rank", std::nan(""))
                .set("slowdown_vs_alone", concurrent ? res.rankmax.median / alone_median[row.slot] : 1.0);
          });
      if (run.is_root())
        table.print_row({std::to_string(row.n->size_bytes), op_name, point.text("group_kind"), concurrent ? with : "(alone)",
                         format_fixed(r.rankmax.median * 1e6, 2),
                         format_fixed(row.n->size_bytes / r.rankmax.median / 1e9 * factor, 3),
                         format_fixed(concurrent ? r.rankmax.median / alone_median[row.slot] : 1.0, 3),
                         std::to_string(r.wrong_elements)});
    }
  }
  return run.finish();
}

void add_collective_options(Cli& cli, Options& o, HarnessOptions& h) {
  cli.option("collective", 0, "operations: " + join_names(names_of(coll::kAllOperations), ",", ",") + " or all", o.collectives);
  cli.option("minbytes", 'b', "smallest size S (K/M/G suffixes; nccl-tests' S per operation)", o.minbytes);
  cli.option("maxbytes", 'e', "largest size S", o.maxbytes);
  cli.option("stepfactor", 'f', "multiply the size by this between steps", o.stepfactor, 2);
  cli.option("stepbytes", 'i', "add this many bytes between steps instead (0: use --stepfactor)", o.stepbytes);
  cli.option("datatype", 'd', join_names(names_of(coll::kAllDataTypes), ",", ",") + " or all", o.datatypes);
  cli.option("redop", 'o', "reductions: " + join_names(names_of(coll::kAllRedOps), ",", ",") + " or all (reduction operations only) [sum]", o.redops);
  cli.option("check", 'c', "check every case's result on an untimed iteration (0/1)", o.check, 0);
  cli.option("root", 0, "root rank (in its group) of broadcast and reduce", o.root, 0);
  cli.choice("backend", 0, "communication library", o.backend, {"mpi", "nccl"});
  cli.option("algo", 'a', "algorithms: " + join_names(names_of(coll::kAllAlgos), ",", ",") + " or all", o.algos);
  cli.choice("mode", 'm', "pipelined: back-to-back operations timed as a loop (nccl-tests); blocking: one "
             "operation per timed interval, barrier between (OSU)", o.mode, {"pipelined", "blocking"});
  cli.option("ops-per-sample", 0, "operations per timed sample in pipelined mode", o.ops_per_sample, 1);
  cli.choice("placement", 0, "out-of-place, in-place, or both", o.placement, {"both", "out", "in"});
  cli.option("ranks-per-node", 0, "regroup consecutive ranks into emulated nodes of N (0: real nodes)", o.ranks_per_node, 0);
  cli.choice("group", 'g', "run in the world, in each node (intra), or among ranks with the same local index (inter)",
             o.group, {"world", "intra", "inter"});
  cli.option("grid", 0, "process grid tp=T,pp=P,dp=D (tp fastest-varying)", o.grid);
  cli.choice("grid-dim", 0, "run in every group of this grid dimension at once", o.grid_dim, {"", "tp", "pp", "dp"});
  cli.flag("mixed", 0, "with --grid: allreduce in the TP groups and reduce-scatter in the DP groups at the same "
           "time, each also alone; reports the slowdown", o.mixed);
  cli.flag("device-buffers", 0, "MPI backend: GPU buffers (needs a CUDA-aware MPI library; library algorithms, "
           "int8/int32/float/double, no avg)", o.device_buffers);
  cli.option("segment-bytes", 0, "Strata's ring: bytes per reduction segment (K/M/G suffixes), on the process "
             "groups and the blocking algorithms alike", o.segment_bytes);
  cli.option("max-message-bytes", 0, "Strata's algorithms: split point-to-point messages larger than this, on the "
             "process groups and the blocking algorithms alike", o.max_message_bytes);
  cli.option("flush-bytes", 0, "blocking mode, MPI host buffers: before each timed operation, outside its interval, "
             "every rank rewrites its inputs and writes this many bytes of a buffer of its own (K/M/G, rounded up "
             "to whole floats), as a training step's compute does between its collectives; 0: none", o.flush_bytes);
  add_harness_options(cli, h);
  cli.alias("warmup_iters", "warmup");
}

// What to run, from the flags alone: the operations, dtypes, algorithms, reductions, sizes and placements.
struct Plan {
  std::vector<Operation> ops;
  std::vector<DataType> dtypes;
  std::vector<Algo> algos;
  std::vector<RedOp> redops;
  std::vector<size_t> sizes;
  std::vector<int64_t> placements;  // 0 out of place, 1 in place
  int64_t segment_bytes = 0, max_message_bytes = 0;
  int64_t flush_bytes = 0;
};

// nccl-tests' sizes: from -b to -e, multiplied by -f (or stepped by -i).
std::vector<size_t> sweep_sizes(int64_t min_bytes, int64_t max_bytes, int64_t step_bytes, int step_factor) {
  std::vector<size_t> sizes;
  for (int64_t b = min_bytes; b <= max_bytes;) {
    sizes.push_back(static_cast<size_t>(b));
    int64_t next = step_bytes > 0 ? b + step_bytes : b * step_factor;
    if (next == b) next = b + 1;  // -b 0: continue from one element
    if (b == 0 && step_bytes == 0) next = std::max<int64_t>(1, min_bytes);
    b = next == 0 ? 1 : next;
    if (b > max_bytes) break;
  }
  return sizes;
}

Plan plan_collective(const Options& o) {
  Plan plan;
  plan.ops = parse_list<Operation>(o.collectives, "--collective", "operation", coll::parse_operation, coll::kAllOperations);
  plan.dtypes = parse_list<DataType>(o.datatypes, "--datatype", "datatype", coll::parse_datatype, coll::kAllDataTypes);
  plan.algos = parse_list<Algo>(o.algos, "--algo", "algorithm", coll::parse_algo, coll::kAllAlgos);
  const bool any_reduction = std::any_of(plan.ops.begin(), plan.ops.end(), is_reduction);
  if (!o.redops.empty() && !any_reduction)
    throw UsageError("--redop applies to reductions (allreduce, reduce_scatter, reduce), not to " + o.collectives);
  plan.redops = parse_list<RedOp>(o.redops.empty() ? "sum" : o.redops, "--redop", "reduction", coll::parse_redop, coll::kAllRedOps);
  const int64_t min_bytes = parse_bytes(o.minbytes, "--minbytes"), max_bytes = parse_bytes(o.maxbytes, "--maxbytes");
  const int64_t step_bytes = parse_bytes(o.stepbytes, "--stepbytes");
  if (min_bytes > max_bytes) throw UsageError("--minbytes " + o.minbytes + " is larger than --maxbytes " + o.maxbytes);
  for (DataType d : plan.dtypes) {
    int64_t elem = static_cast<int64_t>(coll::size_of(d));
    for (auto [flag, value] : {std::pair{"--minbytes", min_bytes}, std::pair{"--maxbytes", max_bytes}})
      if (value % elem)
        throw UsageError(std::string(flag) + " " + std::to_string(value) + " is not a multiple of " +
                         std::string(coll::name(d)) + "'s " + std::to_string(elem) + " bytes");
  }
  plan.sizes = sweep_sizes(min_bytes, max_bytes, step_bytes, o.stepfactor);
  if (o.backend == "nccl" && (o.algos != "library"))
    throw UsageError("--backend nccl runs NCCL's own algorithms only (--algo library); set NCCL_ALGO to steer them");
  plan.segment_bytes = parse_bytes(o.segment_bytes, "--segment-bytes");
  plan.max_message_bytes = parse_bytes(o.max_message_bytes, "--max-message-bytes");
  if (plan.segment_bytes <= 0) throw UsageError("--segment-bytes must be positive, got " + o.segment_bytes);
  if (plan.max_message_bytes <= 0 || plan.max_message_bytes > INT_MAX)
    throw UsageError("--max-message-bytes must be in 1.." + std::to_string(INT_MAX) + ", got " + o.max_message_bytes);
  if (o.mixed && o.grid.empty()) throw UsageError("--mixed needs --grid");
  if (o.mixed && o.backend != "mpi")
    throw UsageError("--mixed runs on the MPI process groups; with --backend " + o.backend + " it is not available");
  auto mixes = [](Algo a) {
    return coll::Group::supports(Operation::allreduce, a) && coll::Group::supports(Operation::reduce_scatter, a);
  };
  if (o.mixed && (plan.algos.size() != 1 || !mixes(plan.algos.front()))) {
    std::string mixable;
    for (Algo a : coll::kAllAlgos)
      if (mixes(a)) mixable += (mixable.empty() ? "" : ", ") + std::string(coll::name(a));
    throw UsageError("--mixed takes one algorithm of the process groups: " + mixable);
  }
  plan.flush_bytes = parse_bytes(o.flush_bytes, "--flush-bytes");
  if (plan.flush_bytes < 0) throw UsageError("--flush-bytes must be 0 or more, got " + o.flush_bytes);
  if (plan.flush_bytes > 0 && (o.mode != "blocking" || o.mixed))
    throw UsageError("--flush-bytes writes between timed operations: it needs --mode blocking (and no --mixed)");
  if (plan.flush_bytes > 0 && (o.backend != "mpi" || o.device_buffers))
    throw UsageError("--flush-bytes writes host memory: it needs --backend mpi without --device-buffers");
  if (!o.grid_dim.empty() && o.grid.empty()) throw UsageError("--grid-dim needs --grid");
  if (!o.grid.empty() && o.group != "world") throw UsageError("--group and --grid exclude each other; use --grid-dim");
  if (o.placement != "in") plan.placements.push_back(0);
  if (o.placement != "out") plan.placements.push_back(1);
  return plan;
}

// Whether `algo` runs `op` here: on the blocking path, or (HO-Ring, shm) on the process groups, which have no
// device-buffer path.
bool available(const Options& o, Operation op, Algo algo) {
  const bool on_groups = o.backend == "mpi" && !o.device_buffers;
  return coll::is_supported(op, algo) || (on_groups && coll::info(op).group_algos.has(algo));
}

// The executor of the group's cases: NCCL on the rank's GPU, or MPI (host or, with --device-buffers, device
// buffers; the blocking algorithms and the process groups). `device` gets what the rank drives.
std::unique_ptr<Executor> make_executor(const Options& o, const Plan& plan, const Group& group, int group_rank,
                                        int group_size, coll::MpiTypes& types, std::string& device) {
  device = "cpu";
  if (o.backend == "nccl") {
#ifdef STRATA_HAVE_CUDA
    const RankGpu gpu = select_rank_gpu("--backend nccl", /*exclusive=*/true);
    device = gpu.text;
    return std::make_unique<NcclExecutor>(group.comm, group.index, gpu.device);
#else
    throw UsageError("--backend nccl: this strata-collective was built without CUDA and NCCL");
#endif
  }
  if (o.device_buffers) {
#ifdef STRATA_HAVE_CUDA
    if (mpi_cuda_awareness() != "yes")
      throw UsageError("--device-buffers: this MPI library is not CUDA-aware (mpi_cuda_aware: " + mpi_cuda_awareness() + ")");
    if (o.algos != "library")
      throw UsageError("--device-buffers: Strata's own algorithms reduce on the host; use --algo library");
    for (DataType d : plan.dtypes)
      if (d == DataType::float16 || d == DataType::bfloat16)
        throw UsageError("--device-buffers: MPI has no 16-bit float reductions on device memory");
    for (RedOp r : plan.redops)
      if (r == RedOp::avg) throw UsageError("--device-buffers: MPI has no average; avg is finished on the host");
    device = select_rank_gpu("--device-buffers").text + " (MPI device buffers)";
#else
    throw UsageError("--device-buffers: this strata-collective was built without CUDA");
#endif
  }
  coll::Context ctx;
  ctx.comm = group.comm;
  ctx.types = &types;
  ctx.node_of_rank = group.node_of_rank;
  ctx.intra = group.intra.get();
  ctx.inter = group.inter.get();
  ctx.rank = group_rank;
  ctx.size = group_size;
  ctx.ring_segment_bytes = static_cast<size_t>(plan.segment_bytes);
  ctx.max_message_bytes = static_cast<size_t>(plan.max_message_bytes);
#ifdef STRATA_HAVE_CUDA
  if (o.device_buffers) ctx.device_copy = &cuda::copy_on_device;  // the library path's copies between buffers
#endif
  // The process groups have no device-buffer path: --device-buffers keeps every case on the blocking path.
  std::unique_ptr<coll::Group> process_group;
  if (!o.device_buffers) {
    MPI_Comm dup = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_dup(group.comm, &dup));
    process_group = std::make_unique<coll::Group>(group.kind, Comm(dup), group.node_of_rank, types);
    process_group->ring_segment_bytes = static_cast<size_t>(plan.segment_bytes);
    process_group->max_message_bytes = static_cast<size_t>(plan.max_message_bytes);
  }
  // With shm among the algorithms, on ranks that all share memory, the buffers come from the group's
  // shared-memory node: every algorithm runs on them, shm on its direct path.
  bool shm_buffers = false;
  if (process_group && std::find(plan.algos.begin(), plan.algos.end(), Algo::shm) != plan.algos.end()) {
    MPI_Comm shared = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_split_type(group.comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared));
    const Comm shared_comm(shared);
    int all_share = shared_comm.size() == group_size ? 1 : 0;
    STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_share, 1, MPI_INT, MPI_MIN, group.comm));
    shm_buffers = all_share != 0;
  }
  return std::make_unique<MpiExecutor>(ctx, std::move(process_group), o.device_buffers, shm_buffers);
}

// The cases, typed, beside the axes' points they fill (an operation an algorithm does not run left out).
std::vector<Case> collective_cases(const Options& o, const Plan& plan, const Axes& axes) {
  const std::vector<AxisPoint> points = axes.product();
  std::vector<Case> cases;
  std::size_t next = 0;
  // The axes' product in its order: operation, dtype and reduction together, then size, algorithm, placement.
  for (Operation op : plan.ops)
    for (DataType d : plan.dtypes)
      for (RedOp r : is_reduction(op) ? plan.redops : std::vector<RedOp>{RedOp::sum})
        for (size_t bytes : plan.sizes)
          for (Algo a : plan.algos)
            for (int64_t in_place : plan.placements) {
              const AxisPoint& point = points.at(next++);
              if (point.text("operation") != coll::name(op) || point.text("algo") != coll::name(a) ||
                  point.integer("requested_bytes") != static_cast<int64_t>(bytes) || point.integer("in_place") != in_place)
                throw std::logic_error("strata-collective: the cases and the axes' points are out of step");
              if (available(o, op, a)) cases.push_back({op, a, d, r, is_reduction(op), bytes, in_place != 0, point});
            }
  return cases;
}

// What every case of the run shares.
struct CollectiveJob {
  const Options& o;
  const HarnessOptions& h;
  const Axes& axes;
  const Group& group;
  int group_rank = 0, group_size = 0;
  const std::string& group_kind;
  const coll::Layout& layout;
  const coll::Grid* grid;
  const std::vector<int>& group_of_rank;  // each rank's group, for the per-group table
  CacheFlush& flush;                       // --flush-bytes of this rank's own
};

// One case: checked on an untimed iteration, timed, recorded, printed.
void run_case(const CollectiveJob& job, const Case& c, Executor& executor, Run& run, ConsoleTable& table) {
  const Options& o = job.o;
  const size_t elem = coll::size_of(c.dtype);
  const Counts n = counts_for(c.op, c.bytes, elem, job.group_size);
  const std::string what = std::string(coll::name(c.op)) + " " + std::string(coll::name(c.algo)) + " " +
                           std::string(coll::name(c.dtype)) + (c.has_redop ? " " + std::string(coll::name(c.redop)) : "") +
                           " " + std::to_string(n.size_bytes) + " B" + (c.in_place ? " in place" : "") + ", " +
                           job.group_kind + " group " + std::to_string(job.group.index);
  run.begin_case(what);
  executor.prepare(c, n, job.group_rank);
  // Untimed correctness iteration on inputs with a known exact result.
  executor.load_inputs(coll::check_inputs({c.op, c.dtype, c.redop}, n, job.group_rank));
  coll::Traffic traffic = executor.run(c, n.count, o.root);
  int64_t wrong = 0;
  if (o.check) {
    std::vector<unsigned char> out;
    executor.read_outputs(out);
    if (injects_wrong_element(job.h, run.context().self.rank) && n.recv_elems > 0) corrupt_first_element(out, c.dtype);
    wrong = coll::count_wrong({c.op, c.dtype, c.redop}, n, out, job.group_rank, job.group_size, o.root);
  }
  // Timed iterations start from the same nonzero inputs; with --flush-bytes this rank first writes a buffer of its own
  // (nvbench's L2 flush) and then its inputs again, as a step's compute writes the collective's data last.
  const int ops_per_sample = o.mode == "pipelined" ? o.ops_per_sample : 1;
  const std::vector<unsigned char> inputs = coll::check_inputs({c.op, c.dtype, c.redop}, n, job.group_rank);
  executor.load_inputs(inputs);
  std::vector<double> samples = run.measure(
      executor.timer(), [&] { for (int k = 0; k < ops_per_sample; ++k) executor.run(c, n.count, o.root); },
      ops_per_sample, [&] {
        if (job.flush.empty()) return;
        job.flush.write();
        executor.load_inputs(inputs);
      });
  if (!job.flush.empty() && o.check) {
    // The last timed operation started from the inputs too: its result is checked as the untimed one was.
    std::vector<unsigned char> out;
    executor.read_outputs(out);
    wrong += coll::count_wrong({c.op, c.dtype, c.redop}, n, out, job.group_rank, job.group_size, o.root);
  }

  double traffic_mine[2] = {double(traffic.intra_bytes), double(traffic.inter_bytes)}, traffic_sum[2] = {0, 0};
  STRATA_MPI_CHECK(MPI_Reduce(traffic_mine, traffic_sum, 2, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD));
  const double factor = bus_factor(c.op, job.group_size);
  const bool own = c.algo != Algo::library;
  const int ranks = run.context().n_ranks;
  const std::string label = what.substr(0, what.find(','));
  CaseResult r = run.record(samples, wrong, label,
      [&](Table& t) {
        job.axes.fill(t, c.point);
        t.set("backend", o.backend).set("mode", o.mode).set("ops_per_sample", ops_per_sample)
            .set("flush_bytes", static_cast<int64_t>(job.flush.bytes()))
            .set("root", coll::info(c.op).rooted ? o.root : -1)
            .set("count", n.count).set("size_bytes", double(n.size_bytes))
            .set("bytes_per_rank", double(n.bytes_per_rank))
            .set("n_groups", job.group.count).set("group_size", job.group_size).set("n_nodes", job.layout.node_count())
            .set("ranks_per_node", job.layout.world_size() / job.layout.node_count())
            .set("emulated_nodes", job.layout.emulated() ? 1 : 0)
            .set("grid", job.grid ? coll::format_grid(job.grid->shape()) : "");
      },
      [&](Table& t, const CaseResult& res) {
        double algbw = n.size_bytes / res.rankmax.median;
        t.set("algbw", algbw).set("busbw", algbw * factor).set("bus_factor", factor)
            .set("busbw_rankmean", n.size_bytes / res.rankmean.median * factor)
            .set("intra_bytes_per_rank", own ? traffic_sum[0] / ranks : std::nan(""))
            .set("inter_bytes_per_rank", own ? traffic_sum[1] / ranks : std::nan(""))
            .set("slowdown_vs_alone", std::nan(""));
      },
      [&](const CaseResult& res) {
        if (run.is_root()) append_group_rows(run, res, job.group_of_rank, job.group.count, n, factor);
      });
  if (run.is_root()) {
    double t = r.rankmax.median;
    table.print_row({std::to_string(n.size_bytes), std::to_string(n.count), std::string(coll::name(c.dtype)),
                     c.has_redop ? std::string(coll::name(c.redop)) : "none",
                     coll::info(c.op).rooted ? std::to_string(o.root) : "-1",
                     std::string(coll::name(c.op)), std::string(coll::name(c.algo)), c.in_place ? "in" : "out",
                     format_fixed(t * 1e6, 2), format_fixed(n.size_bytes / t / 1e9, 3),
                     format_fixed(n.size_bytes / t / 1e9 * factor, 3), o.check ? std::to_string(r.wrong_elements) : "N/A"});
  }
}

int run_collective(int argc, char** argv) {
  HarnessOptions h;
  h.warmup = 5, h.iters = 20;
  h.timeout = "0";  // a collective's iterations take microseconds to seconds: a limit is the user's to choose
  Options o;
  Cli cli("strata-collective",
          "Collective operations over MPI or NCCL (nccl-tests flags and bandwidth conventions), in any layout.");
  add_collective_options(cli, o, h);
  if (!cli.parse(argc, argv)) return 0;
  const Plan plan = plan_collective(o);

  // The layout, the rank's group and its executor.
  coll::Layout layout(o.ranks_per_node);
  std::unique_ptr<coll::Grid> grid;
  if (!o.grid.empty()) grid = std::make_unique<coll::Grid>(coll::parse_grid(o.grid), layout);
  const std::string group_kind = o.grid_dim.empty() ? o.group : o.grid_dim;
  Group group = make_group(group_kind, layout, grid.get());
  int group_rank = 0, group_size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(group.comm, &group_rank));
  STRATA_MPI_CHECK(MPI_Comm_size(group.comm, &group_size));
  if (o.root >= group_size) throw UsageError("--root " + std::to_string(o.root) + " is not a rank of a group of " +
                                             std::to_string(group_size));
  for (Operation op : plan.ops)
    for (Algo a : plan.algos)
      if (!available(o, op, a) && o.algos != "all")
        throw UsageError("algorithm " + std::string(coll::name(a)) + " is not available for " + std::string(coll::name(op)) +
                         (coll::info(op).group_algos.has(a) ? " with --device-buffers" : ""));
  coll::MpiTypes types;
  std::string device;
  const std::unique_ptr<Executor> executor = make_executor(o, plan, group, group_rank, group_size, types, device);
  if (o.mixed) return run_mixed(argc, argv, h, o, cli, layout, *grid, plan.algos.front(), plan.sizes);

  // The cases.
  Axes axes = collective_axes(plan.ops, plan.dtypes, plan.redops, plan.sizes, plan.algos, plan.placements);
  axes.add("group_kind", std::vector<std::string>{group_kind})
      .add("concurrent_with", std::vector<std::string>{""});
  const std::vector<Case> cases = collective_cases(o, plan, axes);
  // Both buffer slots at the largest size any case needs, allocated once; the host also holds a case's inputs,
  // its read-back outputs and their expected values, each at most that size. Refused before anything is written.
  size_t largest = 0;
  for (const Case& c : cases) {
    const size_t elem = coll::size_of(c.dtype);
    const Counts n = counts_for(c.op, c.bytes, elem, group_size);
    largest = std::max(largest, std::max(n.send_elems, n.recv_elems) * elem);
  }
  const bool device_buffers = o.backend == "nccl" || o.device_buffers;
  check_fits_in_memory("strata-collective's largest size (" + format_gib(double(largest)) + " per buffer)",
                       double(largest) * (device_buffers ? 3 : 5), host_memory_per_rank(),
                       "the node's available memory over its ranks");

  // Run, check and record each case.
  Run run("strata-collective", argc, argv, h, cli.resolved_json(), device);
  run.set_case_count(static_cast<int>(cases.size()));
  describe_columns(run);
  axes.declare_columns(run.cases());
  std::vector<int> group_of_rank(static_cast<size_t>(run.context().n_ranks));
  STRATA_MPI_CHECK(MPI_Allgather(&group.index, 1, MPI_INT, group_of_rank.data(), 1, MPI_INT, MPI_COMM_WORLD));
  ConsoleTable table({{"size(B)", 11}, {"count", 10}, {"type", 8}, {"redop", 6}, {"root", 4}, {"op", 14},
                      {"algo", 18}, {"place", 5}, {"time(us)", 10}, {"algbw", 8}, {"busbw", 8}, {"#wrong", 6}});
  if (run.is_root()) {
    std::printf("# strata-collective: %d rank(s), %d node(s)%s, group %s: %d group(s) of %d, backend %s, mode %s\n",
                run.context().n_ranks, layout.node_count(), layout.emulated() ? " (emulated)" : "",
                group_kind.c_str(), group.count, group_size, o.backend.c_str(), o.mode.c_str());
    std::printf("# time: median over iterations of the per-iteration max over all ranks%s\n",
                o.mode == "pipelined" ? (", each sample the mean of " + std::to_string(o.ops_per_sample) +
                                         " back-to-back operations").c_str() : ", one operation per sample");
    std::printf("# algbw = S / time, busbw = algbw x nccl-tests factor, GB/s = 1e9 B/s; S as nccl-tests\n");
    table.print_header();
  }
  executor->reserve(largest);
  CacheFlush flush(static_cast<std::size_t>(plan.flush_bytes));  // the table records what was written
  const CollectiveJob job{o, h, axes, group, group_rank, group_size, group_kind, layout, grid.get(), group_of_rank,
                          flush};
  for (const Case& c : cases) run_case(job, c, *executor, run, table);
  if (run.is_root()) std::printf("# results: %s\n", run.output_path().c_str());
  return run.finish();
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-collective", [&] { return run_collective(argc, argv); });
}
