"""Stack files that would fail at `pulumi up` (or could never run) fail while the stack is read:
subnet ranges GCP refuses, keys of namespaces nothing reads, YAML that expands through aliases
to a huge document, oversized files. Each is one message naming the key, file or cause."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from infra.config import StackConfigError, load_stack_file, validate_stack
from infra.config.environment import PROHIBITED_SUBNET_RANGES, check_subnet_range
from infra.readers.stack_file import MAX_FILE_BYTES, MAX_NODES, expanded_nodes
from tests.fakes.pulumi_program import evaluate

STACKS = Path(__file__).resolve().parents[2] / "stacks"
DEV = STACKS / "Pulumi.dev.yaml"
SUBNETS = "https://cloud.google.com/vpc/docs/subnets: Prohibited IPv4 subnet ranges"


def dev_map() -> dict:
    return copy.deepcopy(yaml.safe_load(DEV.read_text())["config"])


def errors_of(config: dict) -> list[str]:
    with pytest.raises(StackConfigError) as info:
        validate_stack("t", config, "test")
    return info.value.lines


def file_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(text)
    with pytest.raises(StackConfigError) as info:
        load_stack_file(path)
    return str(info.value).replace(str(path), "<file>")


# subnet ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cidr", "message"),
    [
        (
            "127.0.0.0/16",
            f"'127.0.0.0/16' overlaps 127.0.0.0/8 (local host (loopback), RFC 1122), which Google Cloud "
            f"prohibits in subnets ({SUBNETS})",
        ),
        (
            "169.254.0.0/20",
            f"'169.254.0.0/20' overlaps 169.254.0.0/16 (link-local, RFC 3927; the metadata server is "
            f"169.254.169.254), which Google Cloud prohibits in subnets ({SUBNETS})",
        ),
        (
            "0.0.0.0/8",
            f"'0.0.0.0/8' overlaps 0.0.0.0/8 (current (local) network, RFC 1122), which Google Cloud "
            f"prohibits in subnets ({SUBNETS})",
        ),
        (
            "224.0.0.0/8",
            f"'224.0.0.0/8' overlaps 224.0.0.0/4 (multicast (class D), RFC 5771), which Google Cloud "
            f"prohibits in subnets ({SUBNETS})",
        ),
        (
            "255.0.0.0/8",
            f"'255.0.0.0/8' overlaps 255.255.255.255/32 (limited broadcast, RFC 8190 and RFC 1122), "
            f"which Google Cloud prohibits in subnets ({SUBNETS})",
        ),
        (
            "199.36.153.8/29",
            f"'199.36.153.8/29' overlaps 199.36.153.8/30 (private.googleapis.com, Private Google "
            f"Access), which Google Cloud prohibits in subnets ({SUBNETS})",
        ),
        (
            "8.8.0.0/16",
            "'8.8.0.0/16' is a public range: use a private one such as 10.0.0.0/8, 172.16.0.0/12 or "
            "192.168.0.0/16 (Cloud NAT takes the VMs to public addresses, which a subnet must not reuse)",
        ),
        ("10.0.0.0/7", "'10.0.0.0/7': a subnet's primary range has a prefix length from /8 to /29"),
        ("10.0.0.0/30", "'10.0.0.0/30': a subnet's primary range has a prefix length from /8 to /29"),
    ],
)
def test_subnet_ranges_gcp_refuses_are_refused_at_preview(cidr, message):
    config = dev_map() | {"multislice:network": {"subnetCidr": cidr}}
    assert errors_of(config) == [f"multislice:network.subnetCidr: {message}"]


@pytest.mark.parametrize(
    "cidr", ["10.130.0.0/20", "172.16.0.0/12", "192.168.4.0/24", "100.64.0.0/10", "198.18.0.0/15", "240.0.0.0/8"]
)
def test_ranges_gcp_lists_as_valid_are_accepted(cidr):
    assert check_subnet_range(cidr) == cidr


def test_the_ranges_python_calls_private_are_not_enough():
    # The former check (ipaddress's is_private) let loopback and link-local ranges through.
    import ipaddress

    for prohibited, _ in PROHIBITED_SUBNET_RANGES[:3]:
        assert ipaddress.IPv4Network(prohibited).is_private
        with pytest.raises(ValueError, match="which Google Cloud prohibits in subnets"):
            check_subnet_range(prohibited if prohibited != "0.0.0.0/8" else "0.1.0.0/16")


def test_a_refused_subnet_stops_the_program_before_any_resource():
    config = dev_map() | {"multislice:network": {"subnetCidr": "169.254.0.0/20"}}
    with pytest.raises(StackConfigError) as err:
        evaluate("dev", config)
    assert [line.split(":")[1] for line in err.value.lines] == ["network.subnetCidr"]


# namespaces -----------------------------------------------------------------------------------


def test_a_key_of_a_namespace_nothing_reads_is_refused():
    assert errors_of(dev_map() | {"aws:region": "us-east-1"}) == [
        "aws:region: unknown namespace 'aws': a stack file holds multislice:* keys (this program), gcp:* keys "
        "(the gcp provider) and pulumi:* keys (the engine); nothing reads this one"
    ]
    assert errors_of(dev_map() | {"training:steps": 10}) == [
        "training:steps: unknown namespace 'training': a stack file holds multislice:* keys (this program), gcp:* "
        "keys (the gcp provider) and pulumi:* keys (the engine); nothing reads this one"
    ]


def test_a_namespace_typo_names_the_nearest():
    assert errors_of(dev_map() | {"multislcie:slices": 2}) == [
        "multislcie:slices: unknown namespace (did you mean multislice:slices?)"
    ]


def test_engine_and_provider_keys_stay_allowed():
    config = dev_map() | {"pulumi:disable-default-providers": ["*"], "gcp:region": "us-central2"}
    assert validate_stack("t", config, "test").project == "acme-ml-dev"


def test_a_huge_key_is_not_echoed_whole():
    (line,) = errors_of(dev_map() | {"multislice:" + "k" * 5000: 1})
    assert len(line) < 600 and line.startswith("multislice:kkkk") and "… (5011 characters)" in line


# YAML expansion ---------------------------------------------------------------------------------

LAUGHS = """config:
  gcp:project: acme-ml-dev
  a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
  g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
  h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
  i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_a_billion_laughs_stack_file_is_refused_before_it_expands(tmp_path):
    assert len(LAUGHS) < 700  # 9^9 strings once loaded
    assert file_error(tmp_path, LAUGHS) == (
        f"stack file <file> expands to more than {MAX_NODES:,} YAML nodes through its aliases; a stack file holds a "
        "few hundred: write the values out instead of nesting aliases"
    )


def test_a_recursive_alias_is_refused(tmp_path):
    assert file_error(tmp_path, "config:\n  a: &a [1, *a]\n") == (
        "stack file <file> has an alias at line 2 inside the node it refers to (a recursive value): write the "
        "values out"
    )


def test_modest_aliases_still_work(tmp_path):
    text = DEV.read_text().replace(
        "  multislice:capacity: spot", "  multislice:labels: &l {team: ml}\n  multislice:capacity: spot"
    )
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(text)
    assert load_stack_file(path).labels == {"team": "ml"}


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_the_shipped_stacks_are_far_below_the_limits(name):
    path = STACKS / f"Pulumi.{name}.yaml"
    assert path.stat().st_size < MAX_FILE_BYTES // 100
    assert expanded_nodes(yaml.compose(path.read_text())) < MAX_NODES // 10


def test_an_oversized_stack_file_is_refused_unread(tmp_path):
    text = DEV.read_text() + "#" * MAX_FILE_BYTES + "\n"
    assert file_error(tmp_path, text) == (
        f"stack file <file> is {len(text.encode()):,} bytes; a stack file is a few KB (at most {MAX_FILE_BYTES:,} "
        "bytes are read)"
    )


# trainer sizes in a stack ----------------------------------------------------------------------


def test_implausible_training_sizes_and_a_warmup_past_the_run_name_their_key():
    config = dev_map()
    config["multislice:training"]["steps"] = 10**9
    assert errors_of(config) == ["multislice:training.steps: Input should be less than or equal to 100000000"]
    config = dev_map()
    config["multislice:training"]["optimizer"]["warmup_steps"] = 500
    assert errors_of(config) == [
        "multislice:training.optimizer.warmup_steps: 500 is longer than the run (steps: 120): the learning rate "
        "would never reach its peak; use fewer warmup steps than steps"
    ]
    config = dev_map()
    config["multislice:training"]["stpes"] = 5
    assert errors_of(config) == ["multislice:training.stpes: unknown key (did you mean 'steps'?)"]


def test_bad_model_options_in_a_stack_name_their_key():
    config = dev_map()
    config["multislice:training"]["model"]["preset"] = "gpt-5"
    (line,) = errors_of(config)
    assert line.startswith("multislice:training.model.preset: unknown preset 'gpt-5'; presets: byte, smollm2-135m, ")
    config = dev_map()
    config["multislice:training"]["microbatches"] = 3  # 16 sequences ÷ 8 replicas = 2 per replica
    assert errors_of(config) == [
        "multislice:training.microbatches: 3 does not divide the per-replica batch 2 (global_batch_size 16 ÷ "
        "data-parallel size 8); use a divisor of 2"
    ]
    config = dev_map()
    config["multislice:training"]["model"].update({"d_model": 512, "compute_dtype": "bfloat16", "attention": "cudnn"})
    assert errors_of(config) == [
        "multislice:training.model.attention: cudnn is NVIDIA GPUs' kernel; this stack's accelerator is TPU v4-8: "
        "use auto (splash on TPU where it takes the shapes), splash, xla or reference"
    ]
    config = dev_map()
    config["multislice:training"]["model"].update({"d_model": 512, "attention": "splash", "remat": "full"})
    config["multislice:training"]["microbatches"] = 2
    validate_stack("t", config, "test")  # a TPU stack may name the TPU kernel
