// Implementation of the MPI helpers (see mpi.h).
#include "collectives/mpi.h"

#include <algorithm>

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI's extensions: MPIX_Query_cuda_support
#endif

namespace strata {

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  // Funnelled, not single: the programs run other threads (the harness's watchdog, BLAS and kernel threads),
  // none of which calls MPI, and MPI_THREAD_SINGLE would promise there is only one. It costs nothing: Open MPI
  // locks only under MPI_THREAD_MULTIPLE, and strata-bench-collectives' bare loops measured the same latency
  // at 4-512 B under MPI_Init, single and funnelled.
  STRATA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as codes, so STRATA_MPI_CHECK can name the failing call.
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

int Comm::rank() const {
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  return rank;
}

int Comm::size() const {
  int size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(comm_, &size));
  return size;
}

int world_rank() {
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int world_size() {
  int size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

Comm split(MPI_Comm comm, int color, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(comm, color, key, &out));
  if (out != MPI_COMM_NULL) STRATA_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return Comm(out);
}

Comm split_shared_memory(MPI_Comm comm) {
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm out = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &out));
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN));
  return Comm(out);
}

std::vector<int> shared_memory_node_of_rank() {
  int rank = world_rank(), leader = 0;
  Comm node = split_shared_memory(MPI_COMM_WORLD);
  STRATA_MPI_CHECK(MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, node.get()));
  std::vector<int> leaders(static_cast<size_t>(world_size()));
  STRATA_MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, MPI_COMM_WORLD));
  std::vector<int> distinct = leaders;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<int> node_of_rank;
  for (int l : leaders)
    node_of_rank.push_back(static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), l) - distinct.begin()));
  return node_of_rank;
}

std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  STRATA_MPI_CHECK(MPI_Comm_group(comm, &group));
  STRATA_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  std::vector<int> ranks(static_cast<size_t>(size)), world_ranks(ranks.size());
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  STRATA_MPI_CHECK(MPI_Group_translate_ranks(group, size, ranks.data(), world_group, world_ranks.data()));
  STRATA_MPI_CHECK(MPI_Group_free(&group));
  STRATA_MPI_CHECK(MPI_Group_free(&world_group));
  return world_ranks;
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root) {
  int rank = 0, size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(rank == root ? size : 0);
  STRATA_MPI_CHECK(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm));
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) offsets[r] = total, total += lengths[r];
  std::string all(static_cast<size_t>(total), '\0');
  STRATA_MPI_CHECK(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
                               root, comm));
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r)
    out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(lengths[r])));
  return out;
}

std::vector<double> gather_doubles(MPI_Comm comm, const std::vector<double>& mine, int root) {
  int rank = 0, size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<double> all(rank == root ? mine.size() * static_cast<size_t>(size) : 0);
  STRATA_MPI_CHECK(MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                              static_cast<int>(mine.size()), MPI_DOUBLE, root, comm));
  return all;
}

std::string broadcast_string(MPI_Comm comm, const std::string& value, int root) {
  int length = static_cast<int>(value.size());
  STRATA_MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, root, comm));
  std::string out = value;
  out.resize(static_cast<size_t>(length));
  STRATA_MPI_CHECK(MPI_Bcast(out.data(), length, MPI_CHAR, root, comm));
  return out;
}

double allreduce_max(MPI_Comm comm, double value) {
  double out = 0;
  STRATA_MPI_CHECK(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm));
  return out;
}

std::string mpi_cuda_awareness() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() ? "yes" : "no";
#elif defined(MPIX_CUDA_AWARE_SUPPORT)
  return "no";
#else
  return "unknown";
#endif
}

}  // namespace strata
