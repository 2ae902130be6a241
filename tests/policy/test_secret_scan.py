"""``multislice check`` finds a credential wherever a stack can carry one, on every backend, and no
output of it quotes the credential (infra/policy/secret_patterns.py, infra/policy/value_secrets.py,
training/redaction.py).

Each case writes a stack whose ``multislice:workload`` ``env``, ``multislice:labels``, provider
settings or gke image holds one made-up credential, moves it to each backend, runs the check in
process (the CLI through ``CliRunner``; two cases through a real subprocess), and asserts a mandatory
violation (or a config refusal) that says where the value is, and that the value appears nowhere in
the output. The credentials are made up in the documented shapes and assembled at run time from
pieces, so that no scanner takes this file for a leak.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE
from typer.testing import CliRunner

from infra.cli import app
from infra.policy.evaluate import check_stack
from infra.policy.secret_patterns import NAMED_SECRET, PATTERNS, find_secrets, is_reference, names_a_secret
from infra.policy.value_secrets import PROVIDER_CREDENTIAL_KEYS, stack_file_credentials
from tests.fakes.queued_resource import clear_ambient_credentials
from tests.helpers.policies import violations
from training.redaction import redacted

ROOT = Path(__file__).resolve().parents[2]
COMMAND_STACK = ROOT / "tests" / "stacks" / "Pulumi.emu-command.yaml"
RNG = random.Random(4)
ALNUM = string.ascii_letters + string.digits


def pick(n: int, alphabet: str = ALNUM) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(n))


def der_key_body(prefix: bytes, size: int) -> str:
    """A private key's DER in base64: ``prefix`` (the SEQUENCE and its version INTEGER) and random bytes."""
    return base64.b64encode(prefix + RNG.randbytes(size)).decode()


#: Made-up credentials in each documented shape, assembled from pieces.
GITHUB = "gh" + "p_" + pick(36)
GITHUB_FINE = "github" + "_pat_" + pick(22) + "_" + pick(59)
HUGGING_FACE = "h" + "f_" + pick(34)
SLACK_TOKEN = "xo" + "xb-" + pick(12, string.digits) + "-" + pick(13, string.digits) + "-" + pick(24)
SLACK_WEBHOOK_SECRET = pick(24)
SLACK_WEBHOOK = (
    "https://hooks.slack.com/" + "services/T" + pick(8, string.ascii_uppercase + string.digits) + "/B"
    + pick(10, string.ascii_uppercase + string.digits) + "/" + SLACK_WEBHOOK_SECRET
)  # fmt: skip
AWS_KEY_ID = "AK" + "IA" + pick(16, string.ascii_uppercase + string.digits)
AWS_SECRET = pick(36, ALNUM + "/+") + "aZ/7"
GOOGLE_API_KEY = "AI" + "za" + pick(35)
GOOGLE_TOKEN = "ya" + "29." + pick(60, ALNUM + "_-")
RSA_PKCS8 = der_key_body(bytes.fromhex("308204bd020100300d"), 1200)  # MIIEvQIBADAN…
PEM = "-----BEGIN " + "PRIVATE KEY-----\n" + "\n".join(RSA_PKCS8[i : i + 64] for i in range(0, 512, 64)) + "\n"
PEM += "-----END " + "PRIVATE KEY-----\n"
PASSWORD = "pa$$ w0rd'" + pick(6)  # a dollar sign, a space and a quote: no shape at all
URL_PASSWORD = pick(14)

#: The same stack on each backend: the keys that move it there (as tests/policy/test_release_secrets.py).
ON_BACKEND = {
    "queued-resource": {},
    "compute-engine": {
        "multislice:backend": "compute-engine",
        "multislice:acceleratorType": "v5p-8",
        "gcp:zone": "us-east5-a",
    },
    "gke": {"multislice:backend": "gke", "multislice:acceleratorType": "v4-16"},
}
SERVICE_ACCOUNT_KEY = {
    "type": "service_account",
    "project_id": "multislice-tests",
    "private_key_id": pick(40, string.hexdigits.lower()),
    "private_key": PEM,
    "client_email": "deployer@multislice-tests.iam.gserviceaccount.com",
}

#: pulumi-gcp's workload identity federation settings: the OIDC token is the credential.
EXTERNAL = {
    "audience": "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/ci/providers/github",
    "serviceAccountEmail": "deployer@multislice-tests.iam.gserviceaccount.com",
    "identityToken": "ey" + "J" + pick(80),
}

#: (stack-file edits, what the finding says, the secrets that must appear nowhere). ``env`` and
#: ``labels`` edit the workload's env and ``multislice:labels``; other keys are set as they are.
CASES = {
    "env password with any characters": (
        {"env": {"DB_PASSWORD": PASSWORD}},
        f"{NAMED_SECRET} (env DB_PASSWORD)",
        [PASSWORD],
    ),
    "env Hugging Face token under an unknown name": (
        {"env": {"MY_THING": HUGGING_FACE}},
        "a Hugging Face token (env MY_THING)",
        [HUGGING_FACE],
    ),
    "env private key body without its PEM lines": (
        {"env": {"SIGNING_MATERIAL": RSA_PKCS8}},
        "a private key's base64 body (env SIGNING_MATERIAL)",
        [RSA_PKCS8[:64]],
    ),
    "env Slack webhook": (
        {"env": {"NOTIFY": SLACK_WEBHOOK}},
        "a Slack webhook URL (env NOTIFY)",
        [SLACK_WEBHOOK_SECRET],
    ),
    "env Slack token": ({"env": {"CHAT": SLACK_TOKEN}}, "a Slack token (env CHAT)", [SLACK_TOKEN]),
    "env GitHub token": ({"env": {"DEPLOY": GITHUB}}, "a GitHub token (env DEPLOY)", [GITHUB]),
    "env Google API key": ({"env": {"MAPS": GOOGLE_API_KEY}}, "a Google API key (env MAPS)", [GOOGLE_API_KEY]),
    "env Google OAuth access token": (
        {"env": {"BEARER": GOOGLE_TOKEN}},
        "a Google OAuth access token (env BEARER)",
        [GOOGLE_TOKEN],
    ),
    "env AWS key pair": (
        {"env": {"AWS_ACCESS_KEY_ID": AWS_KEY_ID, "AWS_SECRET_ACCESS_KEY": AWS_SECRET}},
        "an AWS access key id (env AWS_ACCESS_KEY_ID)",
        [AWS_KEY_ID, AWS_SECRET],
    ),
    "env s3 URL with an AWS key": (
        {"env": {"SRC": f"s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/x"}},
        "an AWS access key id (env SRC)",
        [AWS_KEY_ID, AWS_SECRET],
    ),
    "env git+https URL with a password": (
        {"env": {"REPO": f"git+https://ci:{URL_PASSWORD}@github.com/acme/x.git"}},
        "a password in a URL (env REPO)",
        [URL_PASSWORD],
    ),
    "env postgres URL with a password": (
        {"env": {"DATABASE": f"postgres://app:{URL_PASSWORD}@db:5432/x"}},
        "a password in a URL (env DATABASE)",
        [URL_PASSWORD],
    ),
    "label under a name that says password": (
        {"labels": {"db-password": "h" + pick(13, string.ascii_lowercase)}},
        "labels 'db-password' holds",
        [],
    ),
    "gcp:credentials as a YAML mapping": (
        {"gcp:credentials": SERVICE_ACCOUNT_KEY},
        "stack file: gcp:credentials.private_key holds",
        [RSA_PKCS8[:64]],
    ),
    "gcp:credentials as JSON text": (  # what the engine hands over for the mapping too: read alike
        {"gcp:credentials": json.dumps(SERVICE_ACCOUNT_KEY)},
        "stack file: gcp:credentials.private_key holds",
        [RSA_PKCS8[:64]],
    ),
    "gcp:accessToken": (
        {"gcp:accessToken": GOOGLE_TOKEN},
        "stack file: gcp:accessToken holds a Google OAuth access token",
        [GOOGLE_TOKEN],
    ),
    "gcp:externalCredentials.identityToken": (
        {"gcp:externalCredentials": EXTERNAL},
        "stack file: gcp:externalCredentials.identityToken holds",
        [EXTERNAL["identityToken"]],
    ),
}
#: Values the config refuses: the refusal names the key and never quotes the secret.
REFUSED = {
    "label value, a URL with a password": (
        {"labels": {"src": f"postgres://u:{URL_PASSWORD}@db"}},
        "multislice:labels",
        [URL_PASSWORD],
    ),
    "env value that is a list": ({"env": {"DB_PASSWORD": [PASSWORD]}}, "multislice:workload.env", [PASSWORD]),
    "gke image with a user and password": (
        {"multislice:gke": {"image": f"https://ci:{URL_PASSWORD}@registry.example.com/ml/boot:1"}},
        "multislice:gke.image",
        [URL_PASSWORD],
    ),
    "gke image behind a GitHub token": (
        {"multislice:gke": {"image": f"{GITHUB}@ghcr.io/acme/boot:1"}},
        "multislice:gke.image",
        [GITHUB],
    ),
}


@pytest.fixture(autouse=True)
def no_storage_access(monkeypatch, tmp_path):
    """No emulated Cloud Storage or ambient credentials (as tests/cli/test_check.py)."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    clear_ambient_credentials(monkeypatch, tmp_path)


def stack(tmp_path: Path, backend: str, edits: dict) -> Path:
    document = yaml.safe_load(COMMAND_STACK.read_text())
    config = document["config"]
    config.update(ON_BACKEND[backend])
    workload = config["multislice:workload"]
    workload["source"] = str(COMMAND_STACK.parent / workload["source"])
    workload["env"]["EXPECTED_DEVICES"] = 16 if backend == "gke" else 8
    for key, value in edits.items():
        if key == "env":
            workload["env"].update(value)
        elif key == "labels":
            config["multislice:labels"] = value
        else:
            config[key] = value
    path = tmp_path / "Pulumi.leaky.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def check(path: Path):
    return CliRunner().invoke(app, ["check", "--config-file", str(path)], env={"COLUMNS": "400"}, color=False)


def assert_hidden(output: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in output, "the output quotes a secret"
        assert secret not in " ".join(output.split()), "the output quotes a secret"


def _case_on_backend() -> list[tuple[str, str]]:
    """Each case on one backend, the backends in turn (what a pattern finds is the scan's, the same on
    every backend; where an env value or a provider key lands is the backend's, and each backend gets
    several of both); the labels case on every backend (each labels resources of its own)."""
    backends = sorted(ON_BACKEND)
    pairs = [(case, backends[i % len(backends)]) for i, case in enumerate(sorted(CASES))]
    labels = [case for case in CASES if case.startswith("label")]
    return [(case, backend) for case, backend in pairs if case not in labels] + [
        (case, backend) for case in labels for backend in backends
    ]


@pytest.mark.parametrize(("case", "backend"), _case_on_backend())
def test_a_credential_anywhere_in_a_stack_is_a_mandatory_violation(tmp_path, case, backend):
    edits, says, secrets = CASES[case]
    result = check(stack(tmp_path, backend, edits))
    output = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    found = [line for line in result.output.splitlines() if line.startswith("mandatory [")]
    assert any(says in line for line in found), (says, result.output)
    assert re.search(r"violates mandatory policies: .*(startup-script-safe|values-carry-no-credentials)", output)
    assert_hidden(result.output, [*secrets, *[value for value in _values(edits) if len(value) >= 8]])


def _values(edits: dict) -> list[str]:
    """Every string the edits write that is a credential (the whole value of each)."""
    out = []
    for key, value in edits.items():
        if key in ("env", "labels"):
            out += [v for v in value.values() if isinstance(v, str) and not v.isdigit()]
        elif isinstance(value, str):
            out.append(value)
    return out


@pytest.mark.parametrize("backend", sorted(ON_BACKEND))
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_value_is_named_without_its_secret(tmp_path, case, backend):
    edits, key, secrets = REFUSED[case]
    if key.startswith("multislice:gke") and backend != "gke":
        pytest.skip("the gke backend's key")
    result = check(stack(tmp_path, backend, edits))
    assert result.exit_code == 2, result.output
    assert key in result.output
    assert_hidden(result.output, secrets)


@pytest.mark.parametrize(
    ("backend", "case"),
    [("gke", "env password with any characters"), ("compute-engine", "gcp:credentials as a YAML mapping")],
)
def test_the_installed_command_refuses_and_prints_no_secret(tmp_path, backend, case):
    edits, says, secrets = CASES[case]
    proc = subprocess.run(
        [sys.executable, "-m", "infra.cli", "check", "--config-file", str(stack(tmp_path, backend, edits))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "400"},
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert says in " ".join(proc.stderr.split())
    assert_hidden(proc.stdout + proc.stderr, [*secrets, *_values(edits)])


# benign stacks ------------------------------------------------------------------------------------

#: Values that name a secret's place, or are no secret under a name that looks like one: no finding.
BENIGN_ENV = {
    "TOKENIZER": "bpe",
    "NUM_TOKENS": "4096",
    "MAX_TOKEN_LENGTH": "512",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    "GOOGLE_APPLICATION_CREDENTIALS": "/var/secrets/google/key.json",
    "SSH_KEY_FILE": "~/.ssh/id_ed25519",
    "DB_PASSWORD": "${DB_PASSWORD_FROM_VAULT}",
    "API_TOKEN_SECRET": "projects/acme-ml/secrets/api-token/versions/3",
    "AWS_ACCESS_KEY_ID_NAME": "deploy",
    "WANDB_BASE_URL": "https://api.wandb.ai",
    "PIP_INDEX_URL": "https://pypi.org/simple",
    "CHECKPOINT_DIGEST": "sha256:" + "0" * 64,
    "KEY_SIZE": "2048",
}


def test_every_shipped_stack_has_no_credential_finding(monkeypatch):
    """The stacks of stacks/ as they are: neither credential policy reports anything."""
    monkeypatch.chdir(ROOT)
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        name = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        config = yaml.safe_load(path.read_text())["config"]
        found = [
            v for v in check_stack(name, config) if v.policy in ("startup-script-safe", "values-carry-no-credentials")
        ]
        assert found == [], (name, found)


@pytest.mark.parametrize("backend", sorted(ON_BACKEND))
def test_a_benign_stack_is_clean_on_every_backend(tmp_path, backend):
    edits = {"env": BENIGN_ENV, "labels": {"cost-center": "ml-research", "token-budget": "high"}}
    result = check(stack(tmp_path, backend, edits))
    assert result.exit_code == 0, result.output
    assert "startup-script-safe" not in result.output and "values-carry-no-credentials" not in result.output


def test_a_provider_credential_as_a_secret_or_a_path_is_no_finding():
    secure = {"secure": "v1:" + pick(24)}
    assert stack_file_credentials({key: secure for key in PROVIDER_CREDENTIAL_KEYS}) == []
    assert stack_file_credentials({"gcp:credentials": "/home/ci/keys/deployer.json"}) == []
    assert stack_file_credentials({"gcp:credentials": "deployer.json", "gcp:project": "acme-ml"}) == []
    nested = {"audience": "//iam.googleapis.com/x", "identityToken": secure, "serviceAccountEmail": "a@b.c"}
    assert stack_file_credentials({"gcp:externalCredentials": nested}) == []
    # a multislice:* value is scanned where it lands (the release, the resources), not here
    assert stack_file_credentials({"multislice:workload": {"env": {"HF_TOKEN": HUGGING_FACE}}}) == []


# the shapes themselves ------------------------------------------------------------------------------


def token_shapes() -> list[tuple[str, str, str]]:
    """``(text, kind, secret)``: a text holding one made-up credential, what the scan calls it, and the
    part of it no message may show (redacted() keeps a token's first four characters)."""
    shapes = []
    for prefix in ("p", "o", "u", "s", "r"):
        token = "gh" + prefix + "_" + pick(36)
        shapes.append((f"X={token}", "a GitHub token", token[4:]))
    for prefix in "abeoprs":
        token = "xo" + "x" + prefix + "-" + pick(12, string.digits) + "-" + pick(24)
        shapes.append((f"X={token}", "a Slack token", token[4:]))
    app_token = "xa" + "pp-1-" + pick(11) + "-" + pick(20)
    asia = "AS" + "IA" + pick(16, string.ascii_uppercase)
    bodies = {  # each private-key structure's DER prefix: the SEQUENCE and its version INTEGER
        "PKCS#1 RSA": ("308204a40201000282010100", 1180),
        "SEC 1 P-256": ("307702010104", 115),
        "SEC 1 P-384": ("3081a402010104", 158),
        "PKCS#8 P-256": ("308187020100301306", 129),
        "PKCS#8 Ed25519": ("302e020100300506032b657004220420", 32),
    }
    for prefix, size in bodies.values():
        body = der_key_body(bytes.fromhex(prefix), size)
        shapes.append((f"KEY_MATERIAL={body}", "a private key's base64 body", body[4:]))
    for scheme, user in (("git+https", "ci"), ("postgres", "app"), ("https", "u"), ("redis", "default")):
        shapes.append((f"{scheme}://{user}:{URL_PASSWORD}@host.example/x", "a password in a URL", URL_PASSWORD))
    return shapes + [
        (f"X={GITHUB_FINE}", "a GitHub token", GITHUB_FINE[4:]),
        (f"X={HUGGING_FACE}", "a Hugging Face token", HUGGING_FACE[4:]),
        (f"X={app_token}", "a Slack token", app_token[4:]),
        (f"X={SLACK_WEBHOOK}", "a Slack webhook URL", SLACK_WEBHOOK_SECRET),
        (f"X={GOOGLE_API_KEY}", "a Google API key", GOOGLE_API_KEY[4:]),
        (f"Authorization: Bearer {GOOGLE_TOKEN}", "a Google OAuth access token", GOOGLE_TOKEN[4:]),
        (f"X={AWS_KEY_ID}", "an AWS access key id", AWS_KEY_ID[4:]),
        (f"X={asia}", "an AWS access key id", asia[4:]),
        (f"id {AWS_KEY_ID}\nkey {AWS_SECRET}\n", "an AWS secret access key", AWS_SECRET),
        (f"key {AWS_SECRET} for {AWS_KEY_ID}", "an AWS secret access key", AWS_SECRET),
        (PEM, "a PEM private key", RSA_PKCS8[4:64]),
        (RSA_PKCS8, "a private key's base64 body", RSA_PKCS8[4:64]),
        (f"s3://{AWS_KEY_ID}:{URL_PASSWORD}@bucket/x", "an AWS access key id", URL_PASSWORD),
        (f'"DB_PASSWORD": "{"pa$$word-" + pick(8)}"', "a hard-coded password or token", None),
    ]


SHAPES = token_shapes()


@pytest.mark.parametrize(("text", "kind", "secret"), SHAPES, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(SHAPES)])
def test_each_shape_is_found_and_never_shown(text, kind, secret):
    assert kind in [found.kind for found in find_secrets(text)]
    if secret is not None:  # a hard-coded password is hidden by not quoting it at all (no shape)
        assert secret not in redacted(text), redacted(text)


@pytest.mark.parametrize(
    "text",
    [
        der_key_body(bytes.fromhex("3082035d30820245a003020102"), 840),  # a certificate: MIIDXTCC…
        der_key_body(bytes.fromhex("30820122300d06092a864886f70d0101010500"), 270),  # an RSA public key: MIIBIjAN…
        der_key_body(bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200"), 65),  # an EC public key
        base64.b64encode(RNG.randbytes(600)).decode(),  # random base64
        "sha256:" + pick(64, "0123456789abcdef"),
        "M" + "I" * 200,
    ],
    ids=["certificate", "rsa-public-key", "ec-public-key", "random-base64", "digest", "run"],
)
def test_public_material_is_no_private_key(text):
    assert [found.kind for found in find_secrets(text)] == []


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("DB_PASSWORD", True),
        ("dbPassword", True),
        ("db-password", True),
        ("CLIENT_SECRET", True),
        ("HF_TOKEN", True),
        ("accessToken", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("identityToken", True),
        ("private_key", True),
        ("SMTP_PASS", True),
        ("TOKENIZER", False),
        ("NUM_TOKENS", False),
        ("KEYBOARD_LAYOUT", False),
        ("SSH_KEY_FILE", False),
        ("SECRET_NAME", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("private_key_id", False),
        ("KEY_SIZE", False),
        ("TOKEN_URL", False),
        ("token-budget", False),
        ("KEY_FIELD", False),
        ("HF_HUB_DISABLE_IMPLICIT_TOKEN", True),  # its value is a switch: no finding (a reference below)
    ],
)
def test_a_name_says_secret_by_its_words(name, says):
    assert names_a_secret(name) is says


@pytest.mark.parametrize(
    ("value", "reference"),
    [
        ("", True),
        ("1", True),
        ("false", True),
        ("$DB_PASSWORD", True),
        ("${VAULT_TOKEN}", True),
        ("$(gcloud secrets versions access latest --secret=db)", True),
        ("/run/secrets/db", True),
        ("~/.config/token", True),
        ("projects/acme/secrets/db/versions/latest", True),
        ("https://vault.example.com/v1/secret/db", True),
        (PASSWORD, False),
        ("hunter2", False),
        ("https://u:" + URL_PASSWORD + "@vault.example.com/", False),
        ("12345678", False),
        ("$ecret pass!", False),  # a dollar sign, not a variable
    ],
)
def test_a_reference_names_where_a_secret_is(value, reference):
    assert is_reference(value) is reference


def test_labels_and_env_at_any_depth_of_a_resource_are_scanned():
    # a value not known until the update (the cluster's name during a preview) is left out, not fatal
    labels = {"db-password": "x" + pick(9, string.ascii_lowercase), "zone": UNKNOWN_STRING_VALUE}
    node_pool = {"cluster": UNKNOWN_STRING_VALUE, "nodeConfig": {"resourceLabels": labels}}
    found = violations("values-carry-no-credentials", "gcp:container/nodePool:NodePool", node_pool)
    assert len(found) == 1 and "nodeConfig.resourceLabels 'db-password'" in found[0], found
    container = {
        "name": "worker",
        "image": "us-docker.pkg.dev/a/b/c:1",
        "env": [{"name": "HF_TOKEN", "value": PASSWORD}],
    }
    pod = {"spec": {"containers": [container]}}
    jobset = {"spec": {"replicatedJobs": [{"template": {"spec": {"template": pod}}}]}}
    found = violations("values-carry-no-credentials", "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet", jobset)
    assert len(found) == 1 and "'HF_TOKEN' holds " + NAMED_SECRET in found[0] and PASSWORD not in found[0]


@pytest.mark.timeout(60)
def test_every_pattern_is_linear_on_long_runs():
    """Runs of each character the patterns name, alone and after the prefixes they look for: each
    search ends at once (no pattern backtracks over a whole run: a quadratic one would take minutes)."""
    import training.redaction

    patterns = [pattern for _, pattern in PATTERNS] + [
        value for value in vars(training.redaction).values() if isinstance(value, re.Pattern)
    ]
    runs = ("a", "A", "0", "/", "+", "_", "-", ":", "@", " ", "a:", "a@", "://", "MII", "AKIA", "ghp_", "hf_")
    prefixes = ("", "https://", "a:", "AKIA" + "A" * 16 + " ", "-----BEGIN PRIVATE KEY-----", "password = '")
    for prefix in prefixes:
        for run in runs:
            text = prefix + run * (20_000 // len(run))
            for pattern in patterns:
                pattern.search(text)
                pattern.sub("", text)
        redacted(prefix + "a:" * 10_000)
