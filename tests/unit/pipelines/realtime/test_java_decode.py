"""The JVM decode (infra/maven/flink-udfs EventDecoder) against the Python codec, on the same bytes.

Runs ``dev.headwater.flink.DecodeCheck`` (a ``java`` process, no Flink) over good events, every
kind of bad record the codec names, and seeded bit flips / truncations of good payloads; each
record must get the same reason, and a good one the same field values.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from headwater.pipelines import jvm
from headwater.pipelines.events.codec import HEADER_PRODUCE_TS, HEADER_SCHEMA_FP, EventCodec
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.realtime.decode import EVENT_COLUMNS, decode_batch

NOW_MS = 1_767_225_600_000
MAX_FUTURE_MS = 60_000

PRICE = 1 + [name for name, _ in EVENT_COLUMNS].index("price")
Record = tuple[bytes | None, bytes | None, bytes | None]


def _classpath() -> str:
    """The functions' jars plus PyFlink's own (Avro logs through the slf4j that Flink ships)."""
    try:
        ours = jvm.jars("flink-udfs")
    except jvm.MissingJarsError as exc:
        pytest.skip(f"the JVM decode is not built here: {exc}")
    spec = importlib.util.find_spec("pyflink")
    assert spec is not None, "pyflink is a dependency of headwater"
    assert spec.origin is not None
    flink = sorted((Path(spec.origin).parent / "lib").glob("*.jar"))
    return ":".join(str(j) for j in [*ours, *flink])


def _java_decode(codec: EventCodec, records: list[Record]) -> list[list[str]]:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no `java` on PATH")
    lines = "".join(" ".join("-" if b is None else b.hex() for b in rec) + "\n" for rec in records)
    cmd = [java, "-cp", _classpath(), "dev.headwater.flink.DecodeCheck", str(codec.schema.path),
           codec.fingerprint, str(MAX_FUTURE_MS), str(NOW_MS)]  # fmt: skip
    # bytes, not text=True: universal newlines would turn a "\r" inside a decoded string into a line break
    done = subprocess.run(cmd, input=lines.encode(), capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return [line.split("\t") for line in done.stdout.decode().split("\n")[:-1]]


def _negative_index(java_row: list[str]) -> bool:
    """A union or enum index < 0: corrupt for Avro (and the JVM decode).

    fastavro indexes its branch list with it, Python-style (-1 = the last branch), so the Python
    codec may read such a payload as a (mostly then invalid) event: the one known difference.
    """
    return java_row[0] == "corrupt_payload" and "IndexOutOfBoundsException: Index -" in java_row[1]


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def _python_row(cols: dict[str, list[Any]], i: int) -> list[str]:
    reason = cols["reason"][i]
    if reason is not None:
        return [reason]
    out = ["ok"]
    for name, _ in EVENT_COLUMNS:
        v = cols[name][i]
        text = str(v)
        out.append(
            "\\N" if v is None else text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
        )
    return out


def _records(codec: EventCodec) -> list[Record]:
    fp = codec.fingerprint.encode()
    ts = b"1767225600000"
    config = GeneratorConfig(start_ms=NOW_MS - 600_000, malformed_share=0.0, late_share=0.0)
    events = [dict(e.event) for e in EventGenerator(config).take(300) if e.event is not None]
    good = [codec.encode(e) for e in events]  # type: ignore[arg-type]
    base = {**events[0], "event_type": "click", "item_id": "i1", "query": None, "dwell_ms": None}
    bad_fields = [
        {**base, "event_id": ""},
        {**base, "user_id": "u" * 129},
        {**base, "event_time": 100},
        {**base, "item_id": None},
        {**base, "event_type": "search", "item_id": None, "query": ""},
        {**base, "event_type": "dwell"},
        {**base, "dwell_ms": -1},
        {**base, "price": -2.5},
        {**base, "price": float("nan")},
        {**base, "position": 0},
        {**base, "event_time": NOW_MS + MAX_FUTURE_MS + 1},  # future-dated
        {**base, "event_time": NOW_MS + MAX_FUTURE_MS},  # at the limit: accepted
        {**base, "user_id": "ü" * 128},  # 128 characters (256 UTF-8 bytes): accepted
    ]
    records: list[Record] = [(v, fp, ts) for v in good]
    records += [(codec.encode(e), fp, ts) for e in bad_fields]  # type: ignore[arg-type]
    records += [
        (good[0], None, ts),  # missing fingerprint
        (good[0], b"0123456789abcdef", ts),  # unknown fingerprint
        (good[0], fp, b"12a"),  # invalid produce-ts
        (good[0], fp, b""),
        (good[0], fp, b"1" * 17),
        (good[0], fp, None),  # produce-ts is optional
        (b"", fp, ts),  # empty payload
        (None, fp, ts),
        (b"\x00\xff not avro", fp, ts),
        (good[0] + b"\x00", fp, ts),  # a trailing byte
    ]
    rng = random.Random(5)
    for _ in range(400):
        raw = bytearray(rng.choice(good))
        if rng.random() < 0.3:
            raw = raw[: rng.randrange(len(raw))]
        else:
            for _ in range(rng.randint(1, 3)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        records.append((bytes(raw), fp, ts))
    return records


def test_java_decode_gives_the_python_codecs_reasons_and_values() -> None:
    codec = EventCodec()
    records = _records(codec)
    java = _java_decode(codec, records)
    headers = [
        {k: v for k, v in ((HEADER_SCHEMA_FP, fp), (HEADER_PRODUCE_TS, ts)) if v is not None}
        for _, fp, ts in records
    ]
    for row in java:  # the price as Python writes a float (Java writes 8.3E19 for 8.3e+19)
        if row[0] == "ok" and row[PRICE] != "\\N":
            row[PRICE] = str(float(row[PRICE]))
    py = decode_batch(codec, [v for v, _, _ in records], headers, MAX_FUTURE_MS, now_ms=NOW_MS).columns
    assert len(java) == len(records)
    mismatches = []
    for i, got in enumerate(java):
        want = _python_row(py, i)
        have = got if got[0] == "ok" else got[:1]
        if have != want and not _negative_index(got):
            mismatches.append((i, records[i][0], want, got))
    assert not mismatches, "\n".join(f"{i}: python {w} java {g}" for i, _, w, g in mismatches[:8])
    reasons = {row[0] for row in java}
    # the cases above reach every reason the decode gives, and good events decode
    assert reasons >= {"ok", "missing_fingerprint", "unknown_fingerprint", "invalid_header",
                       "empty_payload", "corrupt_payload", "invalid_field", "future_dated"}  # fmt: skip
    assert sum(row[0] == "ok" for row in java[:300]) == min(300, len(java[:300]))
