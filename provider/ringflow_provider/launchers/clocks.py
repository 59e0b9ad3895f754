"""Each host's clock against this one, read when a job starts: the failures of different
hosts are ordered on this process's clock (`launchers.outcome`), so a host whose clock is
skewed does not come first by its own account."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ringflow.errors import LaunchError
from ringflow_provider.launchers import commands

if TYPE_CHECKING:  # the launcher reads its hosts' clocks through this module
    from ringflow_provider.launchers.base import Launcher

CLOCK_NOTE_S = 1.0  # a host clock this far from the launcher's is said in the task log


def clock_offsets(launcher: Launcher) -> dict[str, float]:
    """Each of `launcher`'s hosts' clock against this one (seconds to add to a time its
    ringflow processes report), from when each host's reading of its clock arrived here
    (`clock_offset`). A host that does not answer gets none (its own clock counts)."""
    def sample(host: str) -> float | None:
        try:
            sent = time.time()
            code, out, _ = launcher.run(host, commands.clock_command(launcher.runtime(host)),
                                        timeout=launcher.conn_timeout)
            arrived = time.time()
            return clock_offset(sent, arrived, float(out.strip().splitlines()[-1])) \
                if code == 0 else None
        except (LaunchError, ValueError, IndexError):
            return None

    offsets = launcher.on_every_host(sample, "reading the hosts' clocks")
    found = {host: offset for host, offset in offsets.items() if offset is not None}
    skewed = {host: o for host, o in found.items() if abs(o) >= CLOCK_NOTE_S}
    if skewed:
        launcher.log.info("host clocks against this one: %s (failures are ordered on this "
                          "host's clock)", ", ".join(f"{h} {o:+.1f} s" for h, o in
                                                     skewed.items()))
    return found


def clock_offset(sent: float, arrived: float, remote: float) -> float:
    """Seconds to add to a host's times, from its clock's reading `remote` taken somewhere
    between `sent` and `arrived` (this clock): the reading at its arrival, unless this
    clock could have read the same at some moment of the round trip; then none. A host
    whose clock agrees within the round trip is taken as agreeing: a round trip slowed by
    load (seconds, on a busy worker) would otherwise skew the order of failures by as much.
    Error: the round trip, for a host whose clock is further off than that."""
    if sent - remote <= 0.0 <= arrived - remote:
        return 0.0
    return round(arrived - remote, 3)
