"""The HTML report opened in a real headless Chromium: every plot rendered, no browser errors.

Needs Chromium and its driver (Debian: ``apt-get install chromium chromium-driver``) and selenium
(PyPI). Skips, saying which is missing, only when they are not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from click.testing import CliRunner

from headwater.cli.main import main
from headwater.pipelines.freshness.html import LEFT, RIGHT, W
from headwater.pipelines.store import OnlineStore, ViewLayout, epoch_ms

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver", "chromium-driver")
WRITTEN = {  # view -> (tier, writes in the window)
    "user_session_realtime": ("realtime", 30),
    "item_trending_realtime": ("realtime", 12),
    "user_search_nearline": ("nearline", 5),
}
COUNT_JS = """
const out = {};
for (const fig of document.querySelectorAll('section.tier figure.view')) {
  const age = fig.querySelector('polyline.age');
  const sla = fig.querySelectorAll('line.sla');
  const box = age ? age.getBBox() : null;
  out[fig.dataset.view] = {
    tier: fig.closest('section').dataset.tier,
    age_polylines: fig.querySelectorAll('polyline.age').length,
    age_points: age ? age.points.numberOfItems : 0,
    age_width: box ? box.width : 0,
    lag_points: fig.querySelectorAll('circle.lag').length,
    lag_drawn: [...fig.querySelectorAll('circle.lag')].filter(c => c.getBBox().width > 0).length,
    sla_lines: sla.length,
    sla_width: sla.length ? sla[0].getBoundingClientRect().width : 0,
    svg_width: fig.querySelector('svg').getBoundingClientRect().width,
  };
}
return out;
"""


def _find(names: tuple[str, ...]) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture
def browser() -> Iterator[Any]:
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed (pip install selenium)"
    )
    binary, driver_path = _find(BROWSERS), _find(DRIVERS)
    if binary is None or driver_path is None:
        pytest.skip(
            f"no headless browser: chromium found at {binary}, chromedriver at {driver_path}"
            " (apt-get install chromium chromium-driver)"
        )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,2000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_html_report_renders_every_plot_in_a_real_browser(
    browser: Any, state_dir: Path, store: OnlineStore, client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    now = epoch_ms()
    for view, (_, writes) in WRITTEN.items():
        layout = ViewLayout(view=view, entity="user", features=("a",))
        for k in range(writes):
            wt = now - (writes - k) * 10_000
            store.write_batch(layout, [f"e{k}"], np.zeros((1, 1)), wt - 1500, write_time_ms=wt)
    out = tmp_path / "freshness.html"
    url = "redis://{host}:{port}/{db}".format(**client.connection_pool.connection_kwargs)
    result = CliRunner().invoke(
        main,
        [
            "freshness",
            "--state-dir",
            str(state_dir),
            "--redis-url",
            url,
            "--namespace",
            namespace,
            "--window",
            "10m",
            "--format",
            "html",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code in (0, 1), result.output

    browser.get(out.as_uri())
    assert browser.title == "headwater freshness"
    seen = browser.execute_script(COUNT_JS)
    assert {v["tier"] for v in seen.values()} == {"realtime", "nearline", "offline"}
    for view, (tier, writes) in WRITTEN.items():
        fig = seen[view]
        assert fig["tier"] == tier
        assert fig["age_polylines"] == 1
        assert fig["age_points"] == 2 * writes  # a rise and a drop per publication in the window
        # drawn from the first publication to now: writes x 10 s of the 600 s window
        assert fig["age_width"] == pytest.approx((W - LEFT - RIGHT) * writes * 10 / 600, abs=3)
        assert fig["lag_points"] == fig["lag_drawn"] == writes
        assert fig["sla_lines"] == 1
        assert fig["sla_width"] > 0.8 * fig["svg_width"] - 100
    silent = [v for v in seen if v not in WRITTEN]
    assert silent
    for view in silent:  # views nobody wrote: no plot, still the SLA line
        assert (seen[view]["age_polylines"], seen[view]["lag_points"], seen[view]["sla_lines"]) == (0, 0, 1)
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []
