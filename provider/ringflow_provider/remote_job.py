"""Shell text for a job on a launch host: start detached, record its process group, kill it.

Pure string composition (no Airflow, no I/O). Every value is `shlex.quote`d, every script runs
under `sh -c` (POSIX sh, dash on Debian), and the job's state is one pid file per try:
`<state dir>/<task key>/try-<n>.pgid`, where the task key hashes (dag, task, run), so a later
try of the same task finds what an earlier one left running.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringflow.naming import check_job_id

PGID_MARKER = "ringflow-pgid="
PGID_LINE = re.compile(r"^ringflow-pgid=(\d+)$")
SIGNAL_MARKER = "ringflow: the job was ended by signal "
TASK_MARK_VAR = "RINGFLOW_POPRUN_TASK"
DEFAULT_STATE_DIR = '"$HOME"/.ringflow/jobs'  # expanded by the remote shell
# After SIGTERM an earlier try gets this long (in 0.1 s steps) before SIGKILL.
STOP_GRACE_STEPS = 50
# A kill that finds no pid file waits this long (0.1 s steps) for the job to write one.
PID_WAIT_STEPS = 300
KILL_GRACE_S = 5
# The launch script's exit code when stdin ended before every secret value came.
SECRETS_MISSING_EXIT = 96
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BAD_SECRET_CHARS = re.compile(r"[\n\r\x00]")


@dataclass(frozen=True)
class JobId:
    """Who a remote job belongs to: one Airflow task try."""

    dag_id: str
    task_id: str
    run_id: str
    try_number: int

    @property
    def task_key(self) -> str:
        raw = "\0".join((self.dag_id, self.task_id, self.run_id))
        return hashlib.sha256(raw.encode()).hexdigest()[:24]

    def __str__(self) -> str:
        return f"{self.dag_id}/{self.task_id}/{self.run_id}/try{self.try_number}"


def state_dir_expr(state_dir: str | None) -> str:
    return DEFAULT_STATE_DIR if state_dir is None else shlex.quote(state_dir)


# A recorded PGID may have ended and its number been reused by an unrelated group; a group is
# only signalled while one of its processes carries this task's marker in its environment.
_OURS = r"""ours() {
  for p in $(ps -eo pid=,pgid= | awk -v g="$1" '$2 == g { print $1 }'); do
    tr '\0' '\n' 2>/dev/null < /proc/"$p"/environ | grep -qx "$MARK" && return 0
  done
  return 1
}
"""


# The last try out removes the task's directory, so ended jobs leave nothing behind.
_CLEANUP = """rm -f "$f"
if ! ls "$d"/try-*.pgid > /dev/null 2>&1; then
  rm -f "$d/job"; rmdir "$d" 2> /dev/null
fi
"""


def _paths(job: JobId, state_dir: str | None) -> str:
    """Shell assignments of `d` (the task's dir), `f` (this try's pid file), `MARK`."""
    return (
        f"d={state_dir_expr(state_dir)}/{job.task_key}\n"
        f"f=\"$d/try-{int(job.try_number)}.pgid\"\n"
        f"MARK={TASK_MARK_VAR}={job.task_key}\n"
        f"{_OURS}"
    )


def _stop_earlier_tries() -> str:
    return f"""for g in "$d"/try-*.pgid; do
  [ -f "$g" ] || continue
  pg=$(cat "$g" 2>/dev/null)
  case "$pg" in ''|*[!0-9]*) rm -f "$g"; continue;; esac
  if [ "$pg" -gt 1 ] && ours "$pg"; then
    echo "ringflow: stopping process group $pg left by an earlier try (${{g##*/}})" >&2
    kill -TERM -"$pg" 2>/dev/null
    i=0
    while [ $i -lt {STOP_GRACE_STEPS} ] && ours "$pg"; do
      sleep 0.1; i=$((i+1))
    done
    kill -KILL -"$pg" 2>/dev/null
  fi
  rm -f "$g"
done
"""


def _job_body(job: JobId, argv: list[str], env: Mapping[str, str]) -> str:
    """Runs as the new session's leader: its $$ is the process group id."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    return (
        "exec 2>&3 3>&-\n"  # stderr back to the channel (see _SIGNALLED)
        'echo $$ > "$f.tmp" && mv "$f.tmp" "$f"\n'
        f'echo "{PGID_MARKER}$$"\n'
        f"{exports}"
        f"{shlex.join(argv)}\n"
        "rc=$?\n"
        f"{_CLEANUP}"
        "exit $rc\n"
    )


# 128+N is how a shell reports a job ended by signal N (the job's own shell does the same when
# signal N ends poprun); name the signal in one line of ours. The launching shell's own stderr
# goes to /dev/null while it waits (fd 3 carries the channel's stderr to the job), so sh's
# "Terminated"/"Killed" notices do not reach the task log.
_SIGNALLED = f"""rc=$?
exec 2>&3 3>&-
if [ "$rc" -gt 128 ] && [ "$rc" -le 192 ]; then
  echo "{SIGNAL_MARKER}$(kill -l "$rc" 2>/dev/null || echo $((rc - 128))) (exit status $rc)" >&2
fi
{_CLEANUP}exit $rc
"""


def _read_secrets(names: Sequence[str]) -> str:
    """Export `names` from the first lines of stdin, one value per line, in order: the values
    reach the job's environment without sitting on any command line (`export` is a builtin,
    and the script names only the variables)."""
    if not names:
        return ""
    for name in names:
        if not _ENV_NAME.match(name):
            raise ValueError(f"secret variable name {name!r} is not an identifier")
    return (
        f"for n in {' '.join(names)}; do\n"
        "  IFS= read -r v || { echo \"ringflow: the value of $n did not arrive on stdin\" >&2; "
        f"exit {SECRETS_MISSING_EXIT}; }}\n"
        '  export "$n=$v"\n'
        "done\n"
        "unset n v\n"
    )


def secrets_stdin(names: Sequence[str], values: Mapping[str, str]) -> str:
    """What `launch_command(..., secret_names=names)` reads on stdin: one line per value."""
    for name in names:
        if _BAD_SECRET_CHARS.search(values[name]):
            raise ValueError(f"the value of {name} holds a line break or NUL, which cannot "
                             f"pass as one line on stdin")
    return "".join(f"{values[name]}\n" for name in names)


def launch_command(job: JobId, argv: list[str], env: Mapping[str, str] | None = None,
                   state_dir: str | None = None, secret_names: Sequence[str] = (),
                   stdin_to_job: bool = False) -> str:
    """The command for SSH exec: read the secrets, stop earlier tries, then run argv in its
    own session.

    `secret_names` are exported from stdin (`secrets_stdin` writes it) before anything
    else; `env` is exported as quoted text, so it is visible in the job's command line.
    `setsid -w` gives the job a new session and process group (so one `kill -PGID` reaches
    every process it starts) and passes its exit status back (128+N if a signal N ended the
    job); the job's stdin is /dev/null so a closed channel cannot hang or kill it through a
    terminal. The job is not the launching shell's background job (that would ignore
    SIGINT), so `setsid` execs it in place and the shell waits for it. The first stdout line
    is the PGID. With `stdin_to_job` the job reads the channel's stdin instead (a ringflow
    launcher agent with `--stdin`: its secrets line, then its lifeline).
    """
    body = _job_body(job, argv, env or {})
    script = (
        "umask 077\n"
        f"{_read_secrets(secret_names)}"
        f"{_paths(job, state_dir)}"
        'mkdir -p "$d" || exit 97\n'
        f"printf '%s\\n' {shlex.quote(str(job))} > \"$d/job\"\n"
        f"{_stop_earlier_tries()}"
        # In the job's environment from its first process on (see _OURS).
        f"export d f {TASK_MARK_VAR}={job.task_key}\n"
        "exec 3>&2 2>/dev/null\n"
        f"setsid -w sh -c {shlex.quote(body)}{'' if stdin_to_job else ' < /dev/null'}\n"
        f"{_SIGNALLED}"
    )
    return f"sh -c {shlex.quote(script)}"


def kill_command(job: JobId, pgid: int | None, state_dir: str | None = None) -> str:
    """One detached remote command: TERM the group now, KILL it 5 s later, in the background.

    It returns at once (the killer runs in its own session), so `on_kill` stays within
    Airflow's window. Without a known PGID it reads the try's pid file; if there is none yet
    (on_kill came before the job wrote it), the killer waits up to 30 s for one to appear.
    """
    known = str(int(pgid)) if pgid else ""
    killer = (
        f"{_OURS}"
        f'i=0\nwhile [ -z "$pg" ] && [ $i -lt {PID_WAIT_STEPS} ]; do\n'
        '  pg=$(cat "$f" 2>/dev/null); [ -n "$pg" ] || { sleep 0.1; i=$((i+1)); }\n'
        "done\n"
        'case "$pg" in ""|*[!0-9]*) exit 0;; esac\n'
        '{ [ "$pg" -gt 1 ] && ours "$pg"; } || exit 0\n'
        f'kill -TERM -"$pg" 2>/dev/null; sleep {KILL_GRACE_S}\n'
        'if ours "$pg"; then kill -KILL -"$pg" 2>/dev/null; fi\n'
        f"{_CLEANUP}"
    )
    script = (
        f"{_paths(job, state_dir)}"
        f"pg={known}\n"
        '[ -n "$pg" ] || pg=$(cat "$f" 2>/dev/null)\n'
        'case "$pg" in *[!0-9]*) echo "ringflow: unreadable pid file $f"; exit 0;; esac\n'
        'if [ -z "$pg" ]; then\n'
        f'  echo "ringflow: no process group recorded yet; it is killed if one appears within '
        f'{PID_WAIT_STEPS // 10} s"\n'
        'elif [ "$pg" -le 1 ]; then exit 0\n'
        'elif ! ours "$pg"; then echo "ringflow: process group $pg has already ended"; exit 0\n'
        'else echo "ringflow: killing process group $pg"; fi\n'
        "export pg d f MARK\n"
        f"setsid sh -c {shlex.quote(killer)} > /dev/null 2>&1 < /dev/null &\n"
    )
    return f"sh -c {shlex.quote(script)}"


# ringflow's own sweep rule (ringflow.launch.shm): this user's segments of the job whose
# creator is gone; run by the job's interpreter, which has ringflow (ringflow_job=True).
_SWEEP = (
    "import sys\n"
    "from ringflow.launch.shm import sweep_job_segments\n"
    "removed = sweep_job_segments(sys.argv[1])\n"
    "print('ringflow: removed shm segments ' + ' '.join(removed) if removed else "
    "'ringflow: no shm segment of the job left')\n"
)


def sweep_command(python: str, job_id: str, after_s: int = 0) -> str:
    """Remove what a ringflow job left in /dev/shm on a host. With `after_s`, the sweep runs
    detached that many seconds later (after a kill's SIGKILL) and the command returns at
    once."""
    run = shlex.join([python, "-c", _SWEEP, check_job_id(job_id)])
    if not after_s:
        return f"sh -c {shlex.quote(run)}"
    delayed = f"sleep {int(after_s)}; {run}"
    detached = f"setsid sh -c {shlex.quote(delayed)} > /dev/null 2>&1 < /dev/null &"
    return f"sh -c {shlex.quote(detached)}"


def find_executable_command(executable: str) -> str:
    """Exit 0 iff `executable` is found (on PATH, or as a path) by the remote shell."""
    return f"sh -c {shlex.quote(f'command -v -- {shlex.quote(executable)}')}"


def parse_pgid(line: str) -> int | None:
    match = PGID_LINE.match(line.strip())
    return int(match.group(1)) if match else None
