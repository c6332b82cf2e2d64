"""The first tutorial, run as written: docs/tutorials/your-event-stream.md cannot rot.

The page's fenced blocks are the test's script, in page order:

- a block with a ``title="PATH"`` is a file the reader creates in the current folder (a title
  ending in ``(add at the end)`` appends to the file ``headwater init`` made);
- a ```` ```console ```` block holds commands (``$ ...``), each followed by the output the page shows;
  every shown line must appear in the command's output, in order, ``...`` standing for any text
  (a line of only ``...``: any lines);
- a ```` ```bash ```` block is commands only, one a line.

Each command runs with ``bash`` against the session's Kafka and Redis (``HEADWATER_*`` variables
name them), in a temporary folder, with the project's ``headwater`` first on ``PATH``. Two things
are renamed so that runs never share state on the shared broker: every topic of the repo's
``sources.yaml`` and the dead-letter topic get a per-run prefix, and so does the consumer group the
page names (``shop-nearline``). Then the values read back must be what the page's orders imply.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "tutorials" / "your-event-stream.md"
VIEW = "customer_orders_nearline"
GROUP = "shop-nearline"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
TITLE = re.compile(r'title="([^"]+)"')
APPEND = "(add at the end)"
TOPIC_LINE = re.compile(r"^(\s*(?:-\s+)?topic:\s+)(\S+)", re.M)


@dataclass
class Step:
    """One thing the reader does: write (or append to) a file, or run a command."""

    command: str | None = None
    shown: list[str] = field(default_factory=list)
    path: str | None = None
    content: str = ""
    append: bool = False


def page_steps(markdown: str) -> list[Step]:
    """Return the page's files and commands in order (see the module docstring)."""
    steps: list[Step] = []
    for lang, info, body in FENCE.findall(markdown):
        title = TITLE.search(info)
        if title:
            path = title.group(1).split()[0]
            steps.append(Step(path=path, content=body, append=APPEND in title.group(1)))
        elif lang == "console":
            for line in body.splitlines():
                if line.startswith("$ "):
                    steps.append(Step(command=line[2:].strip()))
                elif steps and steps[-1].command is not None and line.strip():
                    steps[-1].shown.append(line.rstrip())
        elif lang in ("bash", "sh", "shell"):
            steps.extend(
                Step(command=line.strip())
                for line in body.splitlines()
                if line.strip() and not line.startswith("#")
            )
    return steps


def assert_shown(step: Step, output: str) -> None:
    """Every line the page shows for ``step`` is in ``output``, in order (``...`` = any text)."""
    lines = output.splitlines()
    at = 0
    for shown in step.shown:
        if shown.strip() == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in shown.split("...")))
        while at < len(lines) and not pattern.fullmatch(lines[at].rstrip()):
            at += 1
        assert at < len(lines), f"`{step.command}` did not print {shown!r}; it printed:\n{output}"
        at += 1


@dataclass
class Run:
    """The reader's shell: a current folder and the environment the commands see."""

    cwd: Path
    env: dict[str, str]
    prefix: str

    def command(self, step: Step) -> str:
        assert step.command is not None
        words = shlex.split(step.command)
        if words[0] == "cd":
            self.cwd = (self.cwd / words[1]).resolve()
            return ""
        command = step.command.replace(f"--group {GROUP}", f"--group {self.prefix}-nearline")
        done = subprocess.run(
            ["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=600
        )
        output = done.stderr + done.stdout  # a command's JSON summary is its stdout's last line
        assert done.returncode == 0, f"`{step.command}` exited {done.returncode}:\n{output}"
        assert_shown(step, output)
        self.isolate_topics()
        return done.stdout

    def write(self, step: Step) -> None:
        assert step.path is not None
        path = self.cwd / step.path
        if step.append:
            assert path.is_file(), f"{step.path}: the page adds to it, but `headwater init` did not make it"
            with path.open("a", encoding="utf-8") as out:
                out.write(step.content)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(step.content, encoding="utf-8")
        self.isolate_topics()

    def isolate_topics(self) -> None:
        """Give every topic of the repo's sources the run's prefix (idempotent)."""
        sources = self.cwd / "features" / "sources.yaml"
        if not sources.is_file():
            return
        text = sources.read_text(encoding="utf-8")
        renamed = TOPIC_LINE.sub(
            lambda m: (
                m.group(0)
                if m.group(2).startswith(self.prefix)
                else f"{m.group(1)}{self.prefix}-{m.group(2)}"
            ),
            text,
        )
        if renamed != text:
            sources.write_text(renamed, encoding="utf-8")


def expected_values(steps: list[Step]) -> dict[str, dict[str, float] | None]:
    """What the page's orders imply per customer: paid orders, their sum and largest, over the hour.

    The page's source declares the rule ``amount >= 0`` (a failing row is rejected) and
    ``event_id`` as the event's identity (a duplicate counts once); every order of the file lies
    in the last hour once shifted to now.
    """
    source = next(s for s in steps if s.path == "features/sources.yaml")
    assert 'rules: ["amount >= 0"]' in source.content
    assert "event_id: event_id" in source.content
    rows = [
        json.loads(line) for line in next(s for s in steps if s.path == "orders.jsonl").content.splitlines()
    ]
    seen: set[str] = set()
    paid: dict[str, list[float]] = {row["customer_id"]: [] for row in rows}
    for row in rows:
        if row["amount"] < 0 or row["event_id"] in seen:
            continue
        seen.add(row["event_id"])
        if row["status"] == "paid":
            paid[row["customer_id"]].append(row["amount"])
    return {
        customer: (
            {
                "paid_orders_1h": float(len(amounts)),
                "spend_1h": sum(amounts),
                "largest_order_1h": max(amounts),
            }
            if amounts
            else None
        )
        for customer, amounts in paid.items()
    }


@pytest.fixture
def run(kafka_bootstrap: str, redis_url: str, tmp_path: Path) -> Iterator[Run]:
    prefix = f"hwdocs-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        HEADWATER_KAFKA_BOOTSTRAP=kafka_bootstrap,
        HEADWATER_REDIS_URL=redis_url,
        HEADWATER_DLQ_TOPIC=f"{prefix}-dlq",
    )
    yield Run(tmp_path, env, prefix)
    cleanup(prefix, kafka_bootstrap, redis_url)


def cleanup(prefix: str, kafka_bootstrap: str, redis_url: str) -> None:
    """Remove the run's topics, consumer group and online values."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from headwater.pipelines.store import OnlineStore

    client = OnlineStore.from_url(redis_url).client
    for key in client.scan_iter(match=f"*{VIEW}*", count=1000):
        client.delete(key)
    try:
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            mine = [t for t in admin.list_topics() if t.startswith(prefix)]
            if mine:
                admin.delete_topics(mine)
            admin.delete_groups([f"{prefix}-nearline"])
        finally:
            admin.close()
    except KafkaError as exc:  # other sessions restart the shared broker: a missed cleanup only warns
        warnings.warn(f"test topics {prefix}* not deleted: {exc}", stacklevel=1)


def test_the_first_tutorial_runs_as_written_and_its_values_are_what_the_orders_imply(run: Run) -> None:
    steps = page_steps(PAGE.read_text(encoding="utf-8"))
    commands = [s.command for s in steps if s.command is not None]
    for needed in ("headwater init", "headwater check", "headwater apply", "headwater topics create",
                   "headwater events produce", "headwater run nearline", "headwater online get"):  # fmt: skip
        assert any(c.startswith(needed) for c in commands), f"the tutorial lost its `{needed}` step"

    outputs: dict[str, str] = {}
    for step in steps:
        if step.command is not None:
            outputs[step.command] = run.command(step)
        else:
            run.write(step)

    produce = next(c for c in commands if c.startswith("headwater events produce"))
    counts: dict[str, Any] = json.loads(outputs[produce].strip().splitlines()[-1])
    expected = expected_values(steps)
    rows = next(s for s in steps if s.path == "orders.jsonl").content.splitlines()
    assert (counts["read"], counts["sent"], counts["rejected"]) == (len(rows), len(rows) - 1, 1), counts
    assert counts["topic"] == f"{run.prefix}-orders"

    read = run.command(Step(command=f"headwater online get {VIEW} {' '.join(expected)} --format json"))
    got = {row["entity"]: row for row in json.loads(read)["rows"]}
    assert set(got) == set(expected)
    for customer, values in expected.items():
        if values is None:
            assert not got[customer]["found"], got[customer]
            continue
        assert got[customer]["found"], f"{customer}: no online value"
        assert got[customer]["values"] == pytest.approx(values), customer
        assert 0 <= got[customer]["age_s"] <= 600  # within the view's freshness_sla, PT10M
    assert expected["alice"] == {"paid_orders_1h": 2.0, "spend_1h": 42.5, "largest_order_1h": 30.0}
