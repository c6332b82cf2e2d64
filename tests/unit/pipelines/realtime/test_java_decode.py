"""The JVM decode (infra/maven/flink-udfs EventDecoder) against the Python codec, on the same bytes.

Runs ``dev.headwater.flink.DecodeCheck`` (a ``java`` process, no Flink) with the decoder config the job
builds from the plan source (:func:`headwater.pipelines.realtime.decode.decoder_config`), for both
example sources (the behaviour events, and payments: micros, enums, a nullable double), over good
events, every kind of bad record the codec names (``oversized`` payloads and strings too, with the
codec's bounds given to both decoders), records written with an older schema version, and seeded or
generated bit flips / truncations, strictly: no known difference is excused. Each record must get
the Python verdict: the reason of ``EventCodec.decode``, then ``future_dated`` for an event further
ahead than the source's ``max_future_ms`` (the tiers' check), and a good one the same field values.

The JVM leaves the source's rules to the job's SQL (``hw_is_false(rule)`` after the decode); here the
rules are applied to the JVM's decoded fields with the registry's evaluator, in the job's order
(decode, rules, future-dated). That the SQL of a rule gives the evaluator's verdict is checked in
Flink by tests/integration/pipelines/realtime/test_realtime_sources.py.
"""

from __future__ import annotations

import io
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import (
    HEADER_PRODUCE_TS,
    HEADER_SCHEMA_FP,
    DecodeError,
    EventCodec,
    wire_schema,
)
from headwater.pipelines.events.generator import EventGenerator, GeneratorConfig
from headwater.pipelines.realtime.decode import decoder_config, event_columns
from headwater.registry.avro import fingerprint
from headwater.registry.expr import from_json
from headwater.registry.expr_eval import compile_rule
from headwater.registry.plans import PlanSchema, PlanSource, read_plan

from .jvm_check import classpath

ROOT = Path(__file__).resolve().parents[4]
NOW_MS = 1_767_225_600_000
Record = tuple[bytes | None, bytes | None, bytes | None]


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PlanSource]:
    state = tmp_path_factory.mktemp("decode_plan") / "state"
    exe = str(Path(sys.executable).parent / "headwater")
    done = subprocess.run([exe, "apply", str(ROOT / "features"), "--state-dir", str(state), "--no-feast"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return {s.name: s for s in read_plan(state, "realtime").sources}


def _java_decode(
    source: PlanSource, records: list[Record], tmp: Path, limits: dict[str, int] | None = None
) -> list[list[str]]:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no `java` on PATH")
    config = tmp / f"{source.name}.json"
    config.write_text(decoder_config(source, **(limits or {})))
    lines = "".join(" ".join("-" if b is None else b.hex() for b in rec) + "\n" for rec in records)
    cmd = [java, "-cp", classpath(), "dev.headwater.flink.DecodeCheck", str(config), str(NOW_MS)]
    # bytes, not text=True: universal newlines would turn a "\r" inside a decoded string into a line break
    done = subprocess.run(cmd, input=lines.encode(), capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return [line.split("\t") for line in done.stdout.decode().split("\n")[:-1]]


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append({"t": "\t", "n": "\n", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _typed(sql_type: str, text: str) -> Any:
    if text == "\\N":
        return None
    if sql_type in ("INT", "BIGINT"):
        return int(text)
    if sql_type == "DOUBLE":
        return float(text)  # Java writes 8.3E19, NaN, Infinity: float() reads each
    if sql_type == "BOOLEAN":
        return text == "true"
    return _unescape(text)


def java_verdict(source: PlanSource, row: list[str]) -> tuple[str, dict[str, Any] | None]:
    """The job's verdict on a DecodeCheck line: decode, then the rules (as the SQL), then future-dated."""
    if row[0] != "ok":
        return row[0], None
    cols = event_columns(source)
    event = {name: _typed(t, text) for (name, t), text in zip(cols, row[2:], strict=True)}
    rules = [compile_rule(from_json(w.ast)) for w in source.rules]
    if not all(holds(event) for holds in rules):
        return "invalid_field", None
    return ("future_dated", None) if row[1] == "future" else ("ok", event)


def python_verdict(codec: EventCodec, record: Record) -> tuple[str, dict[str, Any] | None]:
    """The Python codec's verdict, then the tiers' future-dated check."""
    value, fp, ts = record
    headers = [(k, v) for k, v in ((HEADER_SCHEMA_FP, fp), (HEADER_PRODUCE_TS, ts)) if v is not None]
    result = codec.decode(value, headers)
    if isinstance(result, DecodeError):
        return str(result.reason), None
    if result.event_time_ms > NOW_MS + codec.source.max_future_ms:
        return "future_dated", None
    return "ok", dict(result.event)


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    nan = {k for k, v in a.items() if isinstance(v, float) and math.isnan(v)}
    return a.keys() == b.keys() and all(
        (k in nan and isinstance(b[k], float) and math.isnan(b[k])) or a[k] == b[k] for k in a
    )


def compare(
    source: PlanSource, records: list[Record], tmp: Path, limits: dict[str, int] | None = None
) -> list[str]:
    """Run both decodes; return the verdicts (the mismatches fail the test).

    ``limits`` (``max_event_bytes``, ``max_string_chars``) go to the Python codec and, through
    :func:`decoder_config`, to the JVM decoder: the codec's defaults when None.
    """
    codec = EventCodec(source, **(limits or {}))
    java = _java_decode(source, records, tmp, limits)
    assert len(java) == len(records)
    mismatches, verdicts = [], []
    for i, row in enumerate(java):
        want, got = python_verdict(codec, records[i]), java_verdict(source, row)
        verdicts.append(got[0])
        if want[0] != got[0] or not _same(want[1], got[1]):
            mismatches.append(f"{i}: python {want} java {got} ({row[:2]})"[:600])  # strings may be 64 KiB
    assert not mismatches, "\n".join(mismatches[:8])
    return verdicts


def mutations(rng: random.Random, good: list[bytes], n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        raw = bytearray(rng.choice(good))
        if rng.random() < 0.3:
            raw = raw[: rng.randrange(len(raw))]
        else:
            for _ in range(rng.randint(1, 3)):
                raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        out.append(bytes(raw))
    return out


def behaviour_records(codec: EventCodec) -> list[Record]:
    fp = codec.fingerprint.encode()
    ts = b"1767225600000"
    limit = codec.source.max_future_ms
    config = GeneratorConfig(start_ms=NOW_MS - 600_000, malformed_share=0.0, late_share=0.0)
    events = [dict(e.event) for e in EventGenerator(config).take(300) if e.event is not None]
    good = [codec.encode(e) for e in events]
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
        {**base, "session_id": ""},
        {**base, "event_time": NOW_MS + limit + 1},  # future-dated
        {**base, "event_time": NOW_MS + limit + 1, "dwell_ms": -1},  # a broken rule wins over future-dated
        {**base, "event_time": NOW_MS + limit},  # at the limit: accepted
        {**base, "user_id": "ü" * 128},  # 256 UTF-8 bytes, the default ids.max_bytes: accepted
        {**base, "user_id": "ü" * 128 + "u"},  # 257 bytes: invalid_id (id-too-long)
        {**base, "event_id": "e\x00"},  # NUL: invalid_id (id-has-nul) under the default ids.charset any
    ]
    records: list[Record] = [(v, fp, ts) for v in good]
    records += [(codec.encode(e), fp, ts) for e in bad_fields]
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
    records += [(v, fp, ts) for v in mutations(random.Random(5), good, 400)]
    return records


def test_behaviour_events_decode_in_the_jvm_as_in_python(
    sources: dict[str, PlanSource], tmp_path: Path
) -> None:
    src = sources["events"]
    verdicts = compare(src, behaviour_records(EventCodec(src)), tmp_path)
    # the cases above reach every reason the job's decode gives, and good events decode
    assert set(verdicts) >= {"ok", "missing_fingerprint", "unknown_fingerprint", "invalid_header",
                             "empty_payload", "corrupt_payload", "invalid_field", "future_dated"}  # fmt: skip
    assert verdicts[:300] == ["ok"] * 300
    assert verdicts[312] == "invalid_field"  # dwell_ms -1 and future-dated: the rule first, as in Python


def payment(i: int, **fields: Any) -> dict[str, Any]:
    base = {
        "payment_id": f"p{i}",
        "account_id": f"a{i % 7}",
        "merchant_id": f"m{i % 3}",
        "method": ["card", "wallet", "bank_transfer"][i % 3],
        "status": ["authorized", "captured", "declined", "refunded"][i % 4],
        "amount": 10.0 + i,
        "currency": "EUR",
        "risk_score": None if i % 2 else 0.25,
        "occurred_at": (NOW_MS - 60_000 + i) * 1000,  # micros
    }
    return {**base, **fields}


PAYMENT_FIELDS = st.fixed_dictionaries(
    {
        "payment_id": st.text(max_size=130),
        "account_id": st.text(min_size=0, max_size=3) | st.just("a" * 129),
        "amount": st.floats(allow_nan=True, allow_infinity=True) | st.floats(-5, 5),
        "risk_score": st.none() | st.floats(allow_nan=True) | st.floats(-0.5, 1.5),
        "occurred_at": st.integers(-(2**63), 2**63 - 1)
        | st.integers((NOW_MS - 10**9) * 1000, (NOW_MS + 10**7) * 1000),
        "status": st.sampled_from(["authorized", "captured", "declined", "refunded"]),
    }
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(PAYMENT_FIELDS, min_size=1, max_size=40), seed=st.integers(0, 2**32))
def test_generated_payments_get_the_python_verdict_in_the_jvm(
    sources: dict[str, PlanSource], tmp_path: Path, events: list[dict[str, Any]], seed: int
) -> None:
    src = sources["payments"]
    codec = EventCodec(src)
    fp, ts = codec.fingerprint.encode(), b"1767225600000"
    good = [codec.encode(payment(i, **e)) for i, e in enumerate(events)]
    records: list[Record] = [(v, fp, ts) for v in good]
    records += [(v, fp, ts) for v in mutations(random.Random(seed), good, 40)]
    compare(src, records, tmp_path)


def test_payments_micros_enums_and_rules_in_the_jvm(sources: dict[str, PlanSource], tmp_path: Path) -> None:
    src = sources["payments"]
    codec = EventCodec(src)
    fp, ts = codec.fingerprint.encode(), b"1767225600000"
    limit_us = (NOW_MS + src.max_future_ms) * 1000
    cases = [
        payment(1),
        payment(2, amount=-0.01),  # rule: amount >= 0
        payment(3, risk_score=1.5),  # rule: risk_score in [0, 1]
        payment(4, risk_score=None),  # null: the rule holds
        payment(5, payment_id=""),  # the event id: id-empty (the id policy)
        payment(6, account_id="a" * 257),  # the key: id-too-long (ids.max_bytes 256 by default)
        payment(7, occurred_at=limit_us + 1000),  # 1 ms past the future limit
        payment(8, occurred_at=limit_us + 999),  # the same millisecond as the limit: accepted
        payment(9, occurred_at=src.min_event_time_ms * 1000 - 1),  # before min_event_time
    ]
    verdicts = compare(src, [(codec.encode(e), fp, ts) for e in cases], tmp_path)
    assert verdicts == ["ok", "invalid_field", "invalid_field", "ok", "invalid_id", "invalid_id",
                        "future_dated", "ok", "invalid_field"]  # fmt: skip


def test_bits_past_a_varints_width_get_the_same_verdict_in_both(
    sources: dict[str, PlanSource], tmp_path: Path
) -> None:
    """Java drops them (its int/long shifts them out); Python clears them and reads the same value."""
    src = sources["payments"]
    codec = EventCodec(src)
    fp, ts = codec.fingerprint.encode(), b"1767225600000"
    far = bytearray(codec.encode(payment(1, occurred_at=2**62)))  # a 10-byte long varint, last byte 01
    far[-1] = 0x03  # a bit past 64 bits: found by hypothesis (Python said corrupt, Java invalid_field)
    near = bytearray(codec.encode(payment(2, occurred_at=NOW_MS * 1000)))
    verdicts = compare(src, [(bytes(far), fp, ts), (bytes(near), fp, ts)], tmp_path)
    assert verdicts == ["invalid_field", "ok"]


def test_an_older_schema_version_is_resolved_into_the_current_one(
    sources: dict[str, PlanSource], tmp_path: Path
) -> None:
    """A record written before ``risk_score`` was added (with its default) decodes in both, as null."""
    src = sources["payments"]
    current = json.loads(src.current.json_text)
    old = {**current, "fields": [f for f in current["fields"] if f["name"] != "risk_score"]}
    old_text = json.dumps(old)
    old_fp = fingerprint(old)
    evolved = src.model_copy(
        update={"schemas": [PlanSchema(fingerprint=old_fp, json_text=old_text), src.current]}
    )
    writer = wire_schema(old_text)
    records: list[Record] = []
    for i in range(5):
        buf = io.BytesIO()
        e = payment(i)
        del e["risk_score"]
        fastavro.schemaless_writer(buf, writer, e)
        records.append((buf.getvalue(), old_fp.encode(), None))
    codec = EventCodec(evolved)
    records.append((codec.encode(payment(9)), codec.fingerprint.encode(), None))  # and a current one
    assert compare(evolved, records, tmp_path) == ["ok"] * 6
    assert python_verdict(codec, records[0])[1]["risk_score"] is None  # type: ignore[index]


def test_oversized_payloads_and_strings_are_rejected_alike(
    sources: dict[str, PlanSource], tmp_path: Path
) -> None:
    """Issue 16 item 4: over the codec's bounds (MAX_EVENT_BYTES, MAX_STRING_CHARS), both: ``oversized``."""
    src = sources["events"]
    codec = EventCodec(src)
    fp, ts = codec.fingerprint.encode(), b"1767225600000"
    chars, size = codec.max_string_chars, codec.max_event_bytes
    base = {
        "event_id": "e1", "user_id": "u1", "item_id": None, "event_type": "search", "event_time": NOW_MS,
        "session_id": "s1", "category": None, "price": None, "dwell_ms": None, "query": "q", "position": None,
        "device": "web",
    }  # fmt: skip
    cases = [
        {**base, "query": "q" * chars},  # at the bound: accepted
        {**base, "query": "q" * (chars + 1)},
        {**base, "query": "ü" * chars},  # 4096 characters in 8192 bytes: accepted
        {**base, "query": "ü" * (chars + 1)},
        {**base, "category": "c" * (chars + 1)},  # any string field
        {**base, "session_id": "s" * (chars + 1)},
        {**base, "user_id": "u" * (chars + 1)},  # an id over both bounds: oversized first, as in Python
        {**base, "query": "", "category": "c" * (chars + 1)},  # a broken rule and an oversized string
        {**base, "query": "q" * (size + 1)},  # over the byte bound (and the character bound)
    ]
    records: list[Record] = [(codec.encode(e), fp, ts) for e in cases]
    records.append((b"\xff" * (size + 1), fp, ts))  # garbage over the byte bound: oversized before corrupt
    records.append((b"\xff" * size, fp, ts))  # garbage at the bound: corrupt
    verdicts = compare(src, records, tmp_path)
    assert verdicts == ["ok", "oversized", "ok", "oversized", "oversized", "oversized", "oversized",
                        "oversized", "oversized", "oversized", "corrupt_payload"]  # fmt: skip

    pay = sources["payments"]
    pcodec = EventCodec(pay)
    pfp = pcodec.fingerprint.encode()
    pcases = [
        payment(1, currency="E" * chars),
        payment(2, currency="E" * (chars + 1)),
        payment(3, merchant_id="m" * (chars + 1)),
        payment(4, payment_id="p" * (chars + 1)),  # the event id: oversized, not invalid_field
        payment(5, amount=-1.0, merchant_id="m" * (chars + 1)),  # a broken rule too: oversized first
        payment(6, currency="E" * (size + 1)),
    ]
    pverdicts = compare(pay, [(pcodec.encode(e), pfp, ts) for e in pcases], tmp_path)
    assert pverdicts == ["ok", "oversized", "oversized", "oversized", "oversized", "oversized"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_string_chars=st.integers(1, 60),
    max_event_bytes=st.integers(40, 200),
    texts=st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=30),
)
def test_the_bounds_given_to_the_codec_reach_the_jvm(
    sources: dict[str, PlanSource],
    tmp_path: Path,
    max_string_chars: int,
    max_event_bytes: int,
    texts: list[str],
) -> None:
    """Other bounds than the defaults: the JVM gets them from decoder_config, not constants of its own."""
    limits = {"max_event_bytes": max_event_bytes, "max_string_chars": max_string_chars}
    src = sources["payments"]
    codec = EventCodec(src)
    fp, ts = codec.fingerprint.encode(), b"1767225600000"
    events = [payment(i, currency=t) for i, t in enumerate(texts)]
    events += [payment(100 + i, merchant_id=t) for i, t in enumerate(texts)]
    compare(src, [(codec.encode(e), fp, ts) for e in events], tmp_path, limits)
