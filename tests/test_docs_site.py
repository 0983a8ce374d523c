"""The docs site as a reader sees it: built by mkdocs as CI builds it, then opened in a real headless browser
(Debian's chromium) at 1280 px, where the wide tables of FINDINGS.md once ran off the page's edge."""

import html
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
WIDTH = 1280  # a laptop's window
PAGES = ["FINDINGS", "CLAIMS", "configuration", "commands", "report"]  # the pages with the widest tables
BORDER = (225, 228, 229)  # the theme's table border, #e1e4e5

# Measures each table a second after the page has loaded (the theme wraps its tables in a handler it defers; the
# browser's virtual time makes the wait instant), into the title: where
# it ends, where the column holding it ends, and how much of it is hidden to scroll to (in the table itself
# when the theme makes it a block that scrolls, or in the wrapper around it).
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {  // after the theme's own deferred handlers
  const tables = [...document.querySelectorAll(".rst-content table")].map((t) => {
    const r = t.getBoundingClientRect(), box = t.parentElement;
    return {top: r.top + scrollY, bottom: r.bottom + scrollY, right: r.right,
            box: box.getBoundingClientRect().right,
            hidden: Math.max(box.scrollWidth - box.clientWidth, t.scrollWidth - t.clientWidth)};
  });
  document.title = "PROBE" + JSON.stringify({width: innerWidth, tables});
}, 1000));
</script>"""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        BROWSER is None,
        reason="no chromium to look at the docs site with (Debian: apt-get install chromium; .ci/run installs it)",
    ),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site `mkdocs build --strict` makes of README.md and docs/, as .ci/run builds it."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return out


def browse(page: Path, height: int, *args: str) -> str:
    """Open `page` in headless chromium, WIDTH x height CSS pixels at scale 1; its stdout."""
    done = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1"]
        + [f"--window-size={WIDTH},{height}", "--virtual-time-budget=10000", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def measure(site: Path, name: str) -> tuple[Path, dict]:
    """The page with the probe added beside it (so its styles and scripts load as the page's), and what it measured."""
    page = site / name / "index.html"
    probe = page.with_name("probe.html")
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    title = re.search(r"<title>PROBE(.*?)</title>", browse(probe, 900, "--dump-dom"), re.S)
    assert title, f"the probe did not run on {name}"
    return probe, json.loads(html.unescape(title.group(1)))


@pytest.mark.parametrize("name", PAGES)
def test_every_table_fits_the_page_at_1280_px(site, name):
    _, seen = measure(site, name)
    assert seen["width"] == WIDTH and seen["tables"], seen
    for i, t in enumerate(seen["tables"]):
        where = f"{name}: table {i + 1} ends at {t['right']:.0f} px, its column at {t['box']:.0f} px"
        assert t["right"] <= t["box"] + 1 and t["hidden"] <= 1 and t["right"] <= WIDTH, where


def test_a_screenshot_shows_the_findings_table_whole(site, tmp_path):
    """The summary table of FINDINGS.md in a screenshot: its right border is drawn inside the window, down
    the whole table, and its cells hold text. The screenshot is kept in the test's folder to look at."""
    probe, seen = measure(site, "FINDINGS")
    table = seen["tables"][0]
    height = math.ceil(table["bottom"]) + 40
    shot = tmp_path / "findings.png"
    browse(probe, height, f"--screenshot={shot}")
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, height)
    x = math.floor(table["right"]) - 1  # the table's right border
    assert 0 < x < WIDTH, table
    column = [image.getpixel((x, y)) for y in range(math.ceil(table["top"]) + 2, math.floor(table["bottom"]) - 2)]
    on_border = sum(all(abs(a - b) <= 12 for a, b in zip(p, BORDER)) for p in column)
    assert on_border >= 0.9 * len(column), f"{on_border} of {len(column)} pixels at x={x} are the border's"
    cells = image.crop((x - 200, math.ceil(table["top"]), x, math.floor(table["bottom"]))).convert("L")
    assert sum(v < 128 for v in cells.get_flattened_data()) > 500  # text in the last column, not an empty frame
