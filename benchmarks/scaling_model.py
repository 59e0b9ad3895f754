"""An alpha-beta model of ringflow's data-parallel training step, plain and sharded
(issue 19). Pure functions over a calibration measured on this machine (scaling.py):

    step = compute + update + communication

- compute: the forward and backward pass of one rank at its share of the global batch,
  measured in one process at that batch and that rank's BLAS threads while as many copies
  of it run beside it as the layout has ranks on the machine, in lock step (``fb_ms``: so
  the caches, the memory bus and, beyond the cores, the cores themselves are shared as in
  the layout, whose ranks meet at every collective).
- update: Adam is bound by memory bandwidth, which the ranks of a machine share: the
  parameters updated at once on the machine times the per-element time of one process
  using the whole machine (``upd_ns``). Plain data parallelism updates every parameter on
  every rank; sharding 1/n of them per rank. Stage 2 with several gradient buckets copies
  every gradient through a staging buffer once more (2 array passes against Adam's 7).
- communication: per collective, an alpha-beta cost with alpha (s per hand-off) and beta
  (bytes/s per rank) of the transport it crosses (``links``: shared memory, TCP on this
  host, TCP between namespace hosts; shared memory with 4 ranks on the 2 cores apart, where a
  hand-off waits for a descheduled peer: with more ranks than cores every link is slowed as
  shared memory was), in the algorithm's form:
    ring over n positions: all-reduce 2(n-1) alpha + 2(n-1)/n S / beta, reduce-scatter and
    all-gather (n-1) alpha + (n-1)/n S / beta each;
    in place on one host (shared arrays): 3 hand-offs for the all-reduce, 2 for each half,
    same bytes;
    two levels (H hosts x r ranks): the host's reduce-scatter and all-gather in place, and
    an all-reduce of S/r over a ring of the H hosts, the r rings sharing one link; each
    half of sharding in two levels: one host-level pass (a local rank handles the parts of
    its local position on every host), then a ring of the H hosts per local rank over
    those parts (each step waiting for the largest), the r rings sharing one link.
  Plain data parallelism all-reduces the gradients; sharding reduce-scatters them and
  all-gathers the parameters (in two levels when the ranks span hosts with several ranks
  on each, around one ring of the hosts when each host has one), each half by an
  all-reduce instead when the largest part exceeds 2/n of the buffer. No overlap is
  credited: on these 2 cores the shared-memory buckets run synchronously and the TCP
  thread's overlap bought no step time (README, run 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MB = 1 << 20
BUCKET_BYTES = 32 * MB   # BuildStrategy.fuse_grad_size_in_MB's default
ADAM_PASSES, COPY_PASSES = 7, 2   # arrays read or written per element: Adam's update, a copy


@dataclass(frozen=True)
class Link:
    """One transport: ``alpha`` seconds per hand-off, ``beta`` bytes/s per rank."""

    alpha: float
    beta: float

    def ring(self, n: int, nbytes: float, halves: int = 2, share: float | None = None) -> float:
        """A ring all-reduce (halves=2) or one half of it (1) over n positions; ``share``:
        the largest rank's part of the buffer (1/n when even), which every step waits for."""
        if n < 2:
            return 0.0
        part = share if share is not None else 1.0 / n
        return halves * ((n - 1) * self.alpha + (n - 1) * part * nbytes / self.beta)

    def in_place(self, n: int, nbytes: float, halves: int = 2,
                 share: float | None = None) -> float:
        """The one-host algorithm on shared arrays: hand-offs, then the same bytes."""
        if n < 2:
            return 0.0
        part = share if share is not None else 1.0 / n
        handoffs = 3 if halves == 2 else 2 * halves
        return handoffs * self.alpha + halves * (n - 1) * part * nbytes / self.beta


@dataclass(frozen=True)
class Calibration:
    """What scaling.py measured on this machine for one model shape."""

    shape: str
    params: int                                   # trainable parameters (float32)
    batch: int                                    # the global batch
    fb_ms: dict[tuple[int, int, int], float]      # (per-rank batch, threads, copies) -> ms
    upd_ns: float                                 # ns per parameter, one process, all cores
    links: dict[str, Link] = field(default_factory=dict)   # "shm", "tcp", "net"
    cores: int = 2
    sizes: tuple[int, ...] = ()   # parameter sizes in reduction order (for the shards)

    def share(self, n: int) -> float:
        """The largest sharding rank's part of the parameters (ringflow's own layout rule:
        whole parameters, contiguous runs, the largest part as small as it can be)."""
        if not self.sizes or n < 2:
            return 1.0 / max(n, 1)
        from ringflow.distributed.shard_layout import min_max_shard

        return min_max_shard(list(self.sizes), n) / sum(self.sizes)

    def compute(self, batch: int, threads: int, copies: int) -> float:
        """Forward + backward seconds at ``batch`` and ``threads`` with ``copies`` processes
        at once (the nearest measured point; batch scaled linearly from it)."""
        known = sorted(self.fb_ms)
        pick = min(known, key=lambda k: (abs(k[1] - threads), abs(k[2] - copies),
                                         abs(math.log(k[0] / batch))))
        return self.fb_ms[pick] / 1e3 * batch / pick[0]


@dataclass(frozen=True)
class Layout:
    """``hosts`` x ``per_host`` data-parallel ranks; ``link`` joins ranks of one host when
    they do not use shared memory ("shm" or "tcp"); ``stage`` 0 plain, 1 or 2 sharded."""

    hosts: int
    per_host: int
    stage: int = 0
    link: str = "shm"
    cores_per_host: int | None = None   # None: every host shares the calibration's cores

    @property
    def n(self) -> int:
        return self.hosts * self.per_host


def step_parts(cal: Calibration, lay: Layout) -> dict[str, float]:
    """Predicted seconds of compute, update and communication of one step."""
    n = lay.n
    shared = lay.cores_per_host is None
    cores = cal.cores if shared else lay.cores_per_host
    ranks_on_cores = n if shared else lay.per_host
    threads = max(1, cores // ranks_on_cores)
    # a projected host's ranks each have a core, as two ranks here each have one
    copies = n if shared else min(ranks_on_cores, cal.cores)
    compute = cal.compute(cal.batch // n, threads, copies)
    per_rank = cal.params * cal.share(n) if lay.stage else cal.params
    update = per_rank * ranks_on_cores * cal.upd_ns * 1e-9 * (cal.cores / cores)
    if lay.stage == 2 and 4.0 * cal.params > BUCKET_BYTES:
        # stage 2 with several buckets stages each reduced bucket through a buffer: one more
        # read and write of every gradient, memory-bound like Adam's seven passes
        update += COPY_PASSES / ADAM_PASSES * cal.params * ranks_on_cores * cal.upd_ns * 1e-9 \
            * (cal.cores / cores)
    return {"compute": compute, "update": update, "comm": comm_seconds(cal, lay)}


def comm_seconds(cal: Calibration, lay: Layout) -> float:
    nbytes = 4.0 * cal.params
    n = lay.n
    if n == 1:
        return 0.0
    crowded = lay.cores_per_host is None and n > cal.cores and f"shm{n}" in cal.links
    local = cal.links["tcp"] if lay.link == "tcp" else (
        # more ranks than cores: hand-offs as measured with that many ranks
        cal.links[f"shm{n}"] if crowded else cal.links["shm"])
    share = cal.share(n)
    if lay.hosts == 1 and lay.link == "shm":   # no ring: every part read where it lies
        return local.in_place(n, nbytes) if not lay.stage else \
            local.in_place(n, nbytes, 1, share) * 2
    if lay.hosts == 1:
        plain = local.ring(n, nbytes)
        halves = local.ring(n, nbytes, 1, share) * 2
    else:
        net = cal.links["net"]
        if crowded:   # every link's hand-offs wait for descheduled peers as shared memory's did
            shm, more = cal.links["shm"], cal.links[f"shm{n}"]
            net = Link(net.alpha + more.alpha - shm.alpha, net.beta * more.beta / shm.beta)
        if lay.per_host == 1:   # one ring of the hosts
            plain = net.ring(lay.hosts, nbytes)
            halves = 2 * net.ring(n, nbytes, 1, share)
        else:                   # two levels
            shared_link = Link(net.alpha, net.beta / lay.per_host)
            plain = 2 * local.in_place(lay.per_host, nbytes, 1) \
                + shared_link.ring(lay.hosts, nbytes / lay.per_host)
            halves = sharded_two_level(local, net, lay, nbytes, share)
    if not lay.stage:
        return plain
    # parts too lopsided for a ring's halves go by all-reduce (ring.lopsided)
    return 2 * plain if share * n > 2 else halves


def sharded_two_level(local: Link, net: Link, lay: Layout, nbytes: float,
                      share: float) -> float:
    """Sharding's reduce-scatter + all-gather in two levels (twolevel.py): per half, one
    host-level pass in which a local rank handles the parts of its local position on
    every host (at most H x ``share``), then a ring of the hosts per local rank, each
    step waiting for the largest rank's part (``share``)."""
    shared_link = Link(net.alpha, net.beta / lay.per_host)
    half = local.in_place(lay.per_host, nbytes, 1, min(1.0, lay.hosts * share)) \
        + shared_link.ring(lay.hosts, nbytes, 1, share)
    return 2 * half


def predict(cal: Calibration, lay: Layout) -> float:
    return sum(step_parts(cal, lay).values())


def two_level_halves(cal: Calibration, lay: Layout) -> float:
    """What sharding's reduce-scatter + all-gather would cost in two levels with even parts
    (parameters split where they must be: not built; ringflow keeps parameters whole)."""
    return sharded_two_level(cal.links["shm"], cal.links["net"], lay, 4.0 * cal.params,
                             1.0 / lay.n)


def project(cal: Calibration, hosts: int, per_host: int, gbit: float, stage: int,
            extra_alpha: float = 5e-6, per_rank_batch: int | None = None) -> dict[str, float]:
    """A cluster of ``hosts`` x ``per_host`` ranks, each rank one core like a rank here
    (weak scaling: ``per_rank_batch`` rows each, default the batch of a rank of dp=2), hosts
    joined by links of ``gbit`` Gb/s with the measured TCP software latency plus
    ``extra_alpha`` for wire and switch."""
    b = per_rank_batch or cal.batch // 2
    n = hosts * per_host
    scaled = Calibration(cal.shape, cal.params, b * n, cal.fb_ms, cal.upd_ns,
                         {**cal.links, "net": Link(cal.links["tcp"].alpha + extra_alpha,
                                                   gbit * 1e9 / 8)}, cal.cores, cal.sizes)
    lay = Layout(hosts, per_host, stage, "shm", cores_per_host=per_host)
    parts = step_parts(scaled, lay)
    alone = Calibration(cal.shape, cal.params, b, cal.fb_ms, cal.upd_ns, cal.links, cal.cores,
                        cal.sizes)
    one_rank = sum(step_parts(alone, Layout(1, 1, 0, cores_per_host=1)).values())
    out = {"compute_ms": 1e3 * parts["compute"], "update_ms": 1e3 * parts["update"],
           "comm_ms": 1e3 * parts["comm"], "step_ms": 1e3 * sum(parts.values())}
    # weak scaling: one rank alone on its rows (one core) against a rank of the cluster
    out["efficiency"] = one_rank / (out["step_ms"] / 1e3)
    if stage:
        out["two_level_comm_ms"] = 1e3 * two_level_halves(scaled, lay)
        out["two_level_efficiency"] = one_rank / ((out["step_ms"] - out["comm_ms"]
                                                   + out["two_level_comm_ms"]) / 1e3)
    return out


def fit_link(points: list[tuple[float, float]], handoffs_per_rank: float,
             bytes_factor: float) -> Link:
    """alpha and beta from (bytes, seconds) of one algorithm: time = handoffs * alpha +
    bytes_factor * bytes / beta (least squares on the two-parameter line)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs) or 1.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = max(my - slope * mx, 0.0)
    return Link(intercept / handoffs_per_rank, bytes_factor / max(slope, 1e-15))
