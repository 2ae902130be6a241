"""Stack files read by the Pulumi engine's own code, kept as test data for ``test_engine_reading.py``.

:data:`CASES` is a corpus of stack files: odd scalars (YAML 1.1's booleans, base 60, octal and
hexadecimal spellings, dates, floats without a dot, huge integers, tags, block scalars) at a top-level
key and inside maps, the way keys are written (without a namespace, ``ns:config:name``), merge keys,
and the shipped stacks as they were when the data was made. ``engine_oracle.go`` (Pulumi's loader and
config code with the real gopkg.in/yaml.v3) reads each one; its answers are ``engine_readings.json``.

Regenerate after changing the corpus (needs Go and yaml.v3, see engine_oracle.go)::

    python -m tests.readers.engine_corpus
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
READINGS = HERE / "engine_readings.json"
ORACLE = HERE / "engine_oracle.go"
STACKS = HERE.parents[1] / "stacks"

#: The keys every stack needs; the odd scalar goes beside them.
REQUIRED = "config:\n  gcp:project: acme-ml-dev\n  gcp:zone: us-central2-b\n  multislice:acceleratorType: v4-8\n"

#: Plain and tagged scalars that YAML readers may read differently.
SCALARS = [
    "1:30", "1:30:00", "190:20:30", "190:20:30.15", "-1:30", "12:30:45",
    "yes", "Yes", "YES", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF", "y", "Y", "n", "N",
    "true", "True", "TRUE", "tRUE", "false", "False", "FALSE",
    "~", "null", "Null", "NULL", "nULL", "",
    "0", "-0", "+0", "00", "007", "010", "08", "09", "0777", "-010", "+010",
    "0o17", "0O17", "-0o17", "0o8", "0x18", "0X18", "-0x18", "0x_18", "0x", "0b101", "0B101", "-0b101", "0b", "0b2",
    "2_4", "1_000", "_1", "1_", "+12", "-12", "12",
    "1e3", "1E3", "1e+3", "1e-3", "-1e3", "1.e3", "1.0e3", "1.0e+3", "12e", "1e", "+1.5e-3",
    "1.", "1.0", ".5", "-.5", "+.5", "1.5", "-1.5", "1_000.5", "685.230_15e+03", "685_230.15", "6.8523015e+5",
    "1000.0", "3.0", "0.1", "0.30000000000000004", "1e20", "1e21", "1e22", "1e-6", "1e-7", "0.000001", "1.5e300",
    "1e400", "1e-400", ".5e-999", "123456789.0",
    "9223372036854775807", "9223372036854775808", "18446744073709551615", "18446744073709551616",
    "-9223372036854775808", "-9223372036854775809", "123456789012345678901",
    ".inf", ".Inf", "-.inf", "+.inf", ".nan", ".NaN", "inf", "nan", "Infinity",
    "2024-01-01", "2024-1-2", "2024-01-01 10:00:00", "2001-12-14t21:59:43.10-05:00", "2024-13-40", "1234-",
    "2024-01", "20240101",
    "'yes'", '"on"', "'1:30'", "'0o17'", "'2024-01-01'", "'010'", "'1e3'", "''",
    "!!str yes", "!!str 1:30", "!!str 12", '!!int "12"', "!!int 0o17", "!!int 1.5", "!!float 3", "!!float 1:30",
    "!!bool yes", "!!bool true", "!!null ''", "! 12", "!!binary aGVsbG8=", "!!timestamp 2024-01-01",
    "|\n    block text", ">-\n    folded\n    text", "'a<b&c'", "text with spaces", "multislice", "- in text",
    "https://example.com/a?b=c&d", "'\u00e9t\u00e9'", '"tab\\there"', "v4-8", "us-central2-b", "3d", "10m",
    "-", "+", ".", "..", "0.5.5", "1,000", "1 000", "0x1p-2", "1_0_0", "0_7", "0x1F", "0xFFFFFFFFFFFFFFFF",
]  # fmt: skip

#: Where each scalar is written: a top-level key (text, a number), and inside a map.
PLACES = {
    "top-slices": "  multislice:slices: {}\n",
    "top-capacity": "  multislice:capacity: {}\n",
    "labels": "  multislice:labels:\n    team: {}\n",
    "steps": "  multislice:training:\n    steps: {}\n",
    "iap": "  multislice:network:\n    iapSsh: {}\n",
    "list": "  multislice:allowUnlisted: [{}]\n",
}

#: Whole files: how keys and structure are written.
STRUCTURE = {
    "no-namespace": "config:\n  gcp:project: p-1\n  gcp:zone: us-central2-b\n  acceleratorType: v4-8\n  slices: 2\n",
    "config-namespace": REQUIRED + "  multislice:config:slices: 2\n",
    "three-colons": REQUIRED + "  a:b:c: 2\n",
    "both-spellings": REQUIRED + "  slices: 2\n  multislice:slices: 3\n",
    "merge": REQUIRED + "  multislice:labels: {<<: {a: x, b: y}, b: z}\n",
    "merge-list": REQUIRED + "  multislice:labels: {b: z, <<: [{a: x, b: y}, {b: w, c: v}]}\n",
    "merge-anchor": "secretsprovider: passphrase\n"
    + REQUIRED
    + "  multislice:labels: &l {a: x}\n  gcp:labels: {<<: *l}\n",
    "alias": REQUIRED + "  multislice:labels: &l {a: x}\n  multislice:other: *l\n",
    "int-key": REQUIRED + "  multislice:labels: {1: x}\n",
    "null-key": REQUIRED + "  multislice:labels: {~: x}\n",
    "date-key": REQUIRED + "  multislice:labels: {2024-01-01: x}\n",
    "bool-key": REQUIRED + "  multislice:labels: {yes: x}\n",
    "top-int-key": REQUIRED + "  1: x\n",
    "conifg": REQUIRED + "conifg:\n  multislice:slices: 2\n",
    "environment": REQUIRED + "environment:\n  - dev-env\n",
    "empty-config": "config:\n",
    "empty-file": "",
    "bom": "\ufeff" + REQUIRED,
    "crlf": REQUIRED.replace("\n", "\r\n"),
    "html": REQUIRED + "  multislice:labels: {a: '<b>&'}\n",
    "nested": REQUIRED + "  multislice:training: {model: {d_model: 1e3, n_heads: 0x4}, steps: 1_000}\n",
    "empty-values": REQUIRED + "  multislice:labels: {a: , b: ~}\n  multislice:slices:\n",
    "unicode": REQUIRED + "  multislice:labels: {caf\u00e9: 'd\u00e9j\u00e0 vu \u2028'}\n",
    "secure": REQUIRED + "  multislice:labels:\n    secure: AAABAG==\n",
}


def cases() -> dict[str, str]:
    """Every stack file of the corpus, by name."""
    out = {
        f"{place}:{scalar}": REQUIRED + template.format(scalar)
        for scalar in SCALARS
        for place, template in PLACES.items()
    }
    out.update({f"structure:{name}": text for name, text in STRUCTURE.items()})
    out.update(
        {f"stack:{path.name}": path.read_text(encoding="utf-8") for path in sorted(STACKS.glob("Pulumi.*.yaml"))}
    )
    return out


def regenerate() -> None:
    """Build the oracle, read :func:`cases` with it and write :data:`READINGS`."""
    corpus = cases()
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": os.environ.get("GOPATH", "/usr/share/gocode")}
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "engine_oracle"
        env.setdefault("GOCACHE", str(Path(scratch) / "cache"))
        subprocess.run(["go", "build", "-o", str(binary), str(ORACLE)], check=True, env=env)
        answer = subprocess.run(
            [str(binary)],
            input=json.dumps([{"name": name, "yaml": text} for name, text in corpus.items()]),
            capture_output=True,
            text=True,
            check=True,
        )
    readings = {item["name"]: {"yaml": corpus[item["name"]], **item} for item in json.loads(answer.stdout)}
    for reading in readings.values():
        del reading["name"]
    READINGS.write_text(json.dumps(readings, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{READINGS}: {len(readings)} stack files", file=sys.stderr)


if __name__ == "__main__":
    regenerate()
