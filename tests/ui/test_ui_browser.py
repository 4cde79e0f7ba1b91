"""`tracker ui` in a real headless browser (Debian's Chromium, installed by `python -m tests.infra up`): the runs page,
a run's page, the compare page and a run's metric curves are loaded and screenshotted, and the screenshots checked:
PNGs of the window's size, not blank, with the colours the stylesheet gives (so the page's own policy let its
stylesheet load, and the SVG timeline and curves drew).

With ``TRACKER_UI_SCREENSHOTS=docs/screenshots`` the screenshots are written there (``ui-runs.png``, ``ui-run.png``,
``ui-compare.png``, ``ui-run-curves.png``: the pictures of the README); else to the test's temporary directory. A
missing browser fails the test.
"""

from __future__ import annotations

import os
import struct
import subprocess
import time
import zlib
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.support.ui_support import NOW_TEXT, build_index, running

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS_ENV = "TRACKER_UI_SCREENSHOTS"
BROWSER_TIMEOUT_S = 180


class Png(NamedTuple):
    width: int
    height: int
    pixels: Counter[bytes]  # RGB triple -> how many pixels have it


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> Png:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes), decoded with zlib: its size and colours.
    Every chunk's CRC is checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos: pos + 8])
        chunk = data[pos + 8: pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length: pos + 12 + length])
        assert zlib.crc32(kind + chunk) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    assert len(raw) == height * (stride + 1)
    pixels: Counter[bytes] = Counter()
    prev = bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1: (y + 1) * (stride + 1)])
        if kind == 1:  # Sub: each channel accumulates along the row
            for c in range(bpp):
                line[c::bpp] = bytes(accumulate(line[c::bpp], lambda a, b: (a + b) & 255))
        elif kind == 2:  # Up
            line = bytearray((a + b) & 255 for a, b in zip(line, prev, strict=True))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif kind == 4:  # Paeth
            for i in range(stride):
                left, up_left = (line[i - bpp], prev[i - bpp]) if i >= bpp else (0, 0)
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 255
        else:
            assert kind == 0, f"unknown filter {kind}"
        prev = bytes(line)
        pixels.update(prev[i: i + 3] for i in range(0, stride, bpp))
    return Png(width, height, pixels)


def _rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


def _screenshot(chromium: Path, url: str, out: Path, *, width: int, height: int, profile: Path) -> Png:
    started = time.monotonic()
    result = subprocess.run(
        [str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
         "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
         f"--window-size={width},{height}", f"--screenshot={out}", url],
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)
    assert result.returncode == 0 and out.is_file(), f"chromium failed ({result.returncode}): {result.stderr[-2000:]}"
    print(f"screenshot of {url}: {out} in {time.monotonic() - started:.1f} s")
    return decode_png(out.read_bytes())


def _check(png: Png, *, width: int, height: int, colours: dict[str, str]) -> None:
    assert (png.width, png.height) == (width, height)
    total = width * height
    assert sum(png.pixels.values()) == total
    assert len(png.pixels) >= 50, f"only {len(png.pixels)} colours: a blank or unstyled page"
    (background, most), = png.pixels.most_common(1)
    assert background == _rgb("#ffffff") and most < 0.9 * total, "mostly one colour: nothing drawn"
    # the stylesheet's colours, each on a good number of pixels (text anti-aliasing alone gives a few)
    missing = {name: hex_colour for name, hex_colour in colours.items() if png.pixels[_rgb(hex_colour)] < 150}
    assert missing == {}, f"colours not drawn: {missing}"


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get(SCREENSHOTS_ENV)
    directory = (REPO / configured) if configured else tmp_path_factory.mktemp("screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def test_the_runs_page_and_a_runs_page_in_a_real_browser(chromium: Path, screenshots: Path, tmp_path: Path) -> None:
    index = build_index(tmp_path)
    with running(index) as server:
        base = f"http://localhost:{server.server_address[1]}"
        runs = _screenshot(chromium, f"{base}/?now={NOW_TEXT}", screenshots / "ui-runs.png", width=1400, height=900,
                           profile=tmp_path / "profile")
        run = _screenshot(chromium, f"{base}/runs/vit-l-9hx4d?now={NOW_TEXT}", screenshots / "ui-run.png",
                          width=1400, height=1300, profile=tmp_path / "profile")
    _check(runs, width=1400, height=900, colours={
        "header bar": "#24292f", "stuck row": "#fff8c5", "succeeded badge": "#15803d", "failed badge": "#b91c1c",
        "filter button": "#1f883d"})
    _check(run, width=1400, height=1300, colours={
        "header bar": "#24292f", "runtime bar": "#16a34a", "progress bar": "#22c55e", "admission stripes": "#d97706",
        "scheduling bar": "#c026d3", "figure boxes": "#f6f8fa",
        # the pending spans under each attempt, coloured by category from the stylesheet (no inline style)
        "image-pull span": "#14b8a6"})


def test_the_compare_page_and_a_runs_metric_curves_in_a_real_browser(chromium: Path, screenshots: Path,
                                                                      tmp_path: Path) -> None:
    index = build_index(tmp_path)
    with running(index) as server:
        base = f"http://localhost:{server.server_address[1]}"
        compare = _screenshot(chromium, f"{base}/compare?run=gpt-moe-tq3vb&run=gpt-moe-6wz8r&run=vit-l-9hx4d"
                              f"&now={NOW_TEXT}", screenshots / "ui-compare.png", width=1400, height=2600,
                              profile=tmp_path / "profile")
        curves = _screenshot(chromium, f"{base}/runs/gpt-moe-tq3vb?now={NOW_TEXT}", screenshots / "ui-run-curves.png",
                             width=1400, height=3400, profile=tmp_path / "profile")
    _check(compare, width=1400, height=2600, colours={
        "header bar": "#24292f", "rows that differ": "#fff8c5", "plot background": "#f6f8fa",
        # one curve per run with points (gpt-moe-6wz8r has none), coloured by the run's column
        "gpt-moe-tq3vb's curves": "#2563eb", "vit-l-9hx4d's curves": "#2f9e44"})
    assert compare.pixels[_rgb("#e8590c")] == 0  # gpt-moe-6wz8r's colour: it has no curve
    _check(curves, width=1400, height=3400, colours={"plot background": "#f6f8fa", "the run's curves": "#2563eb"})
