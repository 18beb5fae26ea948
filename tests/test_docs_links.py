"""Every relative link in README.md and docs/**/*.md resolves: the file exists and, for a link
into a Markdown file with ``#anchor``, a heading there has that anchor (GitHub's slugs).

The README is an overview that links to the reference pages under docs/reference/; a page
moved or a heading renamed must not leave a reader at a dead link.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: ``[text](target)``; the target ends at the first space or ``)``.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out += [(n, m.group(1)) for m in LINK.finditer(line)]
    return out


def broken(path: Path, root: Path = ROOT) -> list[str]:
    bad: list[str] = []
    for n, target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(root)}:{n}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where} (no such heading)")
    return bad


def test_every_relative_link_resolves() -> None:
    bad = [line for path in DOCS for line in broken(path)]
    assert not bad, "\n".join(bad)


def test_the_readme_links_the_reference_pages() -> None:
    readme = {target for _, target in links(ROOT / "README.md")}
    pages = {f"docs/reference/{p.name}" for p in (ROOT / "docs" / "reference").glob("*.md")}
    assert pages and pages <= readme, pages - readme


#: The README is an overview and a quick start; the reference lives under docs/reference/.
MAX_README_LINES = 150


def test_the_readme_is_an_overview_that_starts_with_the_set_up_commands() -> None:
    """Short enough to read in minutes, and the first commands a reader sees are the two
    that install, run and test it."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines: move the rest"
    start = next(n for n, line in enumerate(lines) if FENCE.match(line))
    end = next(n for n in range(start + 1, len(lines)) if FENCE.match(lines[n]))
    commands = [line.split("#")[0].strip() for line in lines[start + 1 : end]]
    assert commands == ["scripts/serve", "scripts/test"], commands


def test_the_checker_sees_a_dead_link(tmp_path: Path) -> None:
    page = tmp_path / "a.md"
    (tmp_path / "b.md").write_text("# The `b` page (v1)\n\n## Twice\n\n## Twice\n")
    page.write_text(
        "[ok](b.md#the-b-page-v1) [ok](b.md#twice-1) [gone](c.md) [bad](b.md#nope)\n"
        "```\n[in code](d.md)\n```\n[web](https://example.com)\n"
    )
    assert [line.split(": ", 1)[1] for line in broken(page, tmp_path)] == [
        "c.md (no such file)",
        "b.md#nope (no such heading)",
    ]
