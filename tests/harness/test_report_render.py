"""reports.render: the verdict comes first with its counts, untrusted text is escaped, the HTML is self-contained
and opens in a headless browser."""

import json
import re
import subprocess

import pytest

from forensics import RunDir, RunMeta
from hammer.patterns import Op, generate_ops, with_controls
from reports.render import write_run_report
from tests.harness.fakes import simulate

CHROMIUM = "/usr/bin/chromium"
SCRIPT = "<script>alert(1)</script>"


def _meta(faults=(), command=("hammer", "run", "--seed", "3")):
    return RunMeta(target={"kind": "embedded"}, patterns=({"name": "mix", "settings": {}},),
                   seeds={"pattern": 3, "device": 7}, faults=faults, command=command)


def fault_run(root, *, faults=("donate=transfer",), count=60, output=None, command=("hammer", "run", "--seed", "3")):
    """A mixed-pattern run with corruption planted on every third hit (sticky per group), cold requests clean."""
    run = RunDir.create(root, _meta(faults, command), path=root / "fault-run")
    planted = iter(range(10**6))
    simulate(generate_ops("mix", 3, count), run.history_path, corrupt=lambda op, hit: hit and next(planted) % 3 == 0,
             output=output or (lambda op, choice: f"answer {op.key[:8]}"))
    return run.path


def counted_run(root, name, *, hits, corrupted, faults=()):
    """A run whose hammer arm is one cold request then exactly ``hits`` hits, the first ``corrupted`` of them wrong."""
    run = RunDir.create(root, _meta(faults), path=root / name)
    prompt = "The same long prompt, asked again and again under load. " * 2
    ops = [Op(request=f"{name}-{i:04d}", pattern="alternate-abandon", prompt=prompt, group="branch/a", at=i)
           for i in range(hits + 1)]
    remaining = iter(range(hits))
    simulate(with_controls(ops, f"{name}-ctl"), run.history_path,
             corrupt=lambda op, hit: hit and next(remaining) < corrupted)
    return run.path


def _report(run_path, **kwargs):
    written = write_run_report([run_path], run_path / "report", **kwargs)
    return written["md"].read_text(), written["html"].read_text()


def test_a_clean_run_says_clean_with_its_bound(tmp_path):
    """0 corrupted of 20 hits opens both reports with CLEAN and the one-sided exact upper bound."""
    md, page = _report(counted_run(tmp_path, "clean", hits=20, corrupted=0))
    headline = "CLEAN: 0 corrupted of 20 completed hits (95% Clopper-Pearson upper bound 13.9%)"
    assert headline in md.splitlines()[2]
    assert headline in page and "CORRUPTED" not in page


def test_a_planted_run_says_corrupted_with_the_right_counts(tmp_path):
    """3 planted of 30 hits: CORRUPTED, 3 of 30, the Wilson interval, only on hits; the rate table shows 3/30."""
    md, page = _report(counted_run(tmp_path, "planted", hits=30, corrupted=3, faults=("track_writer=off",)))
    headline = "CORRUPTED: 3 of 30 hits (10.0%, 95% Wilson CI 3.5–25.6%), only on hits (cold: 0 of 1)"
    assert headline in md.splitlines()[2] and headline in page
    assert re.search(r"\| track\\?_writer=off \| alternate-abandon \| [^|]* \| hit \| 3/30 \| 10\.0% \|", md)
    assert "Wilson score and Clopper-Pearson exact" in md


@pytest.fixture(scope="module")
def untrusted_report(tmp_path_factory):
    """A fault run whose model output and recorded command carry markup, reported once for several tests."""
    root = tmp_path_factory.mktemp("untrusted")
    output = lambda op, choice: f"{SCRIPT} answer {op.key[:8]} | [x](javascript:alert(1))"
    written = write_run_report([fault_run(root, output=output, command=("hammer", "run", SCRIPT))], root / "report")
    return written["md"], written["html"]


def test_untrusted_text_is_escaped(untrusted_report):
    """Model output and the recorded command holding <script> appear only escaped (Markdown: or inside a code fence)."""
    md, page = (path.read_text() for path in untrusted_report)
    assert SCRIPT not in page and "<script" not in page.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    prose = re.sub(r"(?s)```text\n.*?\n```", "", md)
    assert SCRIPT not in prose and "&lt;script&gt;" in prose
    assert not re.search(r"(?<!\\)\]\(javascript:", md)  # the brackets are escaped, so no link is made
    row = next(line for line in md.splitlines() if "alert(1)" in line and line.startswith("| mix-"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 10  # nine columns: the planted pipe did not add one


def test_html_is_self_contained(untrusted_report):
    """Every image is an inlined data: PNG and nothing is fetched: no external src/href, no script, CSP forbids them."""
    page = untrusted_report[1].read_text()
    sources = re.findall(r'src="([^"]*)"', page)
    assert len(sources) == 4 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert not re.search(r"(href|src)=\"(https?:|//|file:)", page) and "<link" not in page
    assert "default-src 'none'" in page


def test_attribution_and_reproduction(tmp_path):
    """attribution.json's rows are rendered when present ("not analysed yet" otherwise); command and seeds are given."""
    run = counted_run(tmp_path, "attributed", hits=4, corrupted=2)
    md, _ = _report(run)
    assert "Not analysed yet" in md and "hammer run --seed 3" in md and "device=7, pattern=3" in md
    hypotheses = [{"hypothesis": "bad-at-donate", "description": "snapshot writer bug", "status": "confirmed",
                   "detail": "7 of 7 failures"}]
    (run / "attribution.json").write_text(json.dumps({"verdicts": [], "hypotheses": hypotheses, "windows": []}))
    md, _ = _report(run)
    assert "Not analysed yet" not in md
    assert "| bad-at-donate | snapshot writer bug | confirmed | 7 of 7 failures |" in md


def _chromium(page, profile, *flags):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *flags, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_the_html_report_opens_in_headless_chromium(untrusted_report, tmp_path):
    """A fault run's report renders in chromium with no console message (no script ran or was blocked), shows its
    verdict and screenshots non-blank."""
    from tests.harness.test_report_plots import assert_png

    html_path = untrusted_report[1]
    headline = re.search(r'<p class="headline bad">(CORRUPTED: [^<]*only on hits[^<]*)</p>', html_path.read_text())
    headline = headline.group(1)
    shot = tmp_path / "shot.png"
    taken = _chromium(html_path, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1200,2000")
    assert taken.returncode == 0, taken.stderr[-2000:]
    assert_png(shot, size=(1200, 2000))
    dumped = _chromium(html_path, tmp_path / "profile2", "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert headline in dumped.stdout
    console = [line for line in (taken.stderr + dumped.stderr).splitlines() if ":CONSOLE" in line]
    assert not console, console
