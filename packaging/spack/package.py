# Spack package recipe for Strata. Use it from a repository of your own:
#   spack repo create ~/spack-strata && mkdir -p ~/spack-strata/packages/strata
#   cp packaging/spack/package.py ~/spack-strata/packages/strata/ && spack repo add ~/spack-strata
#   STRATA_GIT_URL=<your clone's URL> spack install strata@main            (CPU)
#   STRATA_GIT_URL=<your clone's URL> spack install strata@main +cuda cuda_arch=90   (GPU, with NCCL)
# or build a checkout in place: spack develop --path <checkout> strata@main && spack install strata@main
# The installed prefix holds the programs in bin/ and the launch files in share/strata/: set STRATA_PREFIX to it
# for the sbatch templates (share/strata/scripts/slurm/), or `spack load strata`.

import os

from spack.package import *


class Strata(CMakePackage, CudaPackage):
    """MPI benchmarks of what a distributed training step is made of: GEMM and attention kernels,
    collectives over MPI and NCCL, whole training steps under data, tensor and pipeline parallelism, and a
    projection to scales not at hand; every result in one versioned HDF5 schema."""

    # Where Spack fetches the sources: the repository your site cloned (Strata names no public one).
    git = os.environ.get("STRATA_GIT_URL", "")

    version("main", branch="main")

    variant("nccl", default=True, when="+cuda", description="NCCL collectives and the GPU trainer (the CUDA backends need it)")
    variant("native", default=False, description="Tune host code for the build machine's CPU (-march=native)")
    conflicts("~nccl", when="+cuda", msg="Strata's CUDA backends (GEMM, attention, trainer) are built with NCCL")

    depends_on("cmake@3.20:", type="build")
    depends_on("pkgconfig", type="build")
    depends_on("mpi")
    depends_on("hdf5~mpi")
    depends_on("openblas threads=pthreads")  # never the single-threaded build: it has no locking
    depends_on("hwloc")
    depends_on("nlohmann-json@3:")
    depends_on("cli11@2:")
    depends_on("eigen@3.3:")
    depends_on("glpk")
    depends_on("onednn")
    depends_on("googletest")
    depends_on("benchmark")
    depends_on("nccl", when="+nccl")
    depends_on("py-h5py", type="run")
    depends_on("py-numpy", type="run")
    depends_on("py-pandas", type="run")
    depends_on("py-matplotlib", type="run")

    def cmake_args(self):
        args = [
            self.define("STRATA_CUDA", "ON" if self.spec.satisfies("+cuda") else "OFF"),
            self.define_from_variant("STRATA_NATIVE", "native"),
        ]
        if self.spec.satisfies("+cuda"):
            archs = self.spec.variants["cuda_arch"].value
            if archs and archs[0] != "none":
                args.append(self.define("STRATA_CUDA_ARCHITECTURES", ";".join(archs)))
        return args

    def setup_run_environment(self, env):
        env.set("STRATA_PREFIX", self.prefix)
