"""The shell text a launcher runs on a host: start a command under ringflow's supervisor,
follow it, stop it, find a task's jobs, look for an executable, sweep shared memory. Pure
string composition: every value is `shlex.quote`d (no value can add a command) and every
script runs under `sh -c` in the login's home, so relative paths mean the same on every host
and for both shells (`launchers.shells`). Non-secret variables travel as quoted `export`s;
secrets never appear here: they go on the start command's stdin."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ringflow.launch.exits import FOLDER_REFUSED_EXIT, RUNNING_EXIT, SETUP_EXIT
from ringflow.naming import check_job_id

SUPERVISOR = "ringflow.launch.supervisor"
HANDLE_FILE = "handle.json"  # the job's JobHandle (no secret), written beside status.json
TRIES_DIR = "try-"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
KEEP_DAYS = 7  # an ended job's folder (output, status) stays this long on its host
RUNNING_MESSAGE = "a job of this task try still runs in"


@dataclass(frozen=True)
class Runtime:
    """How a host runs ringflow: its interpreter and where the runtime is (None: installed)."""

    python: str
    pythonpath: str | None = None

    def module(self, module: str, *args: str) -> str:
        """`python -m module args` with the runtime on its path (`exec` may precede it)."""
        return shlex.join([*self.env_prefix(), self.python, "-m", module, *args])

    def env_prefix(self) -> list[str]:
        return ["env", f"PYTHONPATH={self.pythonpath}"] if self.pythonpath else []


def check_state_dir(path: str) -> str:
    """A folder for job folders (absolute, or relative to the login's home) that no command
    reads as an option, with no control character; ValueError saying which rule it breaks."""
    if path.startswith("-"):
        raise ValueError(f"{path!r} starts with '-', so commands would read it as an "
                         f"option; give ./{path}")
    if re.search(r"[\x00-\x1f\x7f]", path):
        raise ValueError(f"{path!r} holds a control character")
    return path


def _script(body: str) -> str:
    return f"sh -c {shlex.quote(f'cd || exit {SETUP_EXIT}' + chr(10) + body)}"


def exports(env: Mapping[str, str]) -> str:
    """`export NAME=value` lines: visible in the remote command line, so nothing secret."""
    return "".join(f"export {name}={shlex.quote(str(value))}\n" for name, value in env.items())


def unsets(names: Sequence[str]) -> str:
    names = [n for n in names if _NAME.match(n)]
    return f"unset {' '.join(names)}\n" if names else ""


def _forget_old_jobs(job_dir: str) -> str:
    """Job folders of the same state folder that no supervisor holds and nobody touched for
    KEEP_DAYS are removed (best effort, in the background of a start)."""
    state = shlex.quote(job_dir.rsplit("/", 2)[0]) if job_dir.count("/") >= 2 else None
    if state is None:
        return ""
    return (f"for o in $(find {state} -mindepth 2 -maxdepth 2 -name '{TRIES_DIR}*' -type d "
            f"-mtime +{KEEP_DAYS} 2>/dev/null); do\n"
            '  flock -n "$o/lock" true 2>/dev/null && rm -rf -- "$o"\n'
            "done\n")


# `own FOLDER`: FOLDER made (0700) if missing, else it must be a real folder of this user, not
# a symlink (where it points, or another user, would get the job's files); then made 0700.
_OWN = (
    'me=$(id -u)\n'
    'own() {\n'
    '  if [ ! -e "$1" ] && [ ! -L "$1" ]; then mkdir -- "$1" 2>/dev/null || [ -d "$1" ] || '
    f'exit {SETUP_EXIT}; fi\n'
    '  if [ -L "$1" ]; then why="is a symlink"\n'
    '  elif [ ! -d "$1" ]; then why="is not a folder"\n'
    '  elif [ "$(stat -c %u -- "$1")" != "$me" ]; then\n'
    '    why="is owned by uid $(stat -c %u -- "$1"), not by this user (uid $me)"\n'
    '  else chmod 700 -- "$1"; return; fi\n'
    '  echo "$1 $why: ringflow keeps a job\'s folder only in real folders of its user" >&2\n'
    f'  exit {FOLDER_REFUSED_EXIT}\n'
    '}\n')


def _own_folders(state_dir: str, job_dir: str) -> str:
    """The state folder (each part of it when relative to the home; else its parents made,
    itself checked) and the task's folder `own`ed; the job folder too if it exists."""
    parts = state_dir.split("/")
    if state_dir.startswith("/"):
        checked = [state_dir]
        made = f"mkdir -p -- {shlex.quote(state_dir.rsplit('/', 1)[0] or '/')} || " \
               f"exit {SETUP_EXIT}\n"
    else:
        checked = ["/".join(parts[:i + 1]) for i in range(len(parts)) if parts[i]]
        made = ""
    checked.append(job_dir.rsplit("/", 1)[0])
    d = shlex.quote(job_dir)
    return (_OWN + made + "".join(f"own {shlex.quote(c)}\n" for c in checked)
            + f"if [ -e {d} ] || [ -L {d} ]; then own {d}; fi\n")


def start_command(runtime: Runtime, job_dir: str, argv: Sequence[str], *,
                  env: Mapping[str, str], secrets: str, lease_timeout: float | None,
                  grace_s: float, handle: Mapping, secret_names: Sequence[str] = ()) -> str:
    """Start `argv` detached under the supervisor in `job_dir` (`<state>/<task>/try-<n>`),
    recording `handle` there; the state, task and job folders must be real folders of this
    user (else exit FOLDER_REFUSED_EXIT naming the folder) and are made 0700. The
    supervisor reads one line of secrets from stdin first (`secrets` says whether they go
    to the command's environment or on as its stdin's first line); variables of those names
    that the host's own environment has are unset, so only the line's values count."""
    args = ["run", "--job-dir", job_dir, "--detach", "--secrets", secrets,
            "--grace", f"{grace_s:g}"]
    if lease_timeout is not None:
        args += ["--lease-timeout", f"{lease_timeout:g}"]
    record = json.dumps(dict(handle), sort_keys=True)
    d = shlex.quote(job_dir)
    body = (
        "umask 077\n"
        f"{_own_folders(job_dir.rsplit('/', 2)[0], job_dir)}"
        # the same try started again (`airflow tasks test` twice): an ended job's folder is
        # kept aside, a running one is refused
        f'if [ -e {d}/output.log ]; then\n'
        f'  if [ -e {d}/lock ] && ! flock -n {d}/lock true; then\n'
        f"    echo {shlex.quote(RUNNING_MESSAGE)} {d} >&2; exit {RUNNING_EXIT}\n"
        "  fi\n"
        f'  mv {d} {d}.replaced-$(date +%s%N) || exit {SETUP_EXIT}\n'
        "fi\n"
        f"mkdir -p {d} || exit {SETUP_EXIT}\n"
        f"own {d}\n"
        f"{_forget_old_jobs(job_dir)}"
        f"printf '%s\\n' {shlex.quote(record)} > {shlex.quote(job_dir + '/' + HANDLE_FILE)}\n"
        f"{exports(env)}"
        f"{unsets(secret_names)}"
        f"exec {runtime.module(SUPERVISOR, *args, '--', *argv)}\n"
    )
    return _script(body)


def follow_command(runtime: Runtime, job_dir: str, offset: int = 0, *, renew: bool = True,
                   tie: bool = False) -> str:
    args = ["follow", "--job-dir", job_dir, "--offset", str(int(offset))]
    args += ["--renew"] if renew else []
    args += ["--tie"] if tie else []
    return _script(f"exec {runtime.module(SUPERVISOR, *args)}")


def stop_command(runtime: Runtime, job_dir: str, why: str, wait_s: float = 0.0) -> str:
    args = ["stop", "--job-dir", job_dir, "--why", why, "--wait", f"{wait_s:g}"]
    return _script(f"exec {runtime.module(SUPERVISOR, *args)}")


def task_jobs_command(task_dir: str) -> str:
    """Each of a task's job folders (`try-N`), one per line, with its handle.json (one
    line of JSON) after a tab."""
    body = (f"for d in {shlex.quote(task_dir)}/{TRIES_DIR}*; do\n"
            '  [ -d "$d" ] || continue\n'
            f'  printf \'%s\\t%s\\n\' "$d" "$(cat "$d/{HANDLE_FILE}" 2>/dev/null | head -c 65536'
            " | tr -d '\\n')\"\n"
            "done")
    return _script(body)


UNWRITABLE = "ringflow-unwritable"


def writable_command(folders: Sequence[str]) -> str:
    """Each folder made if missing (0700) and a small file written into it and removed; one
    `UNWRITABLE<TAB>folder<TAB>what the host said` line for each that fails."""
    body = ("umask 077\n"
            f"for d in {' '.join(shlex.quote(f) for f in folders)}; do\n"
            '  f="$d/.ringflow-write-check.$$"\n'
            '  if ! said=$( (mkdir -p -- "$d" && printf x > "$f" && rm -f -- "$f") 2>&1); '
            "then\n"
            '    rm -f -- "$f" 2>/dev/null\n'
            f"    printf '{UNWRITABLE}\\t%s\\t%s\\n' \"$d\" \"$(printf %s \"$said\" | "
            "tail -n 1)\"\n"
            "  fi\n"
            "done")
    return _script(body)


def unwritable(out: str) -> list[tuple[str, str]]:
    """(folder, cause) of each folder `writable_command` found not writable; the cause is
    the error's last part (`Permission denied`, `Read-only file system`, ...)."""
    found = []
    for line in out.splitlines():
        mark, _, rest = line.partition("\t")
        if mark == UNWRITABLE:
            folder, _, said = rest.partition("\t")
            found.append((folder, said.rsplit(": ", 1)[-1].strip() or "unknown error"))
    return found


def find_executable_command(executable: str) -> str:
    """Exit 0 iff `executable` is found (on PATH, or as a path) by the host's shell."""
    return _script(f"command -v -- {shlex.quote(executable)}")


def meminfo_command() -> str:
    return _script("cat /proc/meminfo")


def home_command() -> str:
    return _script('printf %s "$HOME"')


# ringflow's own sweep rule (ringflow.launch.shm): this user's segments of the job whose
# creator is gone
_SWEEP = (
    "import sys\n"
    "from ringflow.launch.shm import sweep_job_segments\n"
    "removed = sweep_job_segments(sys.argv[1])\n"
    "print('ringflow: removed shm segments ' + ' '.join(removed) if removed else "
    "'ringflow: no shm segment of the job left')\n"
)


_CLOCK = "from ringflow.launch.exits import host_time\nprint(repr(host_time()))\n"


def clock_command(runtime: Runtime) -> str:
    """Print the host's clock as its ringflow processes read it (`ringflow.launch.exits.
    host_time`), to put the times they report on the launcher's own clock."""
    return _script(shlex.join([*runtime.env_prefix(), runtime.python, "-c", _CLOCK]))


def sweep_command(runtime: Runtime, job_id: str) -> str:
    """Remove what a ringflow job left in /dev/shm on a host (segments whose creator is
    gone)."""
    return _script(shlex.join([*runtime.env_prefix(), runtime.python, "-c", _SWEEP,
                               check_job_id(job_id)]))
