"""The attached watch of a started job: one thread per part follows its output from given
offsets until every part has ended, and the first part that ends badly stops the others;
and how long a part whose host cannot be reached may stay silent after that
(`lost_host_grace`), which the triggerer's watch (`triggers.job`) shares."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ringflow.errors import LaunchError
from ringflow.launch import jobdir
from ringflow.launch.follow import FINAL_PREFIX
from ringflow.launch.leftovers import FROZEN_WORDS
from ringflow_provider.launchers import commands
from ringflow_provider.launchers.job import JobHandle, Part
from ringflow_provider.launchers.lines import JobLine, read_line

if TYPE_CHECKING:  # the launcher watches its jobs through this module
    from ringflow_provider.launchers.base import Launcher

# after another part failed, how long the watch of a part whose host could not be reached to
# stop it waits for that part's own stream to end before it gives the host up as lost (at
# most a quarter of the ranks' heartbeat timeout, which already waited for that host)
LOST_HOST_GRACE_S = 5.0
LineHandler = Callable[[JobLine], None]


def lost_host_grace(handle: JobHandle) -> float:
    """After a part failed: how long a part whose host cannot be reached may stay silent
    before the watch gives that host up as lost (LOST_HOST_GRACE_S, at most a quarter of
    the ranks' heartbeat timeout: the ranks waited that long for the host already)."""
    heartbeat = handle.extra.get("heartbeat_timeout")
    if not isinstance(heartbeat, (int, float)) or heartbeat <= 0:
        return LOST_HOST_GRACE_S
    return min(LOST_HOST_GRACE_S, heartbeat / 4)


def attach(launcher: Launcher, handle: JobHandle, on_line: LineHandler, *,
           offsets: Mapping[str, int] | None, tie: bool, renew: bool,
           should_stop: Callable[[], bool]) -> dict[str, dict[str, Any]]:
    """`Launcher.attach`: every part's output from `offsets` to `on_line` until all parts
    have ended (or `should_stop()`); each part's final status."""
    finals: dict[str, dict[str, Any]] = {}
    stopping = threading.Event()
    unreachable: dict[str, float] = {}  # host -> when a stop could not reach it
    frozen: set[str] = set()  # hosts whose stop found the job's processes halted
    grace = lost_host_grace(handle)

    def given_up(host: str) -> bool:
        since = unreachable.get(host)
        return since is not None and time.monotonic() - since > grace

    def follow(part: Part) -> None:
        final: dict[str, Any] = {}

        def sink(stream: str, raw: str) -> None:
            if stream == "stderr" and raw.startswith(FINAL_PREFIX):
                final.update(json.loads(raw[len(FINAL_PREFIX):]))
                return
            on_line(read_line(stream, raw, part.host if handle.show_hosts else None,
                              list(handle.hosts) if handle.gathered else None))

        command = commands.follow_command(launcher.runtime_of(handle, part), part.job_dir,
                                          (offsets or {}).get(part.host, 0), renew=renew,
                                          tie=tie)
        try:
            code = launcher.shell(part.host).stream(
                command, sink, lambda: should_stop() or given_up(part.host))
        except LaunchError as exc:
            final.update(state="unreachable", cause=str(exc), exit_code=None)
            code = -1
        if code == -1 and not final and given_up(part.host):
            final.update(state="unreachable", exit_code=None,
                         cause=f"host {part.host} could not be reached to stop its part "
                               "after another part failed")
        final.setdefault("state", "unknown")
        final.setdefault("exit_code", code if code >= 0 else None)
        finals[part.host] = final
        if (final.get("exit_code") != 0 or final["state"] != jobdir.ENDED) and \
                not stopping.is_set() and not should_stop() and len(handle.parts) > 1:
            stopping.set()
            said = launcher.stop(handle, f"the job's part on {part.host} ended badly",
                                 skip=part.host)
            frozen.update(h for h, text in said.items() if FROZEN_WORDS in text)
            now = time.monotonic()
            unreachable.update({p.host: now for p in handle.parts
                                if p.host != part.host and p.host not in said})

    threads = [threading.Thread(target=follow, args=(p,), daemon=True,
                                name=f"ringflow-follow-{p.host}") for p in handle.parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for host in frozen & set(finals):
        finals[host]["frozen"] = True
    return finals
