"""Dependencies point down: bench -> project -> train -> kernels, collectives (bench may also use train directly);
results stands alone; inside bench/, harness <- cases <- project <- programs, targets. Every #include of every
source under the lower layers is checked against what its layer may use, and so are the libraries each layer's CMake
targets link."""
from __future__ import annotations

import os
import re

from conftest import ROOT

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)
SOURCES = (".h", ".hpp", ".cpp", ".cu", ".cuh")

# What each layer must not include: other layers above or beside it, and the libraries it must not know.
MPI = re.compile(r"^mpi\.h$")
NCCL = re.compile(r"^nccl\.h$")
HDF5 = re.compile(r"^(hdf5\.h|H5[A-Za-z_]*\.h)$")
GLPK = re.compile(r"^glpk\.h$")
COLLECTIVES_BUT_VOCABULARY = re.compile(r"^collectives/(?!operation\.h$)")  # the placement solver of train/recompute_placement: train's alone
FORBIDDEN = {
    "kernels": {"bench/": None, "collectives/": None, "results/": None, "train/": None, "MPI": MPI, "NCCL": NCCL,
                "HDF5": HDF5, "GLPK": GLPK},
    "collectives": {"bench/": None, "results/": None, "train/": None, "HDF5": HDF5, "GLPK": GLPK},
    "results": {"bench/": None, "kernels/": None, "collectives/": None, "train/": None, "GLPK": GLPK},
    "train": {"bench/": None, "results/": None, "HDF5": HDF5},
    # The projection computes from what it is given: no files (bench, HDF5), no MPI, no device libraries; of the
    # collectives it knows their vocabulary alone (collectives/operation.h: names and bus factors, no code).
    "project": {"bench/": None, "results/": None, "kernels/": None, "collectives/": COLLECTIVES_BUT_VOCABULARY,
                "MPI": MPI, "NCCL": NCCL, "HDF5": HDF5, "GLPK": GLPK},
    # Inside bench/: the harness under everything, the benchmark problems on it, the projection's front ends on both;
    # programs and targets on top, neither including the other.
    "bench/harness": {"bench/cases/": None, "bench/project/": None, "bench/programs/": None, "bench/targets/": None},
    "bench/cases": {"bench/project/": None, "bench/programs/": None, "bench/targets/": None},
    "bench/project": {"bench/programs/": None, "bench/targets/": None},
    "bench/programs": {"bench/targets/": None},
    "bench/targets": {"bench/programs/": None},
}


def violations(layer: str, path: str, text: str) -> list[str]:
    found = []
    for header in INCLUDE.findall(text):
        for what, pattern in FORBIDDEN[layer].items():
            bad = pattern.match(header) if pattern else header.startswith(what)
            if bad:
                found.append(f"{path}: {layer}/ includes {header} ({what} is not for {layer}/)")
    return found


def layer_sources(layer: str):
    folder = os.path.join(ROOT, layer)
    assert os.path.isdir(folder), f"{layer}/ is not a folder of the repository: the rule checks nothing"
    for directory, _, files in os.walk(folder):
        for name in sorted(files):
            if name.endswith(SOURCES):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, ROOT), f.read()


def test_every_layer_includes_only_what_it_may():
    problems = []
    for layer in FORBIDDEN:
        for path, text in layer_sources(layer):
            problems += violations(layer, path, text)
    assert not problems, "\n".join(problems)


def test_the_check_itself_catches_each_kind_of_violation():
    assert violations("kernels", "k.cpp", '#include "bench/harness/check.h"\n')
    assert violations("kernels", "k.cpp", "#include <mpi.h>\n")
    assert violations("kernels", "k.cu", "#  include <nccl.h>\n")
    assert violations("collectives", "c.cpp", "#include <H5Fpublic.h>\n")
    assert violations("results", "r.cpp", '#include "collectives/types.h"\n')
    assert violations("train", "t.cpp", '#include "bench/harness/harness.h"\n')
    assert violations("collectives", "c.cpp", "#include <glpk.h>\n")
    assert not violations("train", "t.cpp", '#include "kernels/linear.h"\n#include "collectives/work.h"\n')
    assert not violations("train", "t.cpp", "#include <glpk.h>\n")
    assert violations("project", "p.cpp", '#include "bench/project/system_json.h"\n')
    assert violations("project", "p.cpp", "#include <mpi.h>\n")
    assert violations("project", "p.cpp", "#include <hdf5.h>\n")
    assert not violations("project", "p.cpp", '#include "project/system.h"\n#include "train/model_config.h"\n')
    assert violations("project", "p.cpp", '#include "collectives/operations.h"\n')
    assert not violations("project", "p.cpp", '#include "collectives/operation.h"\n')
    assert not violations("kernels", "k.cpp", "#include <cblas.h>\n// #include is fine in prose: mpi.h\n")


def cmake_target_links() -> dict[str, str]:
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        text = f.read()
    links: dict[str, str] = {}
    for target, body in re.findall(r"target_link_libraries\((\w+)\s+(?:PUBLIC|PRIVATE|INTERFACE)?([^)]*)\)", text):
        links[target] = links.get(target, "") + " " + body
    return links


def test_cmake_targets_follow_the_layers():
    links = cmake_target_links()
    forbidden = {
        "strata_kernels": ["MPI::", "HDF5", "NCCL", "GLPK", "strata_results", "strata_collectives", "strata_harness",
                           "strata_train"],
        "strata_collectives": ["HDF5", "GLPK", "strata_results", "strata_harness", "strata_train"],
        "strata_results": ["strata_kernels", "strata_collectives", "strata_harness", "strata_train", "MPI::", "GLPK"],
        "strata_model": ["MPI::", "HDF5", "NCCL", "GLPK", "strata_kernels", "strata_collectives", "strata_results"],
        "strata_train": ["HDF5", "strata_results", "strata_harness"],
        "strata_kernels_cuda": ["MPI::", "HDF5", "NCCL", "strata_collectives", "strata_harness"],
        "strata_train_cuda": ["HDF5", "strata_results", "strata_harness"],
        "strata_project": ["MPI::", "HDF5", "NCCL", "GLPK", "strata_results", "strata_harness", "strata_kernels",
                           "strata_collectives", "nlohmann_json"],
        # The search traces steps with the training layer's executor (in trace mode: no MPI is called).
        "strata_project_steps": ["MPI::", "HDF5", "NCCL", "GLPK", "strata_results", "strata_harness", "nlohmann_json"],
        # The kernel and collective programs link the harness alone: no training layer, solver or projection.
        "strata_harness": ["strata_train", "strata_project", "GLPK", "Eigen3", "strata_step_cases"],
        "strata_step_cases": ["strata_project"],
    }
    problems = []
    for target, bad in forbidden.items():
        if target in ("strata_kernels_cuda", "strata_train_cuda") and target not in links:
            continue  # declared only where CUDA is found
        assert target in links, f"CMakeLists.txt has no target {target}"
        problems += [f"{target} links {b}" for b in bad if b in links[target]]
    assert not problems, "\n".join(problems)
    # The solver the placement needs is the training layer's own dependency.
    assert "GLPK_LIBRARY" in links["strata_train"], "strata_train does not link GLPK"


def test_the_collectives_vocabulary_depends_on_nothing():
    # The projection may include it only because it brings nothing of the collectives layer with it.
    with open(os.path.join(ROOT, "collectives", "operation.h"), encoding="utf-8") as f:
        headers = INCLUDE.findall(f.read())
    assert headers and all("/" not in h and not h.endswith(".h") for h in headers), headers
