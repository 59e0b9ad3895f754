"""PopRun composition: argv equal to the seed's shell string, quoting, and every validation rule."""

from __future__ import annotations

import shlex

import pytest

from ringflow.errors import ConfigError
from ringflow_provider.poprun import (
    build_poprun_argv,
    launch_argv,
    mask_argv,
    mask_text,
    parse_config,
    render_poprun_command,
    secret_values,
    validate_field,
)

SEED_PYTHON = "/opt/venv/bin/python3"  # stands for the seed's sys.executable


def seed_shell_string(hosts, nproc, ipus_per_replica, num_ipus, partition, server, script, args,
                      log_level=None):
    """The seed IPUController's algorithm (reference 5.5), re-stated to produce its string."""
    num_replicas = num_ipus // ipus_per_replica
    num_procs = len(hosts.split(",")) * nproc
    host_list = hosts.replace(" ", "").split(",")
    endpoints = [h + ":8090" for h in host_list]
    cmd = [
        f"--num-instances={num_procs}",
        f"--num-replicas={num_replicas}",
        f"--ipus-per-replica={ipus_per_replica}",
        "--host=" + ",".join(host_list),
        f"--vipu-partition={partition}",
        f"--vipu-server-host={server}",
        "--update-partition=no",
        "--vipu-server-timeout=120",
        "--print-topology=yes",
        "--numa-aware=yes",
    ]
    global_envs = "--mpi-local-args='"
    if log_level:
        global_envs += f"-x POPART_LOG_LEVEL={log_level} "
    global_envs += f"-x PADDLE_TRAINERS_NUM={num_procs} -x PADDLE_TRAINER_ENDPOINTS="
    global_envs += ",".join(endpoints) + "'"
    cmd.append(global_envs)
    for idx in range(num_procs):
        cmd.append(
            f'--instance-mpi-local-args={idx}:"-x PADDLE_TRAINER_ID={idx} '
            f"-x PADDLE_CURRENT_ENDPOINT={endpoints[idx // nproc]} "
            f'-x PADDLE_RANK_IN_NODE={idx % nproc}"'
        )
    cmd += [SEED_PYTHON, script, *args]
    return " ".join(["poprun", *cmd])


def config(**overrides):
    values = dict(
        hosts="node1",
        nproc_per_host=1,
        ipus_per_replica=1,
        num_ipus=4,
        ipu_partition="pod16",
        vipu_server="10.1.2.3",
        training_script="train.py",
    )
    values.update(overrides)
    return parse_config(values)


SEED_CASES = [
    # hosts, nproc_per_host, ipus_per_replica, num_ipus, script args, log level
    ("localhost", 2, 1, 4, [], None),
    ("localhost", 2, 1, 4, ["--epochs", "3"], "INFO"),
    ("node1,node2", 1, 2, 8, ["--lr=0.1"], None),
    ("node1, node2", 2, 1, 16, [], "DEBUG"),
    ("a.example.com,b.example.com,10.0.0.7", 2, 4, 48, ["x", "y"], "WARN"),
    ("n1,n2,n3,n4", 4, 1, 16, [], None),
]


@pytest.mark.parametrize(("hosts", "nproc", "ipr", "num_ipus", "args", "level"), SEED_CASES)
def test_argv_equals_the_seed_shell_string_after_word_splitting(hosts, nproc, ipr, num_ipus,
                                                                 args, level):
    seed = seed_shell_string(hosts, nproc, ipr, num_ipus, "pod64", "vipu.local", "train.py",
                             args, level)
    cfg = config(hosts=hosts, nproc_per_host=nproc, ipus_per_replica=ipr, num_ipus=num_ipus,
                 ipu_partition="pod64", vipu_server="vipu.local", training_script="train.py",
                 training_script_args=args, popart_log_level=level, python=SEED_PYTHON)
    assert build_poprun_argv(cfg) == shlex.split(seed)


def test_argv_of_the_documented_example_literally():
    cfg = config(hosts="localhost", nproc_per_host=2, num_ipus=4, ipu_partition="pod16",
                 vipu_server="127.0.0.1")
    assert build_poprun_argv(cfg) == [
        "poprun", "--num-instances=2", "--num-replicas=4", "--ipus-per-replica=1",
        "--host=localhost", "--vipu-partition=pod16", "--vipu-server-host=127.0.0.1",
        "--update-partition=no", "--vipu-server-timeout=120", "--print-topology=yes",
        "--numa-aware=yes",
        "--mpi-local-args=-x PADDLE_TRAINERS_NUM=2 -x PADDLE_TRAINER_ENDPOINTS=localhost:8090",
        "--instance-mpi-local-args=0:-x PADDLE_TRAINER_ID=0 "
        "-x PADDLE_CURRENT_ENDPOINT=localhost:8090 -x PADDLE_RANK_IN_NODE=0",
        "--instance-mpi-local-args=1:-x PADDLE_TRAINER_ID=1 "
        "-x PADDLE_CURRENT_ENDPOINT=localhost:8090 -x PADDLE_RANK_IN_NODE=1",
        "python3", "train.py",
    ]


def test_options_beyond_the_seed_take_their_places():
    cfg = config(update_partition=True, vipu_server_timeout=30, print_topology=False,
                 numa_aware=False, endpoint_port=9000, mpi_global_args=["--tag-output"],
                 extra_poprun_args=["--executable-cache-path=/tmp/c", "-v"],
                 extra_env={"FOO": "bar"}, poprun="/opt/poplar/bin/poprun", python="python3.11")
    argv = build_poprun_argv(cfg)
    assert argv[0] == "/opt/poplar/bin/poprun"
    assert argv[7:11] == ["--update-partition=yes", "--vipu-server-timeout=30",
                          "--print-topology=no", "--numa-aware=no"]
    assert argv[11] == "--mpi-global-args=--tag-output"
    assert argv[12] == ("--mpi-local-args=-x PADDLE_TRAINERS_NUM=1 "
                        "-x PADDLE_TRAINER_ENDPOINTS=node1:9000 -x FOO=bar")
    assert argv[-4:] == ["--executable-cache-path=/tmp/c", "-v", "python3.11", "train.py"]


HOSTILE = [
    "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "a; rm -rf /", "line1\nline2",
    "*", "~root", "&& echo x", "back\\slash", "tab\there", "", " lead", "${HOME}", "a|b", "#c",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_rendered_command_splits_back_to_the_argv_for_hostile_strings(hostile):
    flat = hostile.replace("\n", " ").replace("\t", " ")  # every field refuses controls
    cfg = config(training_script=f"dir/{flat}.py", training_script_args=[flat, "-x", flat],
                 ipu_partition=f"p{flat}", vipu_server=f"s{flat}", python=f"py{flat}")
    command = render_poprun_command(cfg)
    assert shlex.split(command) == build_poprun_argv(cfg)


def test_rendered_command_runs_as_exactly_the_argv_in_a_real_shell(tmp_path):
    import subprocess
    import sys

    printable = [h for h in HOSTILE if h.isprintable()]
    cfg = config(training_script_args=[*printable, "$(touch pwned)"], poprun=sys.executable)
    # Replace poprun by python printing its argv: what the shell delivers is what we built.
    argv = build_poprun_argv(cfg)
    printer = "import json,sys; print(json.dumps(sys.argv[1:]))"
    command = shlex.join([sys.executable, "-c", printer, *argv[1:]])
    out = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                         check=True, timeout=30)
    import json

    assert json.loads(out.stdout) == argv[1:]
    assert not (tmp_path / "pwned").exists()


def test_a_dict_rendered_as_python_text_is_read_exactly():
    """`{{ params.x }}` of a dict param renders Python's repr, not JSON."""
    from ringflow_provider.rendered import json_text

    assert json_text("{'a': 'None', 'b': \"it's\", 'c': None, 'd': True}") == {
        "a": "None", "b": "it's", "c": None, "d": True}
    assert json_text("['x', 1]") == ["x", 1]
    with pytest.raises(ValueError, match="optimizer: expected JSON text"):
        json_text("{not json", "optimizer")


def test_list_and_dict_fields_accept_the_json_text_a_template_renders():
    cfg = config(hosts='["n1", "n2"]', nproc_per_host="2", num_ipus="8",
                 training_script_args='["--lr", "0.1"]', extra_env='{"A": "1"}',
                 mpi_global_args='["--bind-to", "none"]', extra_poprun_args='["-v"]',
                 update_partition="True", popart_log_level="None")
    assert cfg.hosts == ["n1", "n2"]
    assert cfg.nproc_per_host == 2
    assert cfg.training_script_args == ["--lr", "0.1"]
    assert cfg.extra_env == {"A": "1"}
    assert cfg.mpi_global_args == ["--bind-to", "none"]
    assert cfg.extra_poprun_args == ["-v"]
    assert cfg.update_partition is True
    assert cfg.popart_log_level is None


def test_hosts_are_stripped_around_names_from_a_string_or_a_list():
    assert config(hosts=" n1 ,n2 ").hosts == ["n1", "n2"]
    assert config(hosts=[" n1", "n2 "]).hosts == ["n1", "n2"]


def test_secret_env_values_are_masked_in_the_argv():
    cfg = config(extra_env={"API_TOKEN": "tok123", "DB_PASSWORD": "pw", "MY_KEY": "k9",
                            "my_secret_x": "s1", "PLAIN": "visible"})
    masked = mask_argv(build_poprun_argv(cfg), secret_values(cfg, ["connpw"]),
                       cfg.secret_env_names())
    local = next(a for a in masked if a.startswith("--mpi-local-args="))
    assert local.endswith("-x API_TOKEN=*** -x DB_PASSWORD=*** -x MY_KEY=*** "
                          "-x my_secret_x=*** -x PLAIN=visible")
    assert sorted(secret_values(cfg, ["connpw", None])) == ["connpw", "k9", "pw", "s1", "tok123"]


def test_a_short_secret_is_masked_in_its_slot_only():
    """Like Airflow's masker (min_length_masked_secret 5): "1" must not mask every 1."""
    cfg = config(extra_env={"MY_KEY": "1", "API_TOKEN": "tok-long-1"})
    masked = mask_argv(build_poprun_argv(cfg), secret_values(cfg), cfg.secret_env_names())
    assert masked[1:4] == ["--num-instances=1", "--num-replicas=4", "--ipus-per-replica=1"]
    assert masked[11] == ("--mpi-local-args=-x PADDLE_TRAINERS_NUM=1 "
                          "-x PADDLE_TRAINER_ENDPOINTS=node1:8090 -x MY_KEY=*** -x API_TOKEN=***")
    assert mask_text("id 1, token tok-long-1", secret_values(cfg)) == "id 1, token ***"


def test_the_argv_sent_has_bare_slots_for_secrets_and_keeps_the_rest():
    cfg = config(extra_env={"API_TOKEN": "tok123", "PLAIN": "visible"},
                 secret_env={"DB_PASS": "a b'c"})
    seed = build_poprun_argv(cfg)
    sent = launch_argv(cfg, secret=["RINGFLOW_JOB_TOKEN"], plain={"RINGFLOW_JOB_ID": "j1"})
    at = next(i for i, a in enumerate(seed) if a.startswith("--mpi-local-args="))
    assert sent[:at] + sent[at + 1:] == seed[:at] + seed[at + 1:]     # only that token differs
    assert seed[at].endswith("-x API_TOKEN=tok123 -x PLAIN=visible")   # the seed's form
    assert sent[at] == ("--mpi-local-args=-x PADDLE_TRAINERS_NUM=1 -x PADDLE_TRAINER_ENDPOINTS="
                        "node1:8090 -x API_TOKEN -x PLAIN=visible -x DB_PASS "
                        "-x RINGFLOW_JOB_TOKEN -x RINGFLOW_JOB_ID=j1")
    assert cfg.plain_env() == {"PLAIN": "visible"}
    assert cfg.hidden_env() == {"API_TOKEN": "tok123", "DB_PASS": "a b'c"}
    assert sorted(secret_values(cfg)) == ["a b'c", "tok123"]


def test_a_secret_named_extra_env_value_may_hold_what_the_command_line_could_not():
    cfg = config(extra_env={"API_TOKEN": "tok 1'23"})
    assert launch_argv(cfg)[11].endswith("node1:8090 -x API_TOKEN")
    with pytest.raises(ConfigError, match="PLAIN would be in poprun's -x list twice"):
        launch_argv(config(extra_env={"PLAIN": "1"}), plain={"PLAIN": "2"})


def test_secret_env_takes_any_value_but_a_line_break_and_is_never_quoted():
    assert config(secret_env='{"DB_PASS": "a b\\"c"}').secret_env == {"DB_PASS": 'a b"c'}
    for bad, message in [({"DB_PASS": "x\ny-secret"}, "secret_env DB_PASS: the value holds"),
                         ({"1X": "v"}, "is not an identifier"),
                         ({"RINGFLOW_JOB_TOKEN": "v"}, "is set by the composition itself"),
                         ({"PADDLE_TRAINER_ID": "v"}, "is set by the composition itself")]:
        with pytest.raises(ConfigError, match=message) as err:
            config(secret_env=bad)
        assert "y-secret" not in str(err.value)
    with pytest.raises(ConfigError, match="RUN in both extra_env and secret_env"):
        config(extra_env={"RUN": "1"}, secret_env={"RUN": "2"})


def test_the_provider_takes_the_hosts_the_launcher_takes():
    from ringflow.naming import is_host
    from tests.runtime.test_naming import HOSTS, NOT_HOSTS

    for name in [*HOSTS, *(n for n, _ in NOT_HOSTS)]:
        try:
            config(hosts=[name])
            taken = True
        except ConfigError:
            taken = False
        assert taken == is_host(name), name


BASE = dict(hosts="n1", nproc_per_host=1, ipus_per_replica=1, num_ipus=4, ipu_partition="p",
            vipu_server="s", training_script="t.py")

INVALID = [
    (dict(num_ipus=6, ipus_per_replica=4), "num_ipus=6 is not divisible by ipus_per_replica=4"),
    (dict(hosts="a,b", num_ipus=3), "num_replicas=3 (num_ipus 3 / ipus_per_replica 1) is not "
                                    "divisible by num_instances=2"),
    (dict(hosts="a,,b"), "empty host name (a doubled, leading or trailing comma?) in hosts 'a,,b'"),
    (dict(hosts="a,b,"), "in hosts 'a,b,'"),
    (dict(hosts=""), "empty host name"),
    (dict(hosts=[]), "hosts: expected at least one host, got none"),
    (dict(hosts="n1,n2,n1"), "host 'n1' appears more than once in 'n1,n2,n1'"),
    (dict(hosts="host a"), "host 'host a' is not a hostname or IPv4 address"),
    (dict(hosts="user@n1"), "host 'user@n1' is not a hostname or IPv4 address"),
    (dict(hosts="n1:22"), "host 'n1:22' is not a hostname or IPv4 address"),
    (dict(hosts="-oProxyCommand=x"), "host '-oProxyCommand=x' is not a hostname"),
    (dict(hosts="n1;id"), "host 'n1;id' is not a hostname"),
    (dict(hosts="fe80::1"), "host 'fe80::1': IPv6 addresses cannot form host:port endpoints"),
    (dict(nproc_per_host=0), "nproc_per_host: Input should be greater than or equal to 1 (got 0)"),
    (dict(ipus_per_replica=-1), "ipus_per_replica: Input should be greater than or equal to 1"),
    (dict(num_ipus=0), "num_ipus: Input should be greater than or equal to 1 (got 0)"),
    (dict(vipu_server_timeout=0), "vipu_server_timeout: Input should be greater than or equal"),
    (dict(endpoint_port=70000), "endpoint_port: Input should be less than or equal to 65535"),
    (dict(extra_env={"1BAD": "x"}), "extra_env name '1BAD' is not an identifier"),
    (dict(extra_env={"A-B": "x"}), "extra_env name 'A-B' is not an identifier"),
    (dict(extra_env={"A": "two words"}), "A='two words': values passed on mpirun's command "
                                         "line take letters, digits and _.,:/@%+=~^- only"),
    (dict(extra_env={"A": "it's"}), "A=\"it's\": values passed on mpirun's"),
    (dict(extra_env={"A": "a\nb"}), "A='a\\nb': values passed on mpirun's"),
    (dict(extra_env={"A": "e;$(id)|*"}), "(pass other values in secret_env)"),
    (dict(extra_env={"A": "a&b"}), "A='a&b': values passed on mpirun's"),
    (dict(training_script_args=["ok", "forged\n[rank 0] step 1"]),
     "training_script_args item 'forged\\n[rank 0] step 1' holds a control character"),
    (dict(training_script_args=["a\x00b"]), "holds a control character"),
    (dict(python="-c"), "python: '-c' starts with '-', so it would be read as an option"),
    (dict(training_script="--version"), "training_script: '--version' starts with '-'"),
    (dict(poprun="-h"), "poprun: '-h' starts with '-'"),
    (dict(hosts="123"), "host '123' is neither an IPv4 address (four numbers) nor a hostname"),
    (dict(hosts="10.0.0"), "host '10.0.0' is neither an IPv4 address"),
    (dict(extra_env={"PADDLE_TRAINER_ID": "3"}),
     "extra_env name 'PADDLE_TRAINER_ID' is set by the composition itself"),
    (dict(popart_log_level="INFO DEBUG"), "POPART_LOG_LEVEL='INFO DEBUG': values passed on"),
    (dict(mpi_global_args=["--mca btl tcp"]), "mpi_global_args item='--mca btl tcp'"),
    (dict(extra_poprun_args=["/tmp/cache"]), "extra_poprun_args item '/tmp/cache' is not a flag"),
    (dict(training_script=""), "training_script: expected a non-empty string"),
    (dict(python="  "), "python: expected a non-empty string"),
    (dict(ipu_partition="a\nb"), "ipu_partition: 'a\\nb' holds a control character"),
    (dict(training_script_args="[1,"), "training_script_args: list: expected JSON text"),
    (dict(training_script_args="--lr 1"), "training_script_args: Input should be a valid list"),
    (dict(colour="red"), "colour: unknown argument (got 'red')"),
]


@pytest.mark.parametrize(("override", "message"), INVALID)
def test_invalid_configuration_is_rejected_naming_the_value(override, message):
    with pytest.raises(ConfigError, match="invalid PopRun configuration") as info:
        parse_config({**BASE, **override})
    assert message in str(info.value)


def test_missing_required_fields_are_named():
    with pytest.raises(ConfigError) as info:
        parse_config({"hosts": "n1"})
    for name in ("nproc_per_host", "ipus_per_replica", "num_ipus", "ipu_partition",
                 "vipu_server", "training_script"):
        assert f"{name}: Field required" in str(info.value)


def test_every_field_validates_alone_at_its_value_in_a_full_config():
    cfg = config(extra_env={"A": "1"}, mpi_global_args=["-v"], extra_poprun_args=["-v"],
                 popart_log_level="INFO")
    for name, value in cfg.model_dump().items():
        assert validate_field(name, value) == value, name


def test_one_field_validates_alone_without_the_others():
    assert validate_field("hosts", "a, b") == ["a", "b"]
    assert validate_field("nproc_per_host", "3") == 3
    with pytest.raises(ValueError, match="appears more than once"):
        validate_field("hosts", "a,a")
