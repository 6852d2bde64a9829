"""reports.plots: every plot writes a valid, non-blank PNG from DataFrames, touching no global state."""

import struct

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from reports.plots import plot_hit_vs_cold, plot_latency, plot_rates, plot_timeline
from reports.tables import load_run, rates
from tests.harness.test_report_render import fault_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path, size=None):
    """``path`` is a PNG (signature, IHDR first), of ``size`` (width, height) if given, and not one flat colour."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 0 and height > 0
    if size is not None:
        assert (width, height) == size
    pixels = (255 * matplotlib.image.imread(path)).astype(np.uint8)
    rgba = np.dstack([pixels, np.full(pixels.shape[:2], 255, np.uint8)])[..., :4] if pixels.shape[-1] == 3 else pixels
    colours = np.unique(np.ascontiguousarray(rgba).view(np.uint32))
    assert len(colours) > 8, f"{path} is blank ({len(colours)} colours)"


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    return load_run(fault_run(tmp_path_factory.mktemp("runs")))


def test_every_plot_writes_a_valid_png(frame, tmp_path):
    """Rates, hit vs cold, the per-branch timeline and latency each return the path of a real, non-blank PNG."""
    table = rates(frame, by=["faults", "pattern", "hit"])
    written = [plot_rates(table, tmp_path / "rates.png"), plot_hit_vs_cold(frame, tmp_path / "hit.png"),
               plot_timeline(frame, tmp_path / "sub" / "timeline.png"), plot_latency(frame, tmp_path / "latency.png")]
    assert [p.name for p in written] == ["rates.png", "hit.png", "timeline.png", "latency.png"]
    for path in written:
        assert_png(path)


def test_no_pyplot_figure_is_left_behind(frame, tmp_path):
    """Plots use the object API: pyplot's global figure list is the same before and after."""
    before = plt.get_fignums()
    plot_timeline(frame, tmp_path / "t.png", x="time")
    plot_hit_vs_cold(frame, tmp_path / "h.png")
    assert plt.get_fignums() == before


def test_empty_inputs_still_give_a_png(tmp_path):
    """A run with no requests gets "no data" images, not a crash or a missing file."""
    empty = pd.DataFrame()
    for path in (plot_rates(rates(empty), tmp_path / "r.png"), plot_timeline(empty, tmp_path / "t.png"),
                 plot_latency(empty, tmp_path / "l.png")):
        assert_png(path)


def test_timeline_rejects_an_unknown_axis(frame, tmp_path):
    """The timeline's x axis is the request index or the time sent; anything else is refused by name."""
    with pytest.raises(ValueError, match="x must be 'index' or 'time'"):
        plot_timeline(frame, tmp_path / "t.png", x="tokens")
