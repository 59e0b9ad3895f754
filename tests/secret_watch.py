"""Where a secret could leak during a job, watched for real (no pytest here): every command
line that any process execs under given processes (`ExecTrace`: strace of, say, a test host's
sshd, so everything SSH starts there and everything that starts), every TCP byte on an
interface (`Capture`: tcpdump, reassembled per connection), every file under given folders
(`files_holding`). Needs strace and tcpdump (`make sysdeps`) and root.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import stat
import struct
import subprocess
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

READY_TIMEOUT_S = 20
STOP_TIMEOUT_S = 20


def _wait_for(proc: subprocess.Popen, words: Iterable[bytes], what: str) -> bytes:
    """stderr of `proc` until every one of `words` was said (within READY_TIMEOUT_S)."""
    wanted, said = list(words), b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(w in said for w in wanted):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, left))
        chunk = os.read(proc.stderr.fileno(), 65536) if ready else b""
        if not chunk:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
            raise RuntimeError(f"{what} did not get ready: {said.decode(errors='replace')}")
        said += chunk
    return said


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # strace detaches, tcpdump flushes
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    proc.stderr.close()


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


class ExecTrace:
    """The argv of every execve under the processes `pids` (and all they start) while the
    context is open; `text()` is strace's record (argv only, never environments)."""

    def __init__(self, pids: Iterable[int], path: Path) -> None:
        self.pids, self.path = list(pids), path
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> ExecTrace:
        argv = ["strace", "-f", "-s", "1048576", "-e", "trace=execve", "-e", "signal=none",
                "-o", str(self.path)]
        for pid in self.pids:
            argv += ["-p", str(pid)]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for(self._proc, [f"Process {pid} attached".encode() for pid in self.pids],
                  "strace")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        _stop(self._proc)

    def text(self) -> str:
        return self.path.read_text(errors="replace")


class Capture:
    """Every packet on each of `interfaces` while the context is open (a tcpdump each, to
    `folder`). A bridge's own interface sees only what goes to the machine: what one host
    sends another crosses the bridge's ports, the hosts' links."""

    def __init__(self, interfaces: Iterable[str], folder: Path) -> None:
        self.interfaces, self.folder = list(interfaces), folder
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> Capture:
        try:
            for name in self.interfaces:
                proc = subprocess.Popen(
                    ["tcpdump", "-i", name, "-p", "-n", "-s", "0", "-U", "-w",
                     str(self.folder / f"{name}.pcap")], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                self._procs.append(proc)
                _wait_for(proc, [b"listening on"], "tcpdump")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._procs:
            _stop(proc)

    def streams(self) -> dict[tuple, bytes]:
        """Each TCP connection direction's payload, in sequence order, and each UDP flow's
        (a flow seen on two links counts once), as `readable` reads it."""
        flows: dict[tuple, bytes] = {}
        for name in self.interfaces:
            flows.update(tcp_streams((self.folder / f"{name}.pcap").read_bytes()))
        return {key: readable(data) for key, data in flows.items()}


def tcp_streams(pcap: bytes) -> dict[tuple, bytes]:
    """(proto, src, sport, dst, dport) -> the bytes carried, from a pcap of Ethernet frames
    (IPv4); TCP segments are put in sequence order and retransmissions dropped, so a value
    cut across two segments is found whole."""
    magic = struct.unpack("<I", pcap[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    pos, segments = 24, {}
    while pos + 16 <= len(pcap):
        _, _, caplen, _ = struct.unpack(endian + "IIII", pcap[pos:pos + 16])
        frame = pcap[pos + 16:pos + 16 + caplen]
        pos += 16 + caplen
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl, proto = (ip[0] & 0x0F) * 4, ip[9]
        total = struct.unpack(">H", ip[2:4])[0]
        src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
        body = ip[ihl:total]
        if proto == 6 and len(body) >= 20:
            sport, dport, seq = struct.unpack(">HHI", body[:8])
            payload = body[(body[12] >> 4) * 4:]
            if payload:
                segments.setdefault(("tcp", src, sport, dst, dport), {})[seq] = payload
        elif proto == 17 and len(body) >= 8:
            sport, dport = struct.unpack(">HH", body[:4])
            key = ("udp", src, sport, dst, dport)
            segments.setdefault(key, {})[len(segments.get(key, {}))] = body[8:]
    return {key: b"".join(parts[s] for s in sorted(parts)) for key, parts in segments.items()}


def readable(data: bytes) -> bytes:
    """What anyone on the wire reads in `data`: the bytes, and every zlib stream in them
    inflated (Open MPI compresses its larger launch messages)."""
    found = [data]
    at = data.find(b"\x78")
    while at >= 0:
        if data[at + 1:at + 2] in (b"\x01", b"\x5e", b"\x9c", b"\xda"):
            with contextlib.suppress(zlib.error):
                found.append(zlib.decompressobj().decompress(data[at:], 1 << 26))
        at = data.find(b"\x78", at + 1)
    return b"\0".join(found)


def files_holding(roots: Iterable[Path], values: Iterable[str]) -> dict[str, list[str]]:
    """value -> every file under `roots` whose bytes hold it."""
    needles = {v: v.encode() for v in values}
    found: dict[str, list[str]] = {v: [] for v in needles}
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = Path(folder) / name
                try:
                    if not stat.S_ISREG(path.lstat().st_mode):
                        continue  # a FIFO would block, a socket holds no bytes
                    data = path.read_bytes()
                except OSError:
                    continue
                for value, needle in needles.items():
                    if needle in data:
                        found[value].append(str(path))
    return found
