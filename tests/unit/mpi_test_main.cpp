// main() of the GoogleTest programs run under mpirun: every rank runs every test, rank 0 prints the run and
// every other rank only its failures (with its rank), and the exit status is whether any rank failed; an
// exception that escapes a test aborts the job (a rank cannot leave the others waiting in a collective).
#include <gtest/gtest.h>
#include <mpi.h>

#include <exception>
#include <iostream>
#include <string>

namespace {

class FailuresOfThisRank : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOfThisRank(int rank) : rank_(rank) {}
  // The test's name is taken here: asking GoogleTest for the current test while it reports a result would wait
  // on the lock it holds.
  void OnTestStart(const ::testing::TestInfo& test) override { test_ = test.test_suite_name() + std::string(".") + test.name(); }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cerr << "[rank " << rank_ << "] " << test_ << " " << (result.file_name() ? result.file_name() : "") << ":"
              << result.line_number() << ": " << result.message() << std::endl;
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOfThisRank(rank));
  }
  int failed = 0;
  try {
    failed = RUN_ALL_TESTS() != 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rank == 0) std::cout << "[  FAILED  ] on some rank (see above)\n";
  MPI_Finalize();
  return any;
}
