"""Secrets of an mpirun job (ringflow.launch.secret_drop, openmpi): never a `-x` once a
secrets folder is given, delivered as 0600 files one per process, sourced once by the sh
each process runs under and removed. The remote (SSH) path runs on the namespace hosts in
tests/provider/test_secrets_on_hosts.py."""

from __future__ import annotations

import os
import stat
import subprocess

from ringflow.launch.env import JOB_TOKEN_VAR
from ringflow.launch.openmpi import INSTANCE_SH, AppContext, MpirunPlan, mpirun_argv
from ringflow.launch.secret_drop import SECRETS_DIR_VAR, SecretDrop, export_lines, is_this_host

VALUE = "it's $HOME `x` \"q\"\nline2"


def test_with_a_secrets_folder_secrets_and_the_token_are_no_x_and_the_folder_is():
    plan = MpirunPlan((AppContext("h1", ("prog",), options=("-x", "DB_PASS", "-x", "A=1")),),
                      secrets=("DB_PASS",))
    environ = {"DB_PASS": "pw-123456", JOB_TOKEN_VAR: "t" * 64, "PATH": "/bin"}
    argv = mpirun_argv(plan, environ, as_root=False, secrets_dir="/tmp/d")
    exports = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert exports == ["A=1", "PATH", f"{SECRETS_DIR_VAR}=/tmp/d",
                       "RINGFLOW_REPORT_EXIT_TIME=1"]
    plain = mpirun_argv(plan, environ, as_root=False)  # without: as before
    bare = [plain[i + 1] for i, a in enumerate(plain) if a == "-x"]
    assert bare[:2] == ["DB_PASS", "A=1"] and JOB_TOKEN_VAR in bare


def test_each_process_gets_its_own_0600_file_its_sh_sources_once_and_removes(tmp_path):
    drop = SecretDrop({"127.0.0.1": [0, 2]}, {"DB_PASS": VALUE, JOB_TOKEN_VAR: "t" * 64},
                      {}, "job1")
    drop.deliver()
    folder = drop.folder
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert sorted(os.listdir(folder)) == ["0", "2"]
    assert {stat.S_IMODE(os.stat(f"{folder}/{n}").st_mode) for n in ("0", "2")} == {0o600}
    env = {"PATH": os.environ["PATH"], SECRETS_DIR_VAR: folder, "OMPI_COMM_WORLD_RANK": "2"}
    out = subprocess.run(["sh", "-c", INSTANCE_SH, "instance", "sh", "-c",
                          'printf %s "$DB_PASS"; echo; echo "${RINGFLOW_SECRETS_DIR-unset}"'],
                         env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and out.stdout == f"{VALUE}\nunset\n"
    assert os.listdir(folder) == ["0"]  # read once: rank 2's file is gone
    again = subprocess.run(["sh", "-c", INSTANCE_SH, "instance", "true"], env=env,
                           capture_output=True, text=True, timeout=10)
    assert again.returncode == 97 and "no secrets file" in again.stderr
    assert drop.remove() == [] and not os.path.exists(folder)


def test_export_lines_quote_every_value_for_sh():
    assert export_lines({"A": "x'y"}) == b"export A='x'\"'\"'y'\n"


def test_this_host_is_an_address_bound_here_and_not_a_foreign_one():
    assert is_this_host("127.0.0.1") and is_this_host("localhost")
    assert not is_this_host("192.0.2.1")  # TEST-NET-1
