"""The one secret rule of the job lifecycle (ringflow_provider.jobs.masking): which names are
secret, which values are collected, how text is masked, and Airflow's masker registration."""

from __future__ import annotations

import json

from ringflow_provider.jobs.masking import Secrets, is_secret_name, split_env
from ringflow_provider.poprun import build_poprun_argv, mask_argv, parse_config, secret_values


def test_secret_names_are_ours_and_those_airflows_masker_hides():
    ours = ["API_TOKEN", "my_secret_x", "DB_PASSWORD", "WANDB_KEY", "DB_PASS", "GH_PAT"]
    airflows = ["HTTP_PROXY", "SERVICE_ACCOUNT_JSON", "BEARER", "CONNECTION_STRING",
                "SLACK_WEBHOOK_URL"]
    # "key" is a word, not a substring (ringflow.secrets)
    plain = ["PLAIN", "RUN_NAME", "PADDLE_TRAINER_ENDPOINTS", "OMP_NUM_THREADS", "LR",
             "keyring", "KEYBOARD_LAYOUT", "PWD", "PASSTHROUGH"]
    assert [n for n in ours + airflows if not is_secret_name(n)] == []
    assert [n for n in plain if is_secret_name(n)] == []


def test_values_come_from_secret_names_explicit_secrets_and_secret_env():
    secrets = (Secrets(["conn-pw-1", None, ""])
               .add_env({"API_TOKEN": "tok-12345", "PLAIN": "visible-1"})
               .add_env('{"DB_PASSWD": "pw-6789x"}')
               .add_env({"ANYTHING": "any-value-1"}, all_secret=True))
    assert sorted(secrets.values) == ["any-value-1", "conn-pw-1", "pw-6789x", "tok-12345"]
    assert secrets.values[0] == "any-value-1"  # longest first: a secret inside another
    assert len(Secrets().add_env("not json").add_env(["a list"])) == 0


def test_mask_hides_a_value_also_in_its_json_and_repr_escaped_forms():
    value = 'q"uo\\te\nline'
    secrets = Secrets([value, "tiny"])
    text = f"raw {value} json {json.dumps(value)} repr {value!r} tiny"
    assert secrets.mask(text) == 'raw *** json "***" repr \'***\' tiny'


def test_the_repr_never_shows_a_value():
    assert repr(Secrets(["tok-77777", "pw-88888"])) == "Secrets(<2 hidden>)"


def test_registered_values_are_redacted_by_airflows_masker():
    from airflow.sdk.log import redact

    Secrets(["reg-tok-31337"]).register()
    assert redact("value reg-tok-31337 here") == "value *** here"


def test_poprun_masks_the_names_airflow_hides_in_its_argv_slots():
    config = parse_config(dict(hosts="n1", nproc_per_host=1, ipus_per_replica=1, num_ipus=1,
                               ipu_partition="p", vipu_server="s", training_script="t.py",
                               extra_env={"DB_PASSWD": "pw", "PLAIN": "visible"}))
    masked = mask_argv(build_poprun_argv(config), secret_values(config),
                       config.secret_env_names())
    local = next(a for a in masked if a.startswith("--mpi-local-args="))
    assert local.endswith("-x DB_PASSWD=*** -x PLAIN=visible")


URL = "postgres://app:pw-5544x@db:5432/prod"


def test_a_url_password_is_masked_and_the_rest_of_the_url_stays_readable():
    secrets = Secrets().add_env({"DATABASE_URL": URL, "RUN_NAME": "visible-1"})
    assert secrets.values == ["pw-5544x"]
    assert secrets.mask(f"connecting to {URL}") == "connecting to postgres://app:***@db:5432/prod"


def test_under_a_secret_name_or_as_secret_env_the_whole_url_is_masked_and_its_password():
    named = Secrets().add_env({"DB_DSN": URL})
    given = Secrets().add_env({"ANY": URL}, all_secret=True)
    for secrets in (named, given):
        assert secrets.values == [URL, "pw-5544x"]
        assert secrets.mask(f"{URL} and pw-5544x") == "*** and ***"


def test_the_triggers_secrets_from_the_values_list_mask_url_passwords_too():
    """JobTrigger gets the operator's values (Secrets.values) and makes Secrets of them."""
    assert Secrets([URL]).mask("pw-5544x") == "***"


def test_airflows_masker_gets_a_url_password_and_keeps_the_rest():
    from airflow.sdk._shared.secrets_masker import redact

    Secrets().add_env({"DATABASE_URL": "mysql://u:reg-pw-9911@h/db"}).register()
    assert redact("mysql://u:reg-pw-9911@h/db") == "mysql://u:***@h/db"


def test_variables_under_secret_names_or_holding_a_url_password_travel_hidden():
    plain, hidden = split_env({"DATABASE_URL": URL, "DB_PASS": "pw-1", "PWD": "/w",
                               "KEYBOARD_LAYOUT": "us", "BASE_URL": "https://u@h/"})
    assert hidden == {"DATABASE_URL": URL, "DB_PASS": "pw-1"}
    assert plain == {"PWD": "/w", "KEYBOARD_LAYOUT": "us", "BASE_URL": "https://u@h/"}


def test_poprun_sends_a_url_with_a_password_over_stdin_with_a_bare_x_slot():
    config = parse_config(dict(hosts="n1", nproc_per_host=1, ipus_per_replica=1, num_ipus=1,
                               ipu_partition="p", vipu_server="s", training_script="t.py",
                               extra_env={"DATABASE_URL": URL, "PLAIN": "visible"}))
    assert config.hidden_env() == {"DATABASE_URL": URL}
    assert secret_values(config) == ["pw-5544x"]
    local = next(a for a in build_poprun_argv(config, bare=config.secret_env_names())
                 if a.startswith("--mpi-local-args="))
    assert local.endswith("-x DATABASE_URL -x PLAIN=visible")
