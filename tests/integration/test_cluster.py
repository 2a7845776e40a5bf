"""The cluster tests of tests/cluster inside `make test`: a real Slurm on this machine running the sbatch
templates, a two-node Slurm and an mpirun across two hosts emulated with network namespaces. Each script
runs once per session and reports its checks ("PASS|FAIL|SKIP <tab> check <tab> detail"); each check is a
test here, so a skipped check shows the script's reason (not root, no namespaces, Slurm not installed)
and a check the script never reported fails."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile

import pytest

from conftest import BUILD, ROOT

CLUSTER = os.path.join(ROOT, "tests", "cluster")
CHECKS = {
    "single-node": ["single-node-slurm", "single-node-suite", "single-node-suite-array", "single-node-sweep",
                    "single-node-sweep-array", "single-node-multi-gpu", "single-node-multi-gpu-launch",
                    "single-node-installed", "single-node-cleanup"],
    "two-node": ["two-node-slurm", "two-node-srun", "two-node-sweep", "two-node-sweep-traffic", "two-node-step",
                 "two-node-step-traffic", "two-node-horing-traffic", "two-node-horing-overlap", "two-node-cleanup"],
    "two-host-mpirun": ["two-host-mpirun", "two-host-mpirun-traffic", "two-host-mpirun-cleanup"],
}
LIMIT = 420  # seconds per script; each bounds its jobs to 300 s in all (STRATA_CLUSTER_TIME_LIMIT)
SKIPPED = 77


def run_script(name: str, tmp_dir: str, user: str | None = None) -> tuple[int, dict, str]:
    report = os.path.join(tmp_dir, f"{name}.tsv")
    env = dict(os.environ, STRATA_CLUSTER_REPORT=report, STRATA_BUILD_DIR=BUILD)
    command = [os.path.join(CLUSTER, f"{name}.sh")]
    if user:
        command = ["runuser", "-u", user, "--", *command]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the script's trap stop its daemons and namespaces; SIGKILL only if that hangs too.
        process.send_signal(signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        output += f"\n[test_cluster] {name}.sh ran past {LIMIT} s and was stopped"
    checks = {}
    if os.path.exists(report):
        with open(report) as handle:
            for line in handle:
                status, check, detail = (line.rstrip("\n").split("\t", 2) + ["", ""])[:3]
                checks[check] = (status, detail)
    return process.returncode, checks, output


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = run_script(name, str(tmp_path_factory.mktemp(name)))
        return cache[name]
    return get


@pytest.mark.parametrize("script, check", [(s, c) for s, checks in CHECKS.items() for c in checks])
def test_cluster_check(reports, script, check):
    returncode, checks, output = reports(script)
    if check not in checks:
        pytest.fail(f"{script}.sh (exit {returncode}) did not report {check}; its output ends:\n{output[-3000:]}")
    status, detail = checks[check]
    if status == "SKIP":
        pytest.skip(f"{check}: {detail}")
    assert status == "PASS", f"{check}: {detail}\n--- {script}.sh output (end) ---\n{output[-4000:]}"


@pytest.mark.parametrize("script", list(CHECKS))
def test_exit_status_matches_report(reports, script):
    returncode, checks, output = reports(script)
    statuses = {status for status, _ in checks.values()}
    if "FAIL" in statuses:
        assert returncode == 1, output[-2000:]
    elif statuses == {"SKIP"}:
        assert returncode == SKIPPED, output[-2000:]
    else:
        assert returncode == 0 and statuses <= {"PASS", "SKIP"}, output[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the scripts as an unprivileged user")
def test_unprivileged_user_gets_skips_with_reason():
    """Where the cluster tests cannot run they say so: every check SKIP with the reason, exit 77, no pass."""
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' here")
    if subprocess.run(["runuser", "-u", "nobody", "--", "test", "-x", os.path.join(CLUSTER, "single-node.sh")]).returncode:
        pytest.skip("user 'nobody' cannot read this checkout")
    folder = tempfile.mkdtemp(prefix="strata-cluster-skip-")  # pytest's own tmp folders are private to root
    try:
        os.chmod(folder, 0o777)
        for script, names in CHECKS.items():
            returncode, checks, output = run_script(script, folder, user="nobody")
            assert returncode == SKIPPED, output
            assert sorted(checks) == sorted(names), output
            assert all(status == "SKIP" and "root" in detail for status, detail in checks.values()), checks
    finally:
        shutil.rmtree(folder, ignore_errors=True)
