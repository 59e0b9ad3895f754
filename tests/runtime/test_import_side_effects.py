"""Importing ringflow changes nothing process-wide: not the umask, and no tuning is frozen
from the environment at import time (it is read when a ring is made)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_importing_every_module_leaves_the_umask_alone():
    script = textwrap.dedent("""
        import os, importlib, pkgutil
        os.umask(0o027)
        import ringflow
        for mod in pkgutil.walk_packages(ringflow.__path__, "ringflow."):
            if not mod.name.endswith("__main__"):
                importlib.import_module(mod.name)
        print(oct(os.umask(0o027)))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0o27"


def test_collective_sizes_are_read_when_settings_are_made_not_at_import(monkeypatch):
    from ringflow.distributed.collective import communicator  # noqa: F401  (imported first)
    from ringflow.distributed.env import comm_settings

    monkeypatch.setenv("RINGFLOW_SEGMENT_BYTES", "4096")
    monkeypatch.setenv("RINGFLOW_SHM_SMALL_BYTES", "1024")
    settings = comm_settings()
    assert (settings.segment_bytes, settings.shm_small_bytes) == (4096, 1024)
    assert (settings.slot_bytes, settings.tcp_small_bytes) == (1 << 20, 16 << 10)


def test_a_saved_checkpoint_gets_the_mode_open_would_give_it(tmp_path):
    import numpy as np

    import ringflow as rf
    import ringflow.io  # imported before the umask changes

    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        rf.framework.layer_helper.create_parameter([2], attr="w")
    scope = rf.Scope()
    rf.Executor().run(startup, scope=scope)
    old = os.umask(0o027)
    try:
        rf.save(main, tmp_path / "ckpt", scope=scope)
    finally:
        os.umask(old)
    assert (tmp_path / "ckpt.npz").stat().st_mode & 0o777 == 0o640
    np.testing.assert_array_equal(np.load(tmp_path / "ckpt.npz")["w"], scope["w"])
