"""The names a job is made of, checked one way wherever they are read: hosts, job ids and
the shared-memory prefix a job id makes. The launcher, the workers and the Airflow
provider all call these, so a value one accepts the others accept too."""

from __future__ import annotations

import ipaddress
import re

from .errors import ConfigError

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}\Z){_LABEL}(?:\.{_LABEL})*\Z")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_END = r"(?![^\s,])"  # the end of one name in a comma list
#: one name `check_host` accepts, as a regular expression Python and JSON schema (ECMA) both
#: read: an IPv4 address, or a hostname that is not all digits and dots
HOST_PATTERN = (rf"(?:{_OCTET}(?:\.{_OCTET}){{3}}{_END}|(?![0-9.]+{_END})"
                rf"(?=[^\s,]{{1,253}}{_END}){_LABEL}(?:\.{_LABEL})*{_END})")
#: a comma-separated list of such names (spaces around them allowed), or nothing; what it
#: cannot say: a name given twice, which `hosts` refuses too
HOSTS_PATTERN = rf"^\s*(?:{HOST_PATTERN}(?:\s*,\s*{HOST_PATTERN})*)?\s*$"
# No '-': segments are named ringflow-<job id>-..., and a sweep of one job's prefix must
# never match another job's segments (job "a" vs job "a-b"); no '/' (a path).
_JOB_ID = re.compile(r"^[A-Za-z0-9_.]{1,64}\Z")
SHM_NAME_PREFIX = "ringflow-"


def check_host(name: str) -> str:
    """`name` if it is a hostname or an IPv4 address (what a `host:port` endpoint can
    hold), else a ConfigError saying why."""
    if not name:
        raise ConfigError("empty host name (a doubled, leading or trailing comma?)")
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if address is not None:
        if address.version == 6:
            raise ConfigError(f"host {name!r}: IPv6 addresses cannot form host:port endpoints")
        return name
    if name.replace(".", "").isdigit():
        raise ConfigError(f"host {name!r} is neither an IPv4 address (four numbers) nor a "
                          f"hostname (an all-numeric name reads as an address)")
    if not _HOSTNAME.match(name):
        raise ConfigError(f"host {name!r} is not a hostname or IPv4 address")
    return name


def is_host(name: str) -> bool:
    try:
        check_host(name)
    except ConfigError:
        return False
    return True


def check_job_id(job_id: str, what: str = "RINGFLOW_JOB_ID") -> str:
    """`job_id` if it can name a job's shared-memory segments, else a ConfigError."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ConfigError(f"{what}={job_id!r} must be 1-64 characters of letters, digits, '_' "
                          f"and '.' (it names shared-memory segments ringflow-<job id>-...)")
    return job_id


def shm_prefix(job_id: str) -> str:
    """The start of every shared-memory segment name of the job."""
    return f"{SHM_NAME_PREFIX}{check_job_id(job_id)}-"
