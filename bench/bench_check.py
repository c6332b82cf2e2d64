"""Benchmark `headwater check` on a generated repo of 1,000 feature views (target: under 2 s).

The views are the example repo's twelve views, renamed and repeated, so each one is realistic
(4-6 features, filters, ratios, top_k) and passes check. Prints the figures and writes
bench/results/check.json.

    .venv/bin/python bench/bench_check.py [--views 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from headwater.registry.validate import check_repo
from headwater.registry.yamlsrc import parser_name

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "features"
RESULTS = ROOT / "bench" / "results" / "check.json"
TARGET_S = 2.0


def generate(root: Path, views: int) -> None:
    """Write a repo of ``views`` views into ``root`` (budget raised so that it passes)."""
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "entities.yaml", root / "entities.yaml")
    shutil.copy(EXAMPLE / "sources.yaml", root / "sources.yaml")
    shutil.copytree(EXAMPLE / "schemas", root / "schemas")
    (root / "budget.yaml").write_text("tiers:\n  realtime: 1.0e9\n  nearline: 1.0e9\n  offline: 1.0e9\n")
    templates = sorted(
        p for p in EXAMPLE.glob("*.yaml") if p.name not in ("entities.yaml", "sources.yaml", "budget.yaml")
    )
    texts = [(p.stem, p.read_text()) for p in templates]
    for i in range(views):
        name, text = texts[i % len(texts)]
        new = f"{name}_{i:04d}"
        folder = root / f"team_{i % 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"{new}.yaml").write_text(text.replace(f"feature_view: {name}", f"feature_view: {new}"))


def time_in_process(root: Path, repeats: int) -> tuple[list[float], int, int]:
    runs = []
    views = errors = 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = check_repo(root)
        runs.append(time.perf_counter() - start)
        views, errors = len(result.views), len(result.diagnostics.errors)
    return runs, views, errors


def time_cli(root: Path, repeats: int) -> tuple[list[float], int]:
    script = Path(sys.executable).with_name("headwater")
    runs = []
    code = 0
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(
            [str(script), "check", str(root), "--format", "json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        runs.append(time.perf_counter() - start)
        code = proc.returncode
    return runs, code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "features"
        generate(root, args.views)
        in_proc, views, errors = time_in_process(root, args.repeats)
        cli, exit_code = time_cli(root, max(1, args.repeats // 2))
        os.environ["HEADWATER_YAML_PARSER"] = "ruamel"
        ruamel, _, _ = time_in_process(root, 1)
        del os.environ["HEADWATER_YAML_PARSER"]
    figures = {
        "benchmark": "check",
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "views": views,
        "errors": errors,
        "yaml_parser": parser_name(),
        "in_process_s": {
            "first": round(in_proc[0], 3),
            "median": round(statistics.median(in_proc), 3),
            "runs": [round(r, 3) for r in in_proc],
        },
        "cli_end_to_end_s": {
            "median": round(statistics.median(cli), 3),
            "runs": [round(r, 3) for r in cli],
            "exit_code": exit_code,
        },
        "in_process_ruamel_only_s": round(ruamel[0], 3),
        "target_s": TARGET_S,
        "meets_target": statistics.median(cli) < TARGET_S,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"check on {views} views ({errors} errors), YAML via {figures['yaml_parser']}:")
    print(f"  in-process: first {in_proc[0]:.3f} s, median {statistics.median(in_proc):.3f} s")
    print(
        f"  CLI end to end (headwater check --format json): median {statistics.median(cli):.3f} s, "
        f"exit {exit_code}"
    )
    print(f"  in-process with the pure-Python ruamel composer: {ruamel[0]:.3f} s")
    print(f"  target < {TARGET_S} s: {'met' if figures['meets_target'] else 'MISSED'}; wrote {RESULTS}")


if __name__ == "__main__":
    main()
