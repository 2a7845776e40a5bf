// Implementation of the shared-memory collectives (see shm.h for the segment and its protocol).
#include "collectives/shm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/mpi_error.h"

namespace strata::coll {

namespace {

// Each counter on its own pair of cache lines (adjacent-line prefetchers pull lines in pairs); the slots start
// on the next page.
constexpr std::size_t kCounterStride = 128;
constexpr std::size_t kControlBytes = 4096;

// Polls between yields of the core while waiting: long enough that a wait of a few microseconds never
// leaves the core, short enough that ranks sharing a core hand it over quickly.
constexpr unsigned kPollsPerYield = 64;

// The direct path copies to several outputs a page at a time: the page is read from memory once and from the
// first-level cache for the other outputs (measured faster here than 16 KiB pieces).
constexpr std::size_t kPieceBytes = 4096;
constexpr std::size_t kPage = 4096;

void cpu_relax() {
#if defined(__SSE2__)
  _mm_pause();
#endif
}

// Copies out of a slot into the caller's buffer; `stream` writes with non-temporal stores, which skip
// reading the destination's lines into the cache first.
void copy_out(std::byte* dst, const std::byte* src, std::size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && bytes >= 256) {
    const std::size_t head = (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16;
    std::memcpy(dst, src, head);
    dst += head, src += head, bytes -= head;
    for (; bytes >= 64; dst += 64, src += 64, bytes -= 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    }
  }
#else
  (void)stream;
#endif
  std::memcpy(dst, src, bytes);
}

// Non-temporal stores are ordered by a store fence only.
void fence_streams() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Elements [lo, hi) of sub-slice `part` when `length` elements are split among `parts` ranks.
std::size_t split_point(std::size_t length, int parts, int part) {
  return length * static_cast<std::size_t>(part) / static_cast<std::size_t>(parts);
}

// The same on the direct path, in whole 64-byte lines (every element size divides 64): no two ranks write one
// line, and each rank's share starts as aligned as its buffer, so it streams wherever the buffer does.
std::size_t line_split_point(std::size_t length, std::size_t esize, int parts, int part) {
  const std::size_t per_line = 64 / esize;
  return std::min(length, split_point((length + per_line - 1) / per_line, parts, part) * per_line);
}

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("shm collectives: " + message);
}

}  // namespace

// One call as the pipeline sees it. Chunk j covers elements [j * chunk_elems, ...) of `length`: the buffer
// (allreduce, reduce, broadcast), each rank's block (allgather), or each block (reduce_scatter).
struct ShmNode::Call {
  Operation operation;
  const std::byte* send;
  std::byte* recv;
  std::size_t count;
  DataType dtype;
  RedOp op;  // avg already replaced by sum; `average` says whether to divide
  bool average;
  int root;
  std::size_t esize;
  std::size_t chunk_elems;
  std::size_t chunks;
  bool stream;
  bool direct;  // every buffer it uses registered: the direct path
  Ref send_ref, recv_ref;

  std::size_t lo(std::size_t j) const { return j * chunk_elems; }
  std::size_t length(std::size_t j) const { return std::min(chunk_elems, count - lo(j)); }
  bool reduces() const {
    return operation == Operation::allreduce || operation == Operation::reduce ||
           operation == Operation::reduce_scatter;
  }
};

ShmNode::ShmNode(MPI_Comm comm, ShmOptions options) : options_(options) {
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size_));
  require(options_.slots >= 2, "the ring needs at least 2 slots");
  require(options_.slot_bytes % 64 == 0 && options_.slot_bytes >= 8 * static_cast<std::size_t>(size_),
          "slot_bytes must be a multiple of 64 and at least 8 x ranks");
  MPI_Comm node = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  int node_size = 0;
  const int size_rc = MPI_Comm_size(node, &node_size);
  MPI_Comm_free(&node);
  STRATA_MPI_CHECK(size_rc);
  int all_share = node_size == size_ ? 1 : 0;
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_share, 1, MPI_INT, MPI_MIN, comm));
  require(all_share != 0, "the communicator's ranks do not all share memory");

  const std::size_t part = kControlBytes + options_.slot_bytes * static_cast<std::size_t>(options_.slots);
  void* mine = nullptr;
  STRATA_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(part), 1, MPI_INFO_NULL, comm, &mine, &window_));
  // Passive target for the whole lifetime: ranks synchronise through the counters, not through MPI epochs.
  STRATA_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, window_));
  base_.resize(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    STRATA_MPI_CHECK(MPI_Win_shared_query(window_, r, &bytes, &unit, &at));
    base_[static_cast<std::size_t>(r)] = static_cast<std::byte*>(at);
  }
  std::memset(mine, 0, kControlBytes);
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  comm_ = Comm(dup);
  STRATA_MPI_CHECK(MPI_Win_sync(window_));
  STRATA_MPI_CHECK(MPI_Barrier(comm));
  STRATA_MPI_CHECK(MPI_Win_sync(window_));
}

// Collective, and must not throw: failures are ignored (the job is ending on an error then).
ShmNode::~ShmNode() {
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from an error on this rank: the others may never reach the operations in flight or the
    // collective free, so waiting would hang the job instead of letting the error end it (MPI_Abort). The
    // operations are left undestroyed (their destructors wait), and the segment to the end of the process.
    new std::deque<Work>(std::move(in_flight_));
    new Comm(std::move(comm_));
    return;
  }
  try {
    complete_in_flight();
  } catch (...) {
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);  // unmaps the segment; its backing file was unlinked once every rank had mapped it
}

void ShmNode::complete_in_flight() {
  while (!in_flight_.empty()) progress(started_);
}

ShmBuffer ShmNode::allocate(std::size_t bytes) {
  complete_in_flight();
  // A page more than the pages asked for, to start this rank's part on a page: its place in the segment
  // depends on the other ranks' sizes, and a page boundary is one in every rank's mapping alike.
  const std::size_t pages = (bytes + kPage - 1) / kPage * kPage;
  ShmBuffer buffer;
  void* mine = nullptr;
  STRATA_MPI_CHECK(MPI_Win_allocate_shared(static_cast<MPI_Aint>(pages + kPage), 1, MPI_INFO_NULL, comm_.get(),
                                           &mine, &buffer.window_));
  STRATA_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, buffer.window_));  // as the node's own window
  auto page_start = [](void* at) {
    const auto address = reinterpret_cast<std::uintptr_t>(at);
    return static_cast<std::byte*>(at) + (kPage - address % kPage) % kPage;
  };
  Registered entry{++allocations_, page_start(mine), bytes, std::vector<std::byte*>(static_cast<std::size_t>(size_))};
  for (int r = 0; r < size_; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    void* at = nullptr;
    STRATA_MPI_CHECK(MPI_Win_shared_query(buffer.window_, r, &size, &unit, &at));
    entry.parts[static_cast<std::size_t>(r)] = page_start(at);
  }
  buffer.node_ = this;
  buffer.id_ = entry.id;
  buffer.data_ = entry.parts[static_cast<std::size_t>(rank_)];
  buffer.bytes_ = bytes;
  registered_.push_back(std::move(entry));
  return buffer;
}

std::optional<ShmNode::Ref> ShmNode::find(const void* data, std::size_t bytes) const {
  const auto at = reinterpret_cast<std::uintptr_t>(data);
  for (const Registered& r : registered_) {
    const auto start = reinterpret_cast<std::uintptr_t>(r.data);
    if (at >= start && bytes <= r.bytes && at - start <= r.bytes - bytes) return Ref{r.id, at - start};
  }
  return std::nullopt;
}

std::byte* ShmNode::at(int rank, Ref ref) const {
  if (ref.id == 0) return nullptr;
  for (const Registered& r : registered_)
    if (r.id == ref.id) return r.parts[static_cast<std::size_t>(rank)] + ref.offset;
  // Allocations and frees are collective, so every rank knows every live buffer.
  throw std::logic_error("shm collectives: rank " + std::to_string(rank) + " passed a buffer this rank does not know");
}

ShmBuffer::ShmBuffer(ShmBuffer&& other) noexcept
    : node_(std::exchange(other.node_, nullptr)),
      id_(other.id_),
      window_(std::exchange(other.window_, MPI_WIN_NULL)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

ShmBuffer& ShmBuffer::operator=(ShmBuffer&& other) noexcept {
  if (this != &other) {
    release();
    node_ = std::exchange(other.node_, nullptr);
    id_ = other.id_;
    window_ = std::exchange(other.window_, MPI_WIN_NULL);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ShmBuffer::~ShmBuffer() { release(); }

// Collective, and must not throw: failures are ignored (the job is ending on an error then).
void ShmBuffer::release() noexcept {
  if (!node_) return;
  ShmNode& node = *std::exchange(node_, nullptr);
  data_ = nullptr;
  auto unregister = [&] { std::erase_if(node.registered_, [this](const ShmNode::Registered& r) { return r.id == id_; }); };
  if (std::uncaught_exceptions() > 0) return unregister();  // as ~ShmNode: the others may never reach the free
  try {
    node.complete_in_flight();  // they may still reach into this buffer, here or on a peer
  } catch (...) {
  }
  unregister();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || window_ == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(window_);
  MPI_Win_free(&window_);
}

bool ShmNode::supports(Operation operation) {
  return operation == Operation::allreduce || operation == Operation::allgather ||
         operation == Operation::reduce_scatter || operation == Operation::broadcast ||
         operation == Operation::reduce;
}

std::byte* ShmNode::slot(int rank, std::uint64_t k) const {
  return base_[static_cast<std::size_t>(rank)] + kControlBytes +
         (k % static_cast<std::uint64_t>(options_.slots)) * options_.slot_bytes;
}

std::uint64_t* ShmNode::counter(int rank, Counter which) const {
  return reinterpret_cast<std::uint64_t*>(base_[static_cast<std::size_t>(rank)] +
                                          static_cast<std::size_t>(which) * kCounterStride);
}

std::uint64_t ShmNode::mine(Counter which) const {
  return std::atomic_ref<std::uint64_t>(*counter(rank_, which)).load(std::memory_order_relaxed);  // only I write it
}

void ShmNode::publish(Counter which, std::uint64_t value) const {
  std::atomic_ref<std::uint64_t>(*counter(rank_, which)).store(value, std::memory_order_release);
}

bool ShmNode::everyone_reached(Counter which, std::uint64_t value) const {
  for (int r = 0; r < size_; ++r)
    if (std::atomic_ref<std::uint64_t>(*counter(r, which)).load(std::memory_order_acquire) < value) return false;
  return true;
}

bool ShmNode::drains(const Call& c) const {
  switch (c.operation) {
    case Operation::reduce: return rank_ == c.root;
    case Operation::broadcast: return rank_ != c.root;
    case Operation::reduce_scatter: return false;  // the combine phase writes the output
    default: return true;
  }
}

void ShmNode::to_slot(std::byte* slot, const std::byte* src, std::size_t bytes) const {
  if (options_.stream_slots)
    copy_out(slot, src, bytes, true);
  else
    std::memcpy(slot, src, bytes);
}

// Fill: my input of chunk j into my slot k.
void ShmNode::fill(const Call& c, std::size_t j, std::uint64_t k, Traffic& traffic) {
  const std::size_t lo = c.lo(j) * c.esize, bytes = c.length(j) * c.esize;
  std::byte* mine = slot(rank_, k);
  switch (c.operation) {
    case Operation::allreduce:
    case Operation::reduce:
      to_slot(mine, c.send + lo, bytes);
      traffic.intra_bytes += bytes;
      break;
    case Operation::allgather: {
      to_slot(mine, c.send + lo, bytes);
      traffic.intra_bytes += bytes;
      std::byte* own = c.recv + static_cast<std::size_t>(rank_) * c.count * c.esize + lo;
      if (own != c.send + lo) copy_out(own, mine, bytes, c.stream);
      break;
    }
    case Operation::reduce_scatter:
      // Slot layout: the piece of block b at b x chunk_elems; my own block stays in my buffer.
      for (int b = 0; b < size_; ++b) {
        if (b == rank_) continue;
        to_slot(mine + static_cast<std::size_t>(b) * c.chunk_elems * c.esize,
                c.send + static_cast<std::size_t>(b) * c.count * c.esize + lo, bytes);
        traffic.intra_bytes += bytes;
      }
      break;
    case Operation::broadcast:
      if (rank_ != c.root) break;
      to_slot(mine, c.send + lo, bytes);
      traffic.intra_bytes += bytes;
      if (c.recv != c.send) copy_out(c.recv + lo, mine, bytes, c.stream);
      break;
    default: break;
  }
}

// Combine: reduce my sub-slice of chunk j over every rank's slot k.
void ShmNode::combine(const Call& c, std::size_t j, std::uint64_t k) {
  const std::size_t length = c.length(j);
  if (c.operation == Operation::reduce_scatter) {
    const std::size_t lo = c.lo(j) * c.esize, bytes = length * c.esize;
    const std::size_t piece = static_cast<std::size_t>(rank_) * c.chunk_elems * c.esize;
    const std::byte* own = c.send + static_cast<std::size_t>(rank_) * c.count * c.esize + lo;
    std::byte* out = c.recv + lo;
    if (out != own) std::memcpy(out, own, bytes);
    for (int r = 0; r < size_; ++r)
      if (r != rank_) reduce_into(out, slot(r, k) + piece, length, c.dtype, c.op);
    if (c.average) finish_avg(out, length, c.dtype, size_);
    return;
  }
  // allreduce, reduce: my sub-slice, in place in my slot (no other rank reads it until I publish).
  const std::size_t from = split_point(length, size_, rank_), to = split_point(length, size_, rank_ + 1);
  std::byte* mine = slot(rank_, k) + from * c.esize;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) reduce_into(mine, slot(r, k) + from * c.esize, to - from, c.dtype, c.op);
  if (c.average) finish_avg(mine, to - from, c.dtype, size_);
}

// Drain: chunk j out of the slots k into my output.
void ShmNode::drain(const Call& c, std::size_t j, std::uint64_t k) {
  const std::size_t lo = c.lo(j), length = c.length(j);
  switch (c.operation) {
    case Operation::allreduce:
    case Operation::reduce:
      // Every rank's reduced sub-slice, from its slot.
      for (int r = 0; r < size_; ++r) {
        const std::size_t from = split_point(length, size_, r), to = split_point(length, size_, r + 1);
        copy_out(c.recv + (lo + from) * c.esize, slot(r, k) + from * c.esize, (to - from) * c.esize, c.stream);
      }
      break;
    case Operation::allgather:
      for (int r = 0; r < size_; ++r)
        if (r != rank_)
          copy_out(c.recv + (static_cast<std::size_t>(r) * c.count + lo) * c.esize, slot(r, k), length * c.esize,
                   c.stream);
      break;
    case Operation::broadcast: copy_out(c.recv + lo * c.esize, slot(c.root, k), length * c.esize, c.stream); break;
    default: break;
  }
}

Step ShmNode::pipeline(Call c, std::uint64_t first, Traffic* traffic) {
  const bool combines = c.reduces(), drains_here = drains(c);
  const auto slots = static_cast<std::uint64_t>(options_.slots);
  // Every rank publishes each counter for every chunk, in chunk order across operations: an operation in flight
  // behind another may reach its first chunk before the one ahead reaches its last, and a counter that went
  // back would hide a chunk others have already relied on. So each phase of chunk k also waits for this rank's
  // own counter to stand at k.
  // The waits are named variables: GCC 12 destroys some temporaries of a co_await expression twice.
  // Step t drains chunk t - 2, combines chunk t - 1 and fills chunk t (oldest first, freeing its slot soonest).
  for (std::size_t t = 0; t < c.chunks + 2; ++t) {
    if (t >= 2 && t - 2 < c.chunks) {
      const std::uint64_t k = first + t - 2;
      const Counter source = combines ? kReduced : kReady;
      Until written{[this, source, k, drains_here] {
        return mine(kDone) == k && (!drains_here || everyone_reached(source, k + 1));
      }};
      co_await written;
      if (drains_here) drain(c, t - 2, k);
      publish(kDone, k + 1);
    }
    if (t >= 1 && t - 1 < c.chunks) {
      const std::uint64_t k = first + t - 1;
      Until filled{[this, k, combines] { return mine(kReduced) == k && (!combines || everyone_reached(kReady, k + 1)); }};
      co_await filled;
      if (combines) combine(c, t - 1, k);
      publish(kReduced, k + 1);  // copies too, so the counter runs through every chunk
    }
    if (t < c.chunks) {
      const std::uint64_t k = first + t;
      Until slot_free{[this, k, slots] { return mine(kReady) == k && (k < slots || everyone_reached(kDone, k + 1 - slots)); }};
      co_await slot_free;
      fill(c, t, k, *traffic);
      if (options_.stream_slots) fence_streams();  // the release store below does not order streamed stores
      publish(kReady, k + 1);
    }
  }
  if (c.stream) fence_streams();
}

// The direct path (shm.h). The arrival counter's cache line carries the call's buffers after the counter: the
// send and receive Refs, written before the release store of the counter and read after its acquire load.
// A rank rewrites them only at its next direct call, once every rank has finished this one.
Step ShmNode::direct(Call c, std::uint64_t ticket, Traffic* traffic) {
  // Every earlier operation complete on this rank first: a peer may write my output as soon as I arrive, and
  // the operations are to complete in the order started. The slot-path operations behind this one may go on
  // meanwhile: they need nothing from it.
  Until earlier_complete{[this, ticket] { return finished_ + 1 == ticket; }};
  co_await earlier_complete;
  std::uint64_t* line = counter(rank_, kArrived);
  const std::uint64_t refs[4] = {c.send_ref.id, c.send_ref.offset, c.recv_ref.id, c.recv_ref.offset};
  for (int i = 0; i < 4; ++i) std::atomic_ref<std::uint64_t>(line[1 + i]).store(refs[i], std::memory_order_relaxed);
  publish(kArrived, ticket);
  Until arrived{[this, ticket] { return everyone_reached(kArrived, ticket); }};
  co_await arrived;

  std::vector<const std::byte*> send(static_cast<std::size_t>(size_));
  std::vector<std::byte*> recv(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    std::uint64_t* theirs = counter(r, kArrived);
    auto word = [&](int i) { return std::atomic_ref<std::uint64_t>(theirs[1 + i]).load(std::memory_order_relaxed); };
    send[static_cast<std::size_t>(r)] = at(r, Ref{word(0), word(1)});
    recv[static_cast<std::size_t>(r)] = at(r, Ref{word(2), word(3)});
  }
  direct_share(c, send, recv, *traffic);
  if (c.stream) fence_streams();  // the release store below does not order streamed stores
  publish(kFinished, ticket);
  // No rank returns while another may still read its input or write its output.
  Until finished{[this, ticket] { return everyone_reached(kFinished, ticket); }};
  co_await finished;
}

// This rank's share of a direct call, given every rank's send and receive buffer as mapped here. Reductions
// run in one pass (reduce_into_all: each input element read once, the result stored from registers to every
// output); the order of the inputs is the ranks' order, so every rank gets the same bits whichever reduced them.
void ShmNode::direct_share(const Call& c, const std::vector<const std::byte*>& send,
                           const std::vector<std::byte*>& recv, Traffic& traffic) {
  const auto n = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_), es = c.esize;
  const std::size_t lo = line_split_point(c.count, es, size_, rank_), hi = line_split_point(c.count, es, size_, rank_ + 1);
  const std::size_t share = (hi - lo) * es, block = c.count * es;
  const int average_over = c.average ? size_ : 0;
  std::vector<const std::byte*> inputs;
  std::vector<std::byte*> outputs;
  auto copy_to_outputs = [&](const std::byte* source, std::size_t bytes) {
    for (std::size_t done = 0; done < bytes; done += kPieceBytes)
      for (std::byte* out : outputs) copy_out(out + done, source + done, std::min(kPieceBytes, bytes - done), c.stream);
  };
  switch (c.operation) {
    case Operation::allreduce:
      for (std::size_t r = 0; r < n; ++r) inputs.push_back(send[r] + lo * es), outputs.push_back(recv[r] + lo * es);
      reduce_into_all(outputs, inputs, hi - lo, c.dtype, c.op, average_over, c.stream);
      traffic.intra_bytes += 2 * (n - 1) * share;
      break;
    case Operation::reduce:
      for (std::size_t r = 0; r < n; ++r) inputs.push_back(send[r] + lo * es);
      outputs.push_back(recv[static_cast<std::size_t>(c.root)] + lo * es);
      reduce_into_all(outputs, inputs, hi - lo, c.dtype, c.op, average_over, c.stream);
      traffic.intra_bytes += (n - 1) * share + (rank_ == c.root ? 0 : share);
      break;
    case Operation::reduce_scatter:
      for (std::size_t r = 0; r < n; ++r) inputs.push_back(send[r] + me * block);
      outputs.push_back(recv[me]);
      reduce_into_all(outputs, inputs, c.count, c.dtype, c.op, average_over, c.stream);
      traffic.intra_bytes += (n - 1) * block;
      break;
    case Operation::allgather:
      // Each rank writes its block everywhere rather than reading every block: its input is read from memory
      // once instead of n times.
      for (std::size_t r = 0; r < n; ++r)
        if (recv[r] + me * block != send[me]) outputs.push_back(recv[r] + me * block);
      copy_to_outputs(send[me], block);
      traffic.intra_bytes += (n - 1) * block;
      break;
    case Operation::broadcast: {
      // Every rank copies 1/n of the root's input, rather than each non-root all of it: the node reads the
      // input once, and the root's core shares the work.
      const auto root = static_cast<std::size_t>(c.root);
      for (std::size_t r = 0; r < n; ++r)
        if (r != root || recv[root] != send[root]) outputs.push_back(recv[r] + lo * es);
      copy_to_outputs(send[root] + lo * es, share);
      const std::size_t written_for_others = outputs.size() - (me != root || recv[me] != send[me] ? 1 : 0);
      traffic.intra_bytes += (me == root ? 0 : share) + written_for_others * share;
      break;
    }
    default: break;
  }
}

// A reserved operation: its call, once started (or its drop), and the counter of the Work it was started as.
struct ShmNode::Reservation::Pending {
  ShmNode* node = nullptr;
  std::uint64_t ticket = 0;
  std::optional<Call> call;
  Traffic* traffic = nullptr;
  bool dropped = false;
};

ShmNode::Reservation& ShmNode::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Reservation dropped(std::move(*this));
    pending_ = std::move(other.pending_);
  }
  return *this;
}

ShmNode::Reservation::~Reservation() {
  if (pending_ && !pending_->call) pending_->dropped = true;
}

// Waits for the operation's call and for every earlier ticket to have numbered its chunks, numbers its own
// (so the node's history is the same on every rank whatever the order the calls arrived in), then runs it.
Step ShmNode::in_turn(std::shared_ptr<Reservation::Pending> pending) {
  Until turn{[this, p = pending.get()] { return (p->call || p->dropped) && numbered_ + 1 == p->ticket; }};
  co_await turn;
  numbered_ = pending->ticket;
  if (!pending->call) co_return;
  if (pending->call->direct) {
    co_await direct(*pending->call, pending->ticket, pending->traffic);
    co_return;
  }
  const std::uint64_t first = next_chunk_;
  next_chunk_ += pending->call->chunks;
  co_await pipeline(*pending->call, first, pending->traffic);
}

ShmNode::Reservation ShmNode::reserve() {
  auto pending = std::make_shared<Reservation::Pending>();
  pending->node = this;
  pending->ticket = ++started_;
  in_flight_.push_back(Work::start([&](Traffic*) { return in_turn(pending); }));
  return Reservation(std::move(pending));
}

bool ShmNode::progress(std::uint64_t ticket) {
  for (Work& work : in_flight_) work.test();
  while (!in_flight_.empty() && in_flight_.front().done()) {
    in_flight_.pop_front();
    ++finished_;
  }
  if (finished_ >= ticket) {
    idle_polls_ = 0;
    return true;
  }
  if (++idle_polls_ % kPollsPerYield == 0)
    std::this_thread::yield();
  else
    cpu_relax();
  return false;
}

namespace {

Step await_ticket(std::function<bool()> complete) {
  Until until{std::move(complete)};  // named, as in pipeline()
  co_await until;
}

}  // namespace

Work ShmNode::start(Reservation reservation, Operation operation, const void* sendbuf, void* recvbuf,
                    std::size_t count, DataType dtype, RedOp op, int root) {
  require(reservation.pending_ && reservation.pending_->node == this && !reservation.pending_->call,
          "a reservation is started once, on the node that made it");
  require(supports(operation), std::string(name(operation)) + " is not supported");
  const bool rooted = operation == Operation::broadcast || operation == Operation::reduce;
  require(!rooted || (root >= 0 && root < size_), "root " + std::to_string(root) + " is not a rank");
  const std::size_t esize = size_of(dtype);
  const bool reads_send = !(operation == Operation::broadcast && rank_ != root);
  const bool writes_recv = !(operation == Operation::reduce && rank_ != root);
  require(count == 0 || ((sendbuf || !reads_send) && (recvbuf || !writes_recv)), "null buffer");

  const std::size_t slot_elems = options_.slot_bytes / esize;
  Call c{operation,
         static_cast<const std::byte*>(sendbuf),
         static_cast<std::byte*>(recvbuf),
         count,
         dtype,
         op == RedOp::avg ? RedOp::sum : op,
         op == RedOp::avg && operation != Operation::allgather && operation != Operation::broadcast,
         root,
         esize,
         operation == Operation::reduce_scatter ? slot_elems / static_cast<std::size_t>(size_) : slot_elems,
         0,
         false,
         false,
         {},
         {}};
  c.chunks = (count + c.chunk_elems - 1) / c.chunk_elems;
  const std::size_t out_bytes = count * esize * (operation == Operation::allgather ? static_cast<std::size_t>(size_) : 1);
  c.stream = options_.stream_min_bytes > 0 && out_bytes >= options_.stream_min_bytes;
  if (count > 0 && !registered_.empty()) {
    const std::size_t in_bytes = count * esize * (operation == Operation::reduce_scatter ? static_cast<std::size_t>(size_) : 1);
    const std::optional<Ref> in = reads_send ? find(sendbuf, in_bytes) : std::optional<Ref>(Ref{});
    const std::optional<Ref> out = writes_recv ? find(recvbuf, out_bytes) : std::optional<Ref>(Ref{});
    if (in && out) {
      c.direct = true;
      c.send_ref = *in;
      c.recv_ref = *out;
      c.chunks = 0;  // it takes no place on the slots
      ++direct_operations_;
    }
  }

  Reservation::Pending& pending = *reservation.pending_;
  const std::uint64_t ticket = pending.ticket;
  return Work::start([&](Traffic* traffic) {
    pending.traffic = traffic;
    pending.call = c;
    return await_ticket([this, ticket] { return progress(ticket); });
  });
}

}  // namespace strata::coll
