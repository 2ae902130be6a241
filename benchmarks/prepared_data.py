"""Prepared datasets, measured in one run (the targets of the token-dataset work):

1. ``prepare`` throughput (tokens/s) with a Hugging Face tokenizer file against ``tokenizers``'
   own batch encoding of the same text in the same process (``encode_batch_fast`` of every
   file's text at once, all in memory, nothing read or written): target ratio ≥ 0.7. The
   tokenizer is a byte-level BPE of ``--vocab`` tokens trained on the corpus first (not timed);
   the corpus is the Python standard library's ``*.py`` files (``stdlib``, ~30 MB);
2. peak memory (max RSS) of ``python -m training data prepare`` in a child process on corpora of
   1× and ``--scale``× that text (copies of it), with shards of ``--shard-mb`` MB of text, so the
   larger corpus is tens of shards: target bounded (the larger corpus's peak within 1.25× of the
   smaller's);
3. the trainer's input time per step with a prepared dataset on the emulated Cloud Storage
   (fake-gcs-server: ranged reads over HTTP, as from a bucket) against its step time: the time
   the training loop waits in ``TokenDataset.train_rows`` (prefetched: the wait for reads the
   prefetch did not finish) ÷ the median ``step_time_s``; target ≤ 5 %. A small model (d_model
   64, 2 layers; the default batch of 32 × 256 tokens) trains ``--steps`` steps in one process
   on the BPE dataset; the time a read takes without prefetch (``_read_train`` itself) and its
   share of the step are printed too.

    uv run --frozen python benchmarks/prepared_data.py [--vocab 8192] [--scale 3] [--shard-mb 4] [--steps 20] [--json]

The machine's load average is printed with the figures: on a shared machine, compare runs at
similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.data.files import SourceFile, list_source_files  # noqa: E402
from training.prepare import shards as prepare, tokenizer as tokenizer_lib  # noqa: E402

TARGET_THROUGHPUT_RATIO = 0.7
TARGET_MEMORY_RATIO = 1.25
TARGET_INPUT_FRACTION = 0.05


def corpus_files() -> list[SourceFile]:
    return list_source_files("stdlib")


def throughput(tmp: Path, vocab: int) -> dict:
    files = corpus_files()
    texts = [Path(f.path).read_bytes() for f in files]
    trained = tokenizer_lib.train_bpe((t.decode("utf-8", errors="replace") for t in texts), vocab)
    assert trained.json is not None
    tokenizer_file = tmp / "tokenizer.json"
    tokenizer_file.write_bytes(trained.json)
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tokenizer_file))
    decoded = [t.decode("utf-8", errors="replace") for t in texts]
    hf.encode_batch_fast(decoded[:50], add_special_tokens=False)  # warm the thread pool
    began = time.perf_counter()
    encodings = hf.encode_batch_fast(decoded, add_special_tokens=False)
    baseline_s = time.perf_counter() - began
    baseline_tokens = sum(len(e.ids) for e in encodings)
    del encodings
    spec = prepare.PrepareSpec("stdlib", str(tmp / "prepared"), tokenizer=str(tokenizer_file), shard_mb=16)
    began = time.perf_counter()
    result = prepare.prepare(spec, report=lambda line: None)
    prepare_s = time.perf_counter() - began
    tokens = result.manifest.splits["train"].tokens + result.manifest.splits["eval"].tokens
    ratio = (tokens / prepare_s) / (baseline_tokens / baseline_s)
    return {
        "text_mb": round(sum(map(len, texts)) / 1e6, 1),
        "baseline_tokens": baseline_tokens,
        "baseline_s": round(baseline_s, 3),
        "baseline_tokens_per_s": round(baseline_tokens / baseline_s),
        "prepare_tokens": tokens,
        "prepare_s": round(prepare_s, 3),
        "prepare_tokens_per_s": round(tokens / prepare_s),
        "ratio": round(ratio, 3),
        "target": f">= {TARGET_THROUGHPUT_RATIO}",
        "pass": ratio >= TARGET_THROUGHPUT_RATIO,
        "tokenizer_file": str(tokenizer_file),
    }


def peak_rss_mb(source: str, output: Path, tokenizer_file: str, shard_mb: float) -> tuple[float, int]:
    """Max RSS (MB) of a child ``python -m training data prepare``, and its shard count."""
    script = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    command = [sys.executable, "-m", "training", "data", "prepare", source, str(output)]
    command += ["--tokenizer", tokenizer_file, "--shard-mb", str(shard_mb)]
    out = subprocess.run(
        [sys.executable, "-c", script, *command], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    shards = len(list(output.glob("*/*.bin")))
    return int(out.split()[-1]) / 1024, shards  # ru_maxrss is in KiB on Linux


def memory(tmp: Path, tokenizer_file: str, scale: int, shard_mb: float) -> dict:
    files = corpus_files()
    small, large = tmp / "small", tmp / "large"
    for copy in range(scale):
        for f in files:
            target = large / str(copy) / f.relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f.path, target)
            if copy == 0:
                (small / f.relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f.path, small / f.relative)
    small_mb, small_shards = peak_rss_mb(f"{small}/**/*.py", tmp / "out-small", tokenizer_file, shard_mb)
    large_mb, large_shards = peak_rss_mb(f"{large}/**/*.py", tmp / "out-large", tokenizer_file, shard_mb)
    ratio = large_mb / small_mb
    text_mb = sum(f.size for f in files) / 1e6
    return {
        "shard_mb": shard_mb,
        "small": {"text_mb": round(text_mb, 1), "shards": small_shards, "peak_rss_mb": round(small_mb, 1)},
        "large": {"text_mb": round(text_mb * scale, 1), "shards": large_shards, "peak_rss_mb": round(large_mb, 1)},
        "ratio": round(ratio, 3),
        "target": f"<= {TARGET_MEMORY_RATIO}",
        "pass": ratio <= TARGET_MEMORY_RATIO,
    }


def input_time(tmp: Path, tokenizer_file: str, steps: int) -> dict:
    from infra.emulated.gcs import GcsServer
    from infra.emulated.gcs_clients import point_clients_at
    from training import train
    from training.cluster import ClusterIdentity
    from training.config import CheckpointConfig, TrainConfig
    from training.data.tokens import TokenDataset
    from training.metrics.run_log import read_records
    from training.run_dir import RunDir

    server = GcsServer(tmp / "gcs", tmp / "gcs.log")
    server.start()
    restore = point_clients_at(server.url)
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        server.create_bucket(bucket)
        root = f"gs://{bucket}/datasets/stdlib"
        prepare.prepare(
            prepare.PrepareSpec("stdlib", root, tokenizer=tokenizer_file, shard_mb=16), report=lambda _: None
        )
        config = TrainConfig.model_validate(
            {
                # A small model: a short step makes the input's share visible (the default model's
                # step takes seconds on a CPU, next to which any read is negligible).
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "compute_dtype": "float32"},
                "steps": steps,
                "data": {"source": root},
            }
        )
        config = config.model_copy(update={"checkpoint": CheckpointConfig(interval_steps=steps + 1)})
        waits: list[float] = []
        reads: list[float] = []
        real_rows, real_read = TokenDataset.train_rows, TokenDataset._read_train

        def timed_rows(self, *args):
            began = time.perf_counter()
            rows = real_rows(self, *args)
            waits.append(time.perf_counter() - began)
            return rows

        def timed_read(self, *args):
            began = time.perf_counter()
            rows = real_read(self, *args)
            reads.append(time.perf_counter() - began)
            return rows

        TokenDataset.train_rows, TokenDataset._read_train = timed_rows, timed_read  # type: ignore[method-assign]
        try:
            result = train.run(config, f"gs://{bucket}/runs/bench", ClusterIdentity.single_process())
            assert result.exit_code == train.EXIT_COMPLETE, result
            records = read_records(RunDir(f"gs://{bucket}/runs/bench"), "metrics")
        finally:
            TokenDataset.train_rows, TokenDataset._read_train = real_rows, real_read  # type: ignore[method-assign]
    finally:
        restore()
        server.stop()
    step_s = statistics.median([r["step_time_s"] for r in records if "step_time_s" in r][1:])
    wait_s = statistics.median(waits[1:])  # step 0 is read before anything could be prefetched
    fraction = wait_s / step_s
    return {
        "steps": steps,
        "rows_per_step": config.global_batch_size,
        "median_step_s": round(step_s, 4),
        "median_input_wait_s": round(wait_s, 6),
        "max_input_wait_s": round(max(waits[1:]), 6),
        "median_read_s_without_prefetch": round(statistics.median(reads), 4),
        "fraction_without_prefetch": round(statistics.median(reads) / step_s, 4),
        "fraction": round(fraction, 4),
        "target": f"<= {TARGET_INPUT_FRACTION}",
        "pass": fraction <= TARGET_INPUT_FRACTION,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--vocab", type=int, default=8192, help="tokens of the BPE the corpus is encoded with")
    parser.add_argument("--scale", type=int, default=3, help="copies of the corpus in the larger memory run")
    parser.add_argument("--shard-mb", type=float, default=4.0, help="MB of text per shard in the memory runs")
    parser.add_argument("--steps", type=int, default=20, help="training steps of the input-time run")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only-input", action="store_true", help="measure 3 alone (tokenizer trained, untimed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="prepared-data-") as name:
        tmp = Path(name)
        results = {"load_average": os.getloadavg(), "cpus": os.cpu_count()}
        if args.only_input:
            trained = tokenizer_lib.train_bpe(
                (Path(f.path).read_text(errors="replace") for f in corpus_files()), args.vocab
            )
            assert trained.json is not None
            tokenizer_file = str(tmp / "tokenizer.json")
            Path(tokenizer_file).write_bytes(trained.json)
        else:
            results["throughput"] = throughput(tmp, args.vocab)
            tokenizer_file = results["throughput"].pop("tokenizer_file")
            results["memory"] = memory(tmp, tokenizer_file, args.scale, args.shard_mb)
        results["input"] = input_time(tmp, tokenizer_file, args.steps)
    results["self_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    parts = [key for key in ("throughput", "memory", "input") if key in results]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"load average {results['load_average']}, {results['cpus']} CPUs")
        report(results)
    return 0 if all(results[key]["pass"] for key in parts) else 1


def report(results: dict) -> None:
    verdict = {key: "PASS" if value["pass"] else "FAIL" for key, value in results.items() if isinstance(value, dict)}
    if "throughput" in results:
        t, m = results["throughput"], results["memory"]
        print(
            f"1. prepare {t['prepare_tokens_per_s']:,} tokens/s vs encode_batch_fast {t['baseline_tokens_per_s']:,} "
            f"tokens/s on {t['text_mb']} MB: ratio {t['ratio']} (target {t['target']}) {verdict['throughput']}"
        )
        print(
            f"2. prepare peak RSS {m['small']['peak_rss_mb']} MB on {m['small']['text_mb']} MB ({m['small']['shards']} "
            f"shards) vs {m['large']['peak_rss_mb']} MB on {m['large']['text_mb']} MB ({m['large']['shards']} shards): "
            f"ratio {m['ratio']} (target {m['target']}) {verdict['memory']}"
        )
    i = results["input"]
    print(
        f"3. input wait {i['median_input_wait_s'] * 1e3:.2f} ms/step (max {i['max_input_wait_s'] * 1e3:.1f} ms) "
        f"vs step "
        f"{i['median_step_s']:.3f} s: {i['fraction']:.2%} (target {i['target']}) {verdict['input']}; without "
        f"prefetch a read takes {i['median_read_s_without_prefetch'] * 1e3:.1f} ms, "
        f"{i['fraction_without_prefetch']:.1%} of the step"
    )


if __name__ == "__main__":
    sys.exit(main())
