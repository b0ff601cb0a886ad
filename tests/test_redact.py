"""Secrets never reach the run directory: reports.redact on real tool outputs (nothing to hide,
so nothing may change) and on copies DERIVED from them with a made-up secret added, each test
saying which field it adds; then Ledger.save_raw, the one place raw output is written.

Every secret value below is made up for these tests; none is a real credential.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from reports.ledger import RAW_DIR, Ledger
from reports.redact import REDACTED, redact, secret_name
from runners.launchers import MpirunLauncher, SrunLauncher
from runners.nccl_tests import parse_nccl_tests
from runners.training import parse_training
from runners.transport import wrap

DATA = Path(__file__).resolve().parent / "data"
NCCL_JSON = DATA / "h200-1gpu" / "all_reduce_perf_h200_g1.json"  # real: nccl-tests 2.19.6 -J on one H200
TRAINING = DATA / "training" / "cpu-2ranks.stdout"  # real: the training payload under torchrun, 2 CPU ranks

MADE_UP_HF = "hf_MadeUpForHandoverTests0123456789"
MADE_UP_AWS = "madeup/AWS+Secret/Key0123456789=="
MADE_UP_WANDB = "0123456789abcdef-made-up-wandb-key"


def with_env_entries(real: str, *entries: str) -> str:
    """The real -J text with made-up strings appended to its "env" list (DERIVED)."""
    last = '"CUDA_VERSION=13.0.2"]'
    assert real.count(last) == 1
    return real.replace(last, '"CUDA_VERSION=13.0.2",' + ",".join(json.dumps(e) for e in entries) + "]")


# --- Real outputs: nothing looks secret, nothing changes ---------------------------------------------

# Inventories, not tool outputs: some hold real secrets (deepops' ansible_password=vagrant), and
# their readers never write them to a run directory.
CONFIGURATION_FOLDERS = ("ansible", "slurm")


def test_every_real_output_in_tests_data_is_left_byte_for_byte():
    """hpcc's NAME=value summary, the -J env list, payload env dicts, iperf3's "cookie",
    tokens_per_s: all real and none a secret."""
    files = sorted(path for path in DATA.rglob("*")
                   if path.is_file() and path.relative_to(DATA).parts[0] not in CONFIGURATION_FOLDERS)
    assert len(files) > 50
    changed = [str(path.relative_to(DATA)) for path in files
               if redact(text := path.read_text(encoding="utf-8", errors="replace")) != text]
    assert changed == []


# --- Real outputs with a made-up secret added ----------------------------------------------------------


def test_nccl_tests_json_env_secrets_are_redacted_and_the_figures_kept():
    """DERIVED: the real -J document's "env" list gets two made-up entries."""
    real = NCCL_JSON.read_text()
    derived = with_env_entries(real, f"HF_TOKEN={MADE_UP_HF}", f"AWS_SECRET_ACCESS_KEY={MADE_UP_AWS}")

    redacted = redact(derived)

    assert MADE_UP_HF not in redacted and MADE_UP_AWS not in redacted
    document = json.loads(redacted)
    assert document["env"] == json.loads(real)["env"] + [f"HF_TOKEN={REDACTED}",
                                                          f"AWS_SECRET_ACCESS_KEY={REDACTED}"]
    assert redacted == with_env_entries(real, f"HF_TOKEN={REDACTED}", f"AWS_SECRET_ACCESS_KEY={REDACTED}")
    assert parse_nccl_tests(redacted) == parse_nccl_tests(real)


def test_payload_env_member_is_redacted_and_the_run_still_parses():
    """DERIVED: the real training payload line's "env" object gets a made-up WANDB_API_KEY."""
    real = TRAINING.read_text()
    assert real.count('"env": {') == 1
    derived = real.replace('"env": {', f'"env": {{"WANDB_API_KEY": "{MADE_UP_WANDB}", ')

    redacted = redact(derived)

    assert MADE_UP_WANDB not in redacted
    assert redacted == real.replace('"env": {', f'"env": {{"WANDB_API_KEY": "{REDACTED}", ')
    parsed, original = parse_training(redacted), parse_training(real)
    assert parsed.env == {"WANDB_API_KEY": REDACTED, **original.env}
    assert parsed.tokens_per_s == original.tokens_per_s and parsed.ok == original.ok


def test_command_lines_the_harness_builds_are_redacted_word_by_word():
    """Real argv from the harness's own mpirun launcher and transport wrapper (what a .command
    or a message holds), with made-up secret values passed through them."""
    launcher = MpirunLauncher(export_env=("NCCL_DEBUG", f"HF_TOKEN={MADE_UP_HF}", "DB_PASSWORD=a b$c"))
    argv = launcher.argv(["node1", "node2"], 1, ["all_reduce_perf", "-g", "1"])
    command = shlex.join(wrap(argv, tag="t0", timeout=60, root=False,
                              env={"NCCL_DEBUG": "VERSION", "GITHUB_TOKEN": "ghp_madeUp0123"}))

    redacted = redact(command)

    assert MADE_UP_HF not in redacted and "ghp_madeUp0123" not in redacted and "a b$c" not in redacted
    assert f"-x HF_TOKEN={REDACTED} " in redacted
    assert f"-x 'DB_PASSWORD={REDACTED}' " in redacted
    assert f" GITHUB_TOKEN={REDACTED} timeout " in redacted
    assert "-x NCCL_DEBUG " in redacted and "NCCL_DEBUG=VERSION" in redacted
    assert shlex.split(redacted)[:2] == ["env", "HANDOVER_TAG=t0"]


# --- Made-up lines (each named as such): the other shapes tools print -----------------------------------


@pytest.mark.parametrize(("line", "expected"), [
    # `env | sort` lines: the value runs to the end of the line
    ("HUGGING_FACE_HUB_TOKEN=hf_made up with spaces", f"HUGGING_FACE_HUB_TOKEN={REDACTED}"),
    ("export PGPASSWORD=madeup", f"export PGPASSWORD={REDACTED}"),
    ("[1,0]<stdout>:WANDB_API_KEY=madeup", f"[1,0]<stdout>:WANDB_API_KEY={REDACTED}"),
    # Python's repr of an environment dict
    ("env: {'HF_TOKEN': 'madeup', 'LANG': 'C'}", f"env: {{'HF_TOKEN': '{REDACTED}', 'LANG': 'C'}}"),
    # options and URLs
    ("huggingface-cli login --token=madeup --add-to-git-credential",
     f"huggingface-cli login --token={REDACTED} --add-to-git-credential"),
    ("git clone https://oauth2:madeUpPat@gitlab.example.com/x.git",
     f"git clone https://oauth2:{REDACTED}@gitlab.example.com/x.git"),
    ("GET /v1?api_key=madeup&page=2", f"GET /v1?api_key={REDACTED}&page=2"),
    # srun's --export list (the harness's own SrunLauncher writes one), YAML lines and headers
    ("srun --export=ALL,HF_TOKEN=madeup,NCCL_DEBUG=INFO -N 2 x",
     f"srun --export=ALL,HF_TOKEN={REDACTED},NCCL_DEBUG=INFO -N 2 x"),
    ("  db_password:  madeup", f"  db_password:  {REDACTED}"),
    ("curl -H 'Authorization: Bearer madeup' https://x", f"curl -H 'Authorization: {REDACTED}' https://x"),
    # an option and the word after it; sshpass's -p
    ("tool --password 'made up' --user bob", f"tool --password {REDACTED} --user bob"),
    ("huggingface-cli login --token madeup --add-to-git-credential",
     f"huggingface-cli login --token {REDACTED} --add-to-git-credential"),
    ("sshpass -p madeup ssh root@n1", f"sshpass -p {REDACTED} ssh root@n1"),
    ("sshpass -pmadeup ssh root@n1", f"sshpass -p{REDACTED} ssh root@n1"),
    # a private key's lines, in a file and in a JSON string
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbm made up\nAAAA\n-----END OPENSSH PRIVATE KEY-----",
     f"-----BEGIN OPENSSH PRIVATE KEY-----\n{REDACTED}\n{REDACTED}\n-----END OPENSSH PRIVATE KEY-----"),
    ('{"key": "-----BEGIN RSA PRIVATE KEY-----\\nMIIE madeup\\n-----END RSA PRIVATE KEY-----"}',
     f'{{"key": "-----BEGIN RSA PRIVATE KEY-----{REDACTED}-----END RSA PRIVATE KEY-----"}}'),
    # left alone: not secrets
    ("stress-ng: info:  [18704] passed: 3: cpu (2) vm (1)", "stress-ng: info:  [18704] passed: 3: cpu (2) vm (1)"),
    ("ssh -o PasswordAuthentication=no n1", "ssh -o PasswordAuthentication=no n1"),
    ("max_tokens: 512", "max_tokens: 512"),
    ("PWD=/root", "PWD=/root"),
    ("SSH_AUTH_SOCK=/tmp/ssh-XXXX/agent.1", "SSH_AUTH_SOCK=/tmp/ssh-XXXX/agent.1"),
    ("TOKENIZERS_PARALLELISM=false", "TOKENIZERS_PARALLELISM=false"),
    ("NCCL_IB_HCA=mlx5_0,mlx5_1", "NCCL_IB_HCA=mlx5_0,mlx5_1"),
    ("ssh://root@node1:22", "ssh://root@node1:22"),
    ("HF_TOKEN=", "HF_TOKEN="),
    # the harness's own reason for a node whose host key is not known (kind host-key)
    ("host-key: Server '10.77.237.1' not found in known_hosts",
     "host-key: Server '10.77.237.1' not found in known_hosts"),
], ids=lambda value: value[:24])
def test_made_up_lines_of_each_shape(line, expected):
    assert redact(line) == expected
    assert redact(expected) == expected


@pytest.mark.parametrize("name", ["HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                  "WANDB_API_KEY", "OPENAI_APIKEY", "DB_PASSWORD", "PGPASSWORD", "MYSQL_PWD",
                                  "SMTP_PASS", "NPM_CONFIG__AUTH", "CLIENT_SECRET", "DOCKER_CREDENTIALS",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "SSH_PRIVATE_KEY", "GPG_PASSPHRASE",
                                  "--hf-token", "password"])
def test_names_that_hold_secrets(name):
    assert secret_name(name)
    assert redact(f"{name}=made-up") == f"{name}={REDACTED}"
    assert redact(f'{{"{name}": "made-up"}}') == f'{{"{name}": "{REDACTED}"}}'


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "SSH_AUTH_SOCK", "TOKENIZERS_PARALLELISM", "MAX_TOKENS",
                                  "tokens_per_s", "train_tokens_per_s", "cookie", "key", "KEYBOARD", "BYPASS",
                                  "NCCL_DEBUG", "NCCL_IB_HCA", "HPL_N", "CUDA_VISIBLE_DEVICES", "PASSES",
                                  "host-key", "HOST_KEY", "public_key", "ssh_pub_key", "--credentials_path",
                                  "--data_enc_key_app_path", "PASSWORD_FILE", "SSH_KEY_DIR"])
def test_names_that_do_not(name):
    assert not secret_name(name)
    assert redact(f"{name}=kept") == f"{name}=kept"


def test_srun_export_list_the_harness_builds_is_redacted():
    """Real argv from the harness's own srun launcher with a made-up secret passed through it."""
    launcher = SrunLauncher(env={"NCCL_DEBUG": "INFO", "HF_TOKEN": MADE_UP_HF})
    command = shlex.join(launcher.argv(["node1", "node2"], 1, ["all_reduce_perf", "-g", "1"]))
    assert "--export=" in command

    redacted = redact(command)

    assert MADE_UP_HF not in redacted and f"HF_TOKEN={REDACTED}" in redacted and "NCCL_DEBUG=INFO" in redacted


# --- Where raw output is stored --------------------------------------------------------------------------


def test_save_raw_stores_no_secret_anywhere_in_the_run_directory(tmp_path):
    """The real -J document DERIVED with a made-up token, its stderr a made-up `env` listing, and
    a command from the harness's launcher: the run directory holds [REDACTED], never a secret."""
    ledger = Ledger.create(tmp_path / "out", "c", {"nodes": ["n1"]})
    stdout = with_env_entries(NCCL_JSON.read_text(), f"HF_TOKEN={MADE_UP_HF}")
    stderr = f"NCCL_DEBUG=VERSION\nAWS_SECRET_ACCESS_KEY={MADE_UP_AWS}\n"
    command = shlex.join(MpirunLauncher(export_env=(f"WANDB_API_KEY={MADE_UP_WANDB}",))
                         .argv(["n1"], 1, ["all_reduce_perf", "-J", "out.json"]))

    saved = ledger.save_raw("nccl_tests", "n1", stdout, stderr, command)

    assert saved == [f"{RAW_DIR}/nccl_tests/n1.command", f"{RAW_DIR}/nccl_tests/n1.stdout",
                     f"{RAW_DIR}/nccl_tests/n1.stderr"]
    everything = b"".join(path.read_bytes() for path in ledger.run_dir.rglob("*") if path.is_file())
    for secret in (MADE_UP_HF, MADE_UP_AWS, MADE_UP_WANDB):
        assert secret.encode() not in everything
    stored = json.loads((ledger.run_dir / saved[1]).read_text())
    assert stored["env"][-1] == f"HF_TOKEN={REDACTED}"
    assert (ledger.run_dir / saved[2]).read_text() == f"NCCL_DEBUG=VERSION\nAWS_SECRET_ACCESS_KEY={REDACTED}\n"


def test_the_run_headers_command_line_keeps_no_secret(tmp_path):
    """The report's provenance shows the run's argv: a made-up token given as an option's value,
    or as a variable, is redacted there, the rest kept word for word."""
    argv = ["pytest", "--inventory", "my cluster.yaml", "--token", "madeup", "X_TOKEN=madeup2", "-k", "not soak"]
    ledger = Ledger.create(tmp_path / "out", "c", {"nodes": ["n1"], "argv": argv})

    header = json.loads(ledger.path.read_text().splitlines()[0])

    assert header["argv"] == ["pytest", "--inventory", "my cluster.yaml", "--token", REDACTED,
                              f"X_TOKEN={REDACTED}", "-k", "not soak"]
