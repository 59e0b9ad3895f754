"""A rank's listener alone in a process whose open-file limit is lowered, driven over stdin:
`accept RING KIND RANK SECONDS` (answers `accepted` or `timeout`), `threads`, `quit`. The
open-file limit is the descriptors already open plus argv[2] (the headroom); the job token
comes in the environment (RINGFLOW_JOB_TOKEN), as a rank gets it."""

from __future__ import annotations

import os
import resource
import sys
import threading

from ringflow.distributed.collective import rendezvous
from ringflow.distributed.collective.transport.base import Deadline, OpContext
from ringflow.distributed.env import Endpoint
from ringflow.errors import CommError


def main() -> None:
    port, headroom, handshake_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    key = rendezvous.JobKey(os.environ["RINGFLOW_JOB_ID"], os.environ["RINGFLOW_JOB_TOKEN"])
    listener = rendezvous.Listener(Endpoint("127.0.0.1", port), key, 0,
                                   handshake_seconds=handshake_s, max_handshakes=8)
    limit = len(os.listdir("/proc/self/fd")) + headroom
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    print(f"ready {threading.active_count()}", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "threads":
            print(f"threads {threading.active_count()}", flush=True)
        elif cmd == "accept":
            ring, kind, rank, seconds = int(args[0]), int(args[1]), int(args[2]), float(args[3])
            try:
                sock, pid = listener.accept(ring, kind, rank, Deadline(seconds),
                                            OpContext(0, ring, "test", host="127.0.0.1"))
            except CommError:
                print("timeout", flush=True)
            else:
                print(f"accepted {pid}", flush=True)
                sock.close()
        elif cmd == "quit":
            break
    listener.close()


if __name__ == "__main__":
    main()
