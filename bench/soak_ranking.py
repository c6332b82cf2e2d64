"""The soak's ranking load: the service started on the run's namespace, a steady trickle of requests.

The requests are what the soak checks the service with while the tiers keep writing: every answer must
be a 200 (the service degrades instead of failing), and its latency is recorded.
"""

from __future__ import annotations

import json
import random
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".headwater/models"


class Starter(Protocol):
    """What the soak's process table offers this module."""

    def start(self, name: str, *args: str) -> Any:
        """Start ``headwater ARGS`` as component ``name``."""


def free_port() -> int:
    """Return a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RankingLoad:
    """Sends ``qps`` ranking requests per second (random user, 200 candidates) from one thread."""

    def __init__(self, port: int, qps: float) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.qps = qps
        self.latencies_ms: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    @classmethod
    def maybe_start(
        cls,
        system: Starter,
        namespace: str,
        qps: float,
        model: Path | None = None,
        state: Path | None = None,
        topic: str | None = None,
    ) -> RankingLoad | None:
        """Start the service and the load when ``qps`` > 0 and a model is given or trained, else None.

        ``model``: its training folder (default: ``.headwater/models``); ``state``: the applied plans;
        ``topic``: where the service sends its impressions (the run's events topic).
        """
        model = model or MODELS
        if qps <= 0 or not (model / "latest.json").exists():
            return None
        port = free_port()
        extra = [*("--state-dir", str(state))] if state is not None else []
        extra += ["--feedback-topic", topic] if topic is not None else []
        system.start("serve", "serve", "--no-auth", "--port", str(port), "--namespace", namespace,
                     "--model", str(model), "--device", "cpu", *extra)  # fmt: skip
        load = cls(port, qps)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{load.url}/health", timeout=2).read()
                break
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        else:
            msg = f"the ranking service did not answer /health on port {port} within 120 s"
            raise RuntimeError(msg)
        load._thread.start()
        return load

    def _loop(self) -> None:
        rng = random.Random(1)
        gap = 1.0 / self.qps
        next_at = time.monotonic()
        while not self._stop.is_set():
            body = {
                "user_id": f"u{rng.randint(1, 2000):06d}",
                "candidates": [f"i{n:06d}" for n in rng.sample(range(2000), 200)],  # distinct, or 422
                "k": 10,
            }
            request = urllib.request.Request(f"{self.url}/v1/rank", data=json.dumps(body).encode(),
                                             headers={"content-type": "application/json"})  # fmt: skip
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    payload = json.load(answer)
                    self.statuses[str(answer.status)] += 1
                    self.fallbacks[str(payload.get("fallback"))] += 1
            except urllib.error.HTTPError as exc:
                self.statuses[str(exc.code)] += 1
            except (urllib.error.URLError, OSError) as exc:
                self.statuses[type(exc).__name__] += 1
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            next_at += gap
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> dict[str, Any]:
        """Stop sending; return counts by status and fallback, latency p50/p99 and the feedback counters.

        The service sends the impressions it served to the events topic, so the soak's reconciliation
        adds ``feedback.sent`` to the generator's count.
        """
        self._stop.set()
        self._thread.join(10)
        time.sleep(2)  # let the feedback sender flush its last batch before the counters are read
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                feedback = json.load(answer).get("feedback") or {}
        except (urllib.error.URLError, OSError) as exc:
            feedback = {"error": str(exc)}
        lat = sorted(self.latencies_ms)
        pct = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
        return {
            "feedback": feedback,
            "requests": len(lat),
            "statuses": dict(self.statuses),
            "fallbacks": dict(self.fallbacks),
            "p50_ms": round(pct[49], 1),
            "p99_ms": round(pct[98], 1),
        }
