"""Reading the project's Markdown pages for their tests: code blocks, prose, headings,
and the relative links and figures, which must point at something that exists."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"(!?)\[((?:[^\[\]]|`[^`]*`)*)\]\(([^)\s]+)\)")


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    lines: list[str] = field(default_factory=list)


@dataclass
class Page:
    blocks: list[Block]
    prose: list[tuple[int, str]]  # (line number, text) outside code blocks
    headings: list[tuple[int, str]]  # (level, text)


def read_page(path: Path) -> Page:
    blocks, prose, headings, block = [], [], [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fence = FENCE.match(line)
        if block is None and fence:
            block = Block(fence.group(1), number)
        elif block is not None and line.strip() == "```":
            blocks.append(block)
            block = None
        elif block is not None:
            block.lines.append(line)
        else:
            prose.append((number, line))
            heading = re.match(r"^(#{1,6}) (.+)$", line)
            if heading:
                headings.append((len(heading.group(1)), heading.group(2).strip()))
    assert block is None, f"{path.name}: the block opened at line {block.line} is not closed"
    return Page(blocks, prose, headings)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").lower())
    return text.replace(" ", "-")


def links(page: Page):
    """(line, is image, text, target) of every link outside code blocks."""
    for number, line in page.prose:
        for m in LINK.finditer(line):
            yield number, m.group(1) == "!", m.group(2), m.group(3)


def check_links(path: Path, page: Page) -> int:
    """Assert that every relative link of ``page`` (read from ``path``) points at a file
    that exists, an image at a non-empty PNG or SVG, an anchor at one of the headings of
    its page (this one, or the Markdown page linked); return how many images it shows."""
    anchors = {slug(text) for _, text in page.headings}
    images = 0
    for number, image, _, target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue  # an address on the web
        target_path, _, anchor = target.partition("#")
        where = f"{path.name} line {number}, {target}"
        if not target_path:
            assert anchor in anchors, f"{where}: no heading with that anchor"
            continue
        file = (path.parent / target_path).resolve()
        assert file.exists(), f"{where}: no such file"
        if anchor and file.suffix == ".md":  # an anchor into another page: one of its headings
            other = {slug(text) for _, text in read_page(file).headings}
            assert anchor in other, f"{where}: no heading with that anchor in {file.name}"
        if image:
            assert file.suffix in (".png", ".svg") and file.stat().st_size > 0, where
            images += 1
    return images
