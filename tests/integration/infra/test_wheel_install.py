"""headwater as a tool: the built wheel, installed in a fresh venv, runs a feature repo in a temp folder.

The wheel is built the way ``python -m build`` does it (an sdist from a copy of the checkout, then
the wheel from the unpacked sdist, so MANIFEST.in is proven too) with setuptools' own build
backend, and installed with ``--no-deps`` into a new venv made without pip. The heavy
dependencies (Flink, Spark, torch...) are not installed again: a ``.pth`` file appends the
project venv's site-packages to the new venv's path. That directory holds no ``headwater``
package (the strict editable install is a ``.pth`` naming a tree of links under the checkout's
``build/``, and a ``.pth`` in a directory added by another ``.pth`` is not read), and the test asserts that
every ``headwater`` module the tool imports is the wheel's.

A ``sitecustomize`` in the new venv records every path any of the tool's Python processes opens
for writing (or creates, renames, removes): the test asserts none is inside the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Copied for the sdist: the project, not its build output, services' state or resolved jars.
SKIPPED = {".git", ".venv", "build", "dist", ".headwater", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
SKIPPED_BELOW = {"infra": {"lib", "state"}}

AUDIT = """\
import os
import sys

_LOG = os.environ.get("HW_WRITE_LOG")
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.symlink", "os.link"}


def _start() -> None:
    fd = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(path: object) -> None:
        if isinstance(path, (str, bytes, os.PathLike)):
            os.write(fd, (os.path.abspath(os.fsdecode(path)) + "\\n").encode())

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if (mode and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE:
                record(path)
        elif event in _PATH_EVENTS:
            for path in args[:2]:
                record(path)

    sys.addaudithook(hook)


if _LOG:
    _start()
"""


@dataclass
class Tool:
    """The installed tool: its venv, and how to run its commands in a folder."""

    venv: Path
    env: dict[str, str]
    write_log: Path

    def run(self, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.venv / "bin" / "headwater"), *args]
        done = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, (
            f"{' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
        return done

    def python(self, code: str, cwd: Path) -> str:
        cmd = [str(self.venv / "bin" / "python"), "-c", code]
        done = subprocess.run(cmd, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def written(self) -> list[Path]:
        return [Path(line) for line in self.write_log.read_text(encoding="utf-8").splitlines()]


def _ignore(folder: str, names: list[str]) -> set[str]:
    rel = Path(folder).relative_to(ROOT)
    skipped = SKIPPED | SKIPPED_BELOW.get(str(rel), set()) | {"__pycache__", "target"}
    return {n for n in names if n in skipped or n.endswith(".egg-info")}


def _backend(call: str, cwd: Path, out: Path) -> str:
    code = f"from setuptools import build_meta; print(build_meta.{call}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    shutil.copytree(ROOT, base / "src", ignore=_ignore)
    dist = base / "dist"
    sdist = dist / _backend("build_sdist", base / "src", dist)
    with tarfile.open(sdist) as tar:
        tar.extractall(base / "unpacked", filter="data")
    (unpacked,) = (base / "unpacked").iterdir()
    return dist / _backend("build_wheel", unpacked, dist)


@pytest.fixture(scope="module")
def tool(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Tool:
    base = tmp_path_factory.mktemp("tool")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=300)
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # Only after the install: pip must not see (and replace) the project venv's editable headwater.
    (site / "_headwater_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8"
    )
    (site / "sitecustomize.py").write_text(AUDIT, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEADWATER_", "PYTHON", "VIRTUAL_ENV"))}
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "XDG_CACHE_HOME": str(base / "cache"),  # the tool's default jar folder: nothing shared
        "HW_WRITE_LOG": str(base / "writes.log"),
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",  # the project venv (inside the checkout) stays untouched too
    }
    return Tool(venv, env, base / "writes.log")


@pytest.fixture
def names(kafka_bootstrap: str, redis_url: str) -> Iterator[str]:
    """A unique prefix for the test's topics, consumer group and Redis namespace; all removed after."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from headwater.pipelines.store import OnlineStore

    prefix = f"hwwheel-{uuid.uuid4().hex[:8]}"
    yield prefix
    client = OnlineStore.from_url(redis_url).client
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        client.delete(key)
    try:  # other sessions on this machine restart the shared broker: a missed cleanup is only a warning
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            mine = [t for t in admin.list_topics() if t.startswith(prefix)]
            if mine:
                admin.delete_topics(mine)
        finally:
            admin.close()
    except KafkaError as exc:
        warnings.warn(f"test topics {prefix}* not deleted: {exc}", stacklevel=1)


def payments(prefix: str) -> list[dict[str, object]]:
    """Twelve payments of five accounts at three merchants in the last two minutes, then a bad one."""
    start = datetime.now(UTC) - timedelta(seconds=120)
    rows: list[dict[str, object]] = []
    for i in range(12):
        rows.append({
            "payment_id": f"{prefix}-p{i}", "account_id": f"{prefix}-a{i % 5}",
            "merchant_id": f"{prefix}-m{i % 3}", "method": "card",
            "status": "declined" if i % 4 == 0 else "captured", "amount": 10.0 + i, "currency": "EUR",
            "risk_score": None if i % 2 else 0.1 * (i % 10),
            "occurred_at": (start + timedelta(seconds=5 * i)).isoformat(),
        })  # fmt: skip
    rows.append({**rows[0], "payment_id": f"{prefix}-bad", "amount": -1.0})  # the rule amount >= 0 fails
    return rows


def test_installed_wheel_runs_a_repo_in_a_temp_folder(
    tool: Tool, names: str, kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    # The modules are the wheel's; the data files come from inside it, not from a checkout.
    probe = tool.python(
        "import json, headwater, headwater.cli.main, headwater.pipelines.jvm, headwater.cli.serve\n"
        "from headwater.registry import resources\n"
        "print(json.dumps({'path': list(headwater.__path__), 'files': [headwater.cli.main.__file__,"
        " headwater.pipelines.jvm.__file__, headwater.cli.serve.__file__],"
        " 'checkout': str(resources.checkout_root()), 'examples': str(resources.example_features()),"
        " 'jvm': str(resources.jvm_project())}))",
        cwd=tmp_path,
    )
    found = json.loads(probe)
    site = tool.venv.resolve()
    assert [Path(p).resolve().is_relative_to(site) for p in found["path"]] == [True]
    assert all(Path(f).resolve().is_relative_to(site) for f in found["files"]), found["files"]
    assert found["checkout"] == "None"
    assert (Path(found["examples"]) / "sources.yaml").is_file()
    assert (Path(found["jvm"]) / "maven" / "flink-udfs" / "src").is_dir()
    tool.python(f"open({str(tmp_path / 'probe.txt')!r}, 'w').close()", cwd=tmp_path)
    assert tool.written() == [tmp_path / "probe.txt"]  # the audit hook sees writes, and reads are quiet

    # init: one config file naming the services, the example definitions beside it.
    tool.run("init", "repo", "--kafka-bootstrap", kafka_bootstrap, "--redis-url", redis_url, cwd=tmp_path)
    repo = tmp_path / "repo"
    sources = repo / "features" / "sources.yaml"
    text = sources.read_text(encoding="utf-8")
    for topic in ("events", "payments"):
        text = text.replace(f"    topic: {topic}\n", f"    topic: {names}-{topic}\n")
    sources.write_text(text, encoding="utf-8")

    shown = json.loads(tool.run("config", "--format", "json", cwd=repo / "features").stdout)["values"]
    assert shown == {
        "config_file": str(repo / "headwater.yaml"),
        "root": str(repo),
        "features": str(repo / "features"),
        "state_dir": str(repo / ".headwater"),
        "lake": str(repo / ".headwater" / "lake"),
        "jvm_lib": str(Path(tool.env["XDG_CACHE_HOME"]) / "headwater" / "lib"),
        "kafka.bootstrap": kafka_bootstrap,
        "kafka.dlq_topic": "events.dlq",
        "kafka.partitions": 4,
        "kafka.security": "PLAINTEXT",
        "redis.url": redis_url,
        "redis.eviction": "refuse",
    }

    tool.run("check", cwd=repo)
    applied = tool.run("apply", "--no-feast", cwd=repo)
    plans = repo / ".headwater" / "plans"
    assert sorted(p.name for p in plans.iterdir()) == ["nearline.json", "offline.json", "realtime.json"]
    assert str(plans / "nearline.json") in applied.stdout

    # The jars: Maven on the project inside the wheel, the operator compiled from its Java sources.
    tool.run("setup", "jars", "--offline", cwd=repo, timeout=600)
    listed = tool.python(
        "from headwater.pipelines import jvm; print(*jvm.jars('flink-udfs'), sep='\\n')", cwd=repo
    )
    lib = Path(tool.env["XDG_CACHE_HOME"]) / "headwater" / "lib" / "flink-udfs"
    assert str(lib / "headwater-flink-udfs.jar") in listed.split()

    # One tier against the configured Kafka and Redis: payments from a file, then the nearline tier.
    tool.run("topics", "create", cwd=repo)
    rows = payments(names)
    data = tmp_path / "payments.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    sent = tool.run("events", "produce", "--source", "payments", "--from", str(data), "--rate", "0", cwd=repo)
    counts = json.loads(sent.stdout.strip().splitlines()[-1])
    assert (counts["sent"], counts["rejected"]) == (12, 1), counts
    rejects = Path(counts["rejects"])
    assert rejects.parent == tmp_path  # beside the file, not in the checkout
    assert [json.loads(line)["line"] for line in rejects.read_text(encoding="utf-8").splitlines()] == [13]

    group = f"{names}-nearline"
    tool.run(
        "run", "nearline", "--group", group, "--namespace", names, "--idle-exit", "8", cwd=repo, timeout=300
    )
    stats = json.loads(
        (repo / ".headwater" / "nearline" / group / "stats-0.json").read_text(encoding="utf-8")
    )
    by_topic: dict[str, list[dict[str, object]]] = {}
    for (where, _size), task in zip(stats["state_bytes"].items(), stats["tasks"], strict=True):
        by_topic.setdefault(where.rsplit(":", 1)[0], []).append(task)
    consumed = sum(int(t["offset"] or 0) for t in by_topic[f"{names}-payments"])  # next offset per partition
    assert consumed == 12  # every good row
    merchants = sum(
        int(t["entities"].get("merchant_risk_nearline", 0))  # type: ignore[union-attr]
        for topic, tasks in by_topic.items() if topic != f"{names}-payments" for t in tasks
    )  # fmt: skip
    assert merchants == 3  # behind the repartition by merchant_id: the three merchants

    # The offline tier's landing: Spark with the Delta jars of the tool's cache, into the repo's lake.
    tool.run("run", "landing", "--source", "payments", "--workers", "1", cwd=repo, timeout=600)
    log = repo / ".headwater" / "lake" / "bronze" / "payments" / "_delta_log"
    adds = [
        json.loads(line)["add"]
        for commit in sorted(log.glob("*.json"))
        for line in commit.read_text(encoding="utf-8").splitlines()
        if '"add"' in line
    ]
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == 12  # the good rows, once each

    # Nothing any of the tool's processes wrote is inside the checkout; the plans are in the repo.
    written = tool.written()
    assert [p for p in written if p.is_relative_to(ROOT)] == []
    assert any(p.is_relative_to(plans) for p in written)
