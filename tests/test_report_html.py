"""index.html in headless Chromium: the grid, the red-cell details and the filters really work offline."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from quantmatrix.cli import main

if TYPE_CHECKING:
    from conftest import SuiteRunner

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CK1, CK2 = "qwen3moe-tiny-nvfp4-weight-only", "mixtral-tiny-nvfp4-w4a4"
CELLS = [f"{ck}@{arch}-{mode}" for ck in (CK1, CK2) for arch in ("sm100", "sm120", "sm121")
         for mode in ("default", "eager")]
RED_CELL = f"{CK1}@sm121-eager"
NASTY = '''

def test_nasty():
    assert False, "</script><script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
'''


def _missing_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install playwright)"
    if not os.path.exists(CHROMIUM):
        return "Chromium is not installed (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    why = _missing_browser()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests need a browser on CI: {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="qm-chromium-") as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                       args=FLAGS, offline=True)
        yield context
        context.close()


@pytest.fixture
def page(browser, junit_suite: SuiteRunner, tmp_path: Path):
    """The report of one real night, opened from disk, with every request and page error recorded."""
    junit_suite.run("night", CELLS, checks=("config_dispatch", "weight_audit"), schemes={CK2: "nvfp4_w4a4"},
                    outcomes={f"config_dispatch[{RED_CELL}]": "fail",
                              f"weight_audit[{CK2}@sm120-default]": "waive"},
                    args=["-o", "junit_logging=system-out"], extra_test=NASTY)
    (tmp_path / "runs").mkdir()
    shutil.copy(junit_suite.last, tmp_path / "runs" / "sm121.xml")
    (tmp_path / "runs" / "sm100.xml").write_text("<testsuites><testsuite")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--night", "2026-12-02",
                 "--allow-bad-inputs"]) == 1
    page = browser.new_page()
    page.requests, page.errors = [], []
    page.on("request", lambda r: page.requests.append(r.url))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.goto((tmp_path / "out" / "index.html").as_uri())
    yield page
    assert page.errors == []
    page.close()


def cell(page, checkpoint: str, arch: str, mode: str):
    return page.locator(f'tr[data-row="{checkpoint}"] td[data-arch="{arch}"][data-mode="{mode}"]')


def test_grid_shows_checkpoints_by_arch_and_mode_with_status(page) -> None:
    """Rows are checkpoints, columns arch then mode; the failing cell is red and marked new, the waived one
    amber, the rest green; the banner says the night has a new failure."""
    assert page.locator("thead th.arch").all_inner_texts() == ["sm100", "sm120", "sm121", "(none)"]
    assert page.locator("thead th.mode").all_inner_texts() == ["default", "eager"] * 3 + ["(none)"]
    rows = page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.row)")
    assert rows == [CK2, CK1, "(none)"]
    red = cell(page, CK1, "sm121", "eager")
    assert red.get_attribute("data-status") == "fail"
    assert red.inner_text() == "\u27171 \u27131 NEW"
    assert cell(page, CK2, "sm120", "default").get_attribute("data-status") == "waived"
    assert cell(page, CK1, "sm100", "default").get_attribute("data-status") == "pass"
    assert page.locator("#banner").inner_text().startswith("2 new failures")
    assert "sm100.xml" in page.locator('ul[data-list="bad"]').inner_text()


def test_clicking_a_red_cell_shows_its_message_and_log_tail(page) -> None:
    """A click on a red cell opens its cases: the failure message, the tail of the log, the vLLM version."""
    assert page.locator("#detail").is_hidden()
    cell(page, CK1, "sm121", "eager").click()
    detail = page.locator("#detail")
    assert detail.is_visible()
    text = detail.inner_text()
    assert f"{CK1} @ sm121 / eager" in text
    assert f"config_dispatch broke on {RED_CELL}" in detail.locator("pre.msg").inner_text()
    assert f"engine step 59 on {RED_CELL}" in detail.locator("pre.log").inner_text()
    assert "vLLM 0.11.1" in text and "weight_audit" in text


def test_filters_by_arch_mode_scheme_and_check_recount_the_grid(page) -> None:
    """Each filter really narrows the grid; filtering to another check turns the red cell green, because
    the cell is recounted from that check's cases only, and drops the failure from the lists."""
    page.select_option("#f-arch", "sm121")
    assert page.locator("thead th.arch").all_inner_texts() == ["sm121"]
    assert set(page.locator("td.cell").evaluate_all("tds => tds.map(t => t.dataset.arch)")) == {"sm121"}
    page.select_option("#f-mode", "eager")
    assert page.locator("thead th.mode").all_inner_texts() == ["eager"]
    page.select_option("#f-scheme", "nvfp4_w4a4")
    assert page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.row)") == [CK2]
    page.select_option("#f-scheme", "")
    assert cell(page, CK1, "sm121", "eager").get_attribute("data-status") == "fail"
    assert RED_CELL in page.locator('ul[data-list="New failures"]').inner_text()
    page.select_option("#f-check", "weight_audit")
    assert cell(page, CK1, "sm121", "eager").get_attribute("data-status") == "pass"
    assert cell(page, CK1, "sm121", "eager").inner_text() == "\u27131"
    assert page.locator('ul[data-list="New failures"]').count() == 0
    page.select_option("#f-check", "")
    assert cell(page, CK1, "sm121", "eager").get_attribute("data-status") == "fail"


def test_page_is_self_contained_and_loads_nothing(page) -> None:
    """One file: no request but the page itself (the browser is offline), no external script, style or
    font; links to waivers are plain anchors."""
    assert page.requests == [page.url]
    html = Path(page.url.removeprefix("file://")).read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
    assert "@import" not in html and "url(" not in html
    cell(page, CK2, "sm120", "default").click()
    link = page.locator("#detail .waiver a")
    assert link.get_attribute("href") == "https://github.com/example/qm/issues/7"


def test_untrusted_messages_are_shown_not_run(page) -> None:
    """A failure message full of markup is displayed as text: it can neither close the data script nor
    inject elements; a case outside the matrix still gets a row."""
    assert page.evaluate("window.pwned") is None
    cell(page, "(none)", "(none)", "(none)").click()
    assert "<script>window.pwned = 1</script>" in page.locator("#detail pre.msg").inner_text()
    assert page.locator("#detail img").count() == 0
    assert page.evaluate("window.pwned") is None
