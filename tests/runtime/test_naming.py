"""One rule for the names of a job (ringflow.naming), whoever reads them: the launcher's
--hosts and RINGFLOW_JOB_ID, the workers' environment, the shm segment names and the
Airflow provider's hosts (tests/provider/test_poprun_composition.py checks the provider
gives the same answers)."""

from __future__ import annotations

import pytest

from ringflow.errors import ConfigError
from ringflow.naming import check_host, check_job_id, is_host, shm_prefix

HOSTS = ["n1", "node-1.example.com", "127.0.0.1", "10.0.0.1", "a" * 63, "x1.y2"]
NOT_HOSTS = [
    ("", "empty host name"),
    ("123", "neither an IPv4 address (four numbers) nor a hostname"),
    ("10.0.0", "neither an IPv4 address"),
    ("1.2.3.4.5", "neither an IPv4 address"),
    ("fe80::1", "IPv6 addresses cannot form host:port endpoints"),
    ("host a", "is not a hostname or IPv4 address"),
    ("-oProxyCommand=x", "is not a hostname"),
    ("n1:22", "is not a hostname"),
    ("user@n1", "is not a hostname"),
    ("a" * 64, "is not a hostname"),
    ("bad_host", "is not a hostname"),
]


@pytest.mark.parametrize("name", HOSTS)
def test_hostnames_and_ipv4_addresses_are_hosts(name):
    assert check_host(name) == name and is_host(name)


@pytest.mark.parametrize("name, message", NOT_HOSTS)
def test_anything_else_is_refused_saying_why(name, message):
    with pytest.raises(ConfigError, match=None) as info:
        check_host(name)
    assert message in str(info.value) and not is_host(name)


@pytest.mark.parametrize("job_id", ["a", "0f3c9a1b2d4e", "run_1.2", "x" * 64])
def test_job_ids_of_letters_digits_underscore_and_dot_name_segments(job_id):
    assert shm_prefix(job_id) == f"ringflow-{check_job_id(job_id)}-"


@pytest.mark.parametrize("job_id", ["", "a-b", "a/b", "x" * 65, "a b", None])
def test_a_job_id_that_could_match_another_jobs_segments_is_refused(job_id):
    with pytest.raises(ConfigError, match="must be 1-64 characters of letters, digits"):
        shm_prefix(job_id)
