"""A report as a list of blocks, and its two renderings: Markdown and self-contained HTML.

Every string in a block is plain text and is escaped by the renderer, because most of it comes
from the run (prompts, model output, group names, the recorded command) and is untrusted: model
output can contain ``<script>``. The HTML has no external resources at all (inline CSS, plots as
``data:`` PNGs) and a Content-Security-Policy that forbids scripts, so it opens offline and a
missed escape still could not run anything.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["Code", "Document", "Headline", "Heading", "Image", "Paragraph", "Table", "to_html", "to_markdown"]

CELL_LIMIT = 160  # characters of one table cell; the CSV keeps everything


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Headline:
    """The verdict sentence a report opens with; ``status`` (CLEAN, CORRUPTED, NO HITS, FIXED,
    NOT SHOWN FIXED, REGRESSED) picks its colour and ``text`` starts with it."""

    status: str
    text: str


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame  # cells are shown as str(value)
    caption: str = ""


@dataclass(frozen=True)
class Image:
    path: Path  # a PNG: linked by file name from Markdown, inlined in HTML
    caption: str


@dataclass(frozen=True)
class Code:
    text: str


Block = Heading | Paragraph | Headline | Table | Image | Code


@dataclass(frozen=True)
class Document:
    title: str
    blocks: tuple[Block, ...]


def _cell(value: object) -> str:
    text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= CELL_LIMIT else text[: CELL_LIMIT - 1] + "…"


# ---------------------------------------------------------------- Markdown


def _md(text: str) -> str:
    """Inline text that no Markdown renderer turns into HTML, a link, code or a table break."""
    text = html.escape(re.sub(r"\s+", " ", text), quote=False)
    return re.sub(r"([\\`*\[\]|])", r"\\\1", text)


def _md_table(table: Table) -> list[str]:
    frame = table.frame
    lines = [f"*{_md(table.caption)}*", ""] if table.caption else []
    if frame.empty:
        return [*lines, "(none)", ""]
    lines.append("| " + " | ".join(_md(str(c)) for c in frame.columns) + " |")
    lines.append("|" + "---|" * len(frame.columns))
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_md(_cell(v)) for v in row) + " |")
    return [*lines, ""]


def _md_code(text: str) -> list[str]:
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return [fence + "text", text, fence, ""]


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Heading):
        return ["#" * block.level + " " + _md(block.text), ""]
    if isinstance(block, Headline):
        return [f"**{_md(block.text)}**", ""]
    if isinstance(block, Paragraph):
        return [_md(block.text), ""]
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Image):
        return [f"![{_md(block.caption)}]({block.path.name})", ""]
    return _md_code(block.text)


def to_markdown(document: Document) -> str:
    """The report as Markdown; images are referenced by file name (they sit beside report.md)."""
    lines = ["# " + _md(document.title), ""]
    for block in document.blocks:
        lines.extend(_md_block(block))
    return "\n".join(lines)


# ---------------------------------------------------------------- HTML

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1120px; padding: 24px; color: #1d1d1d; background: #fff;
       font-size: 15px; line-height: 1.45; }
h1 { font-size: 24px; margin: 0 0 12px; word-break: break-all; }
h2 { font-size: 19px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 16px; margin: 20px 0 6px; }
.headline { font-size: 18px; font-weight: 600; padding: 12px 16px; border-radius: 6px;
            border-left: 6px solid; margin: 8px 0 12px; }
.good { background: #e8f5e9; border-color: #2e7d32; }
.bad { background: #fdecea; border-color: #c62828; }
.unsure { background: #fff8e1; border-color: #f9a825; }
table { border-collapse: collapse; margin: 6px 0 14px; font-size: 13px; }
caption { caption-side: top; text-align: left; font-style: italic; color: #555; padding: 4px 0; }
th, td { border: 1px solid #d0d0d0; padding: 4px 8px; text-align: left; vertical-align: top;
         max-width: 360px; overflow-wrap: break-word; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
figure { margin: 10px 0 18px; }
figure img { max-width: 100%; border: 1px solid #e0e0e0; }
figcaption { color: #555; font-size: 13px; }
pre { background: #f6f6f6; padding: 10px 12px; border-radius: 4px; overflow-x: auto;
      white-space: pre-wrap; overflow-wrap: anywhere; font-size: 13px; }
"""
# No scripts, no fetches: only inline styles and data: images may load.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_TONE = {"CLEAN": "good", "FIXED": "good", "CORRUPTED": "bad", "REGRESSED": "bad"}


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _html_table(table: Table) -> str:
    caption = f"<caption>{_esc(table.caption)}</caption>" if table.caption else ""
    if table.frame.empty:
        return f"<table>{caption}<tr><td>(none)</td></tr></table>"
    head = "".join(f"<th>{_esc(str(c))}</th>" for c in table.frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{_esc(_cell(v))}</td>" for v in row) + "</tr>"
                   for row in table.frame.itertuples(index=False))
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _html_image(image: Image) -> str:
    data = base64.b64encode(image.path.read_bytes()).decode("ascii")
    return (f'<figure><img alt="{_esc(image.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(image.caption)}</figcaption></figure>")


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{_esc(block.text)}</h{block.level}>"
    if isinstance(block, Headline):
        return f'<p class="headline {_TONE.get(block.status, "unsure")}">{_esc(block.text)}</p>'
    if isinstance(block, Paragraph):
        return f"<p>{_esc(block.text)}</p>"
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Image):
        return _html_image(block)
    return f"<pre>{_esc(block.text)}</pre>"


def to_html(document: Document) -> str:
    """The report as one self-contained HTML page."""
    body = "\n".join(_html_block(block) for block in document.blocks)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{_esc(document.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>{_esc(document.title)}</h1>\n{body}\n</body>\n</html>\n")
