"""The realtime tier's JVM decode applies the source's id policy with the Python codec's reason and text.

``dev.headwater.flink.DecodeCheck`` (EventDecoder, no Flink) runs on the same bytes as
:class:`~headwater.pipelines.events.codec.EventCodec`, under the default policy and under
``printable`` with a small ``max_bytes``: every record gets the same reason and, for ``invalid_id``,
the same detail (the dead letter's ``dlq-detail``), character for character.
"""

from __future__ import annotations

import shutil
import subprocess
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.pipelines.events.codec import DecodeError, EncodeError, EventCodec
from headwater.pipelines.events.schema import behavior_source
from headwater.pipelines.offline.testing import T0, event
from headwater.pipelines.realtime.decode import decoder_config
from headwater.registry.plans import PlanSource

from .jvm_check import classpath

CONTROLS = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]


def java_reasons(source: PlanSource, values: list[bytes], tmp: Path) -> list[tuple[str, str]]:
    java = shutil.which("java")
    if java is None:
        pytest.skip("no `java` on PATH")
    config = tmp / "ids.json"
    config.write_text(decoder_config(source))
    codec = EventCodec(source)
    fp, ts = codec.fingerprint.encode().hex(), b"1767225600000".hex()
    lines = "".join(f"{v.hex()} {fp} {ts}\n" for v in values)
    cmd = [java, "-cp", classpath(), "dev.headwater.flink.DecodeCheck", str(config), str(T0 + 60_000)]
    done = subprocess.run(cmd, input=lines.encode(), capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    rows = [line.split("\t") for line in done.stdout.decode().split("\n")[:-1]]
    return [(r[0], r[1] if r[0] != "ok" else "") for r in rows]


def python_reasons(source: PlanSource, values: list[bytes]) -> list[tuple[str, str]]:
    codec = EventCodec(source)
    out = []
    for v in values:
        got = codec.decode(v, codec.headers(1_767_225_600_000))
        out.append((str(got.reason), got.detail) if isinstance(got, DecodeError) else ("ok", ""))
    return out


def ids_cases() -> list[dict[str, Any]]:
    base = event(1, "u1", "click", T0, item_id="i1")
    return [
        base,
        {**base, "user_id": "u" * 33},
        {**base, "user_id": "ü" * 16},  # 32 bytes: at the limit
        {**base, "user_id": "ü" * 16 + "u"},  # 33 bytes
        {**base, "user_id": "bad\x07user"},
        {**base, "user_id": "用户\x1b[31m"},  # the index counts characters, not bytes or UTF-16 units
        {**base, "user_id": "🙂🙂\u202e"},  # astral characters before a bidi override
        {**base, "event_id": "e\x00"},
        {**base, "event_id": ""},
        {**base, "event_id": "a\u2028b"},
        {**base, "user_id": "naïve 🙂 ok"},
        *({**base, "user_id": f"x{c}y"} for c in CONTROLS),
    ]


@pytest.mark.parametrize(("charset", "max_bytes"), [("printable", 32), ("any", 256), ("any", 8)])
def test_the_jvm_writes_the_python_reason_and_text(charset: str, max_bytes: int, tmp_path: Path) -> None:
    source = behavior_source().model_copy(update={"id_charset": charset, "id_max_bytes": max_bytes})
    codec = EventCodec(source)
    values = [codec.encode(e) for e in ids_cases()]
    want = python_reasons(source, values)
    assert want[0] == ("ok", "")
    assert sum(r == "invalid_id" for r, _ in want) >= (70 if charset == "printable" else 2)
    assert java_reasons(source, values, tmp_path) == want


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(
        st.tuples(st.text(min_size=0, max_size=24), st.text(min_size=0, max_size=24)),
        min_size=40,
        max_size=40,
    )
)
def test_arbitrary_ids_get_one_verdict_in_both_languages(ids: list[tuple[str, str]], tmp_path: Path) -> None:
    source = behavior_source().model_copy(update={"id_charset": "printable", "id_max_bytes": 40})
    codec = EventCodec(source)
    base = event(1, "u1", "click", T0, item_id="i1")
    values = []
    for user, ident in ids:
        try:
            values.append(codec.encode({**base, "user_id": user, "event_id": ident}))
        except EncodeError:  # a lone surrogate cannot be written as Avro: no record to compare
            continue
    assert java_reasons(source, values, tmp_path) == python_reasons(source, values)
