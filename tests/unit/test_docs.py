"""The documentation, checked: the README stays a front door (short, with the two set-up
commands), every relative link in README.md, CONTRIBUTING.md and docs/*.md reaches a file and,
with a #fragment, a heading of it, and every `gpux-pack COMMAND` they name is a real command.
Offline and fast: it reads Markdown and the CLI's Typer app, nothing else."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
WORD = r"[a-z][a-z0-9_-]*"
# `gpux-pack WORD`, and the word after it (or words: `cache ls|prune`), which names a group's command
COMMAND = re.compile(rf"(?<![\w/.-])gpux-pack[ \t]+({WORD})(?:[ \t]+({WORD}(?:\|{WORD})*))?")
EXTERNAL = re.compile(r"^(https?:|mailto:)", re.I)


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def split_code(text: str) -> tuple[str, list[str]]:
    """(the text outside fenced code blocks, with blocks blanked to keep line numbers; the
    blocks' lines)."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            else:
                code.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline Markdown reduced to its text, lowercased, every
    character but letters, digits, '_', '-' and spaces dropped, spaces turned into hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)  # emphasis
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose.splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(path: Path) -> list[str]:
    """The targets of the Markdown links of a file, outside code."""
    prose, _ = split_code(path.read_text(encoding="utf-8"))
    prose = CODE_SPAN.sub("code", prose)  # `[x](y)` in code is no link; `a [b]` in link text is
    return [m.group(1) for m in LINK.finditer(prose)]


def code_texts(path: Path) -> list[str]:
    """What a file shows as code: the lines of its fenced blocks and its inline code spans."""
    prose, code = split_code(path.read_text(encoding="utf-8"))
    return code + [m.group(2) for m in CODE_SPAN.finditer(prose)]


@lru_cache(maxsize=None)
def real_commands() -> dict[str, frozenset[str] | None]:
    """gpux-pack's commands from its Typer app: name -> the subcommands of a group, or None."""
    import typer.main

    from gpux_pack.cli import app

    root = typer.main.get_command(app)
    return {name: (frozenset(cmd.commands) if hasattr(cmd, "commands") else None)
            for name, cmd in root.commands.items()}


def test_every_markdown_file_is_found():
    assert README.is_file() and (ROOT / "CONTRIBUTING.md").is_file()
    assert len(DOCS) > 4, DOCS


def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, \
        f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move detail into docs/"


def test_readme_has_the_two_set_up_commands():
    lines = {line.strip() for line in README.read_text(encoding="utf-8").splitlines()}
    assert "bash scripts/dev example" in lines
    assert "bash scripts/dev test" in lines


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_relative_links_resolve(doc: Path):
    problems = []
    for target in links(doc):
        if EXTERNAL.match(target):
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / unquote(path_part)).resolve() if path_part else doc
        if not dest.exists():
            problems.append(f"{target}: no such file or folder")
            continue
        try:
            dest.relative_to(ROOT)
        except ValueError:
            problems.append(f"{target}: outside the repository")
            continue
        if fragment and dest.is_file() and dest.suffix == ".md" and unquote(fragment) not in anchors(dest):
            problems.append(f"{target}: no heading '#{fragment}' in {_name(dest)}")
    assert not problems, f"{_name(doc)}:\n  " + "\n  ".join(problems)


def test_the_link_checker_sees_links_and_headings():
    """The checks above would pass on nothing; make sure they see what they should."""
    assert any(t.startswith("docs/") for t in links(README))
    assert "set-up-on-a-fresh-machine-two-commands" in anchors(README)
    assert slug("What is validated, and the limits on input") == "what-is-validated-and-the-limits-on-input"
    assert slug("`gpux-pack warmup`: bake it") == "gpux-pack-warmup-bake-it"
    assert links(README).count("docs/commands.md#build") == 1


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_named_commands_exist(doc: Path):
    commands = real_commands()
    problems = []
    for text in code_texts(doc):
        for m in COMMAND.finditer(text):
            name, sub = m.group(1), m.group(2)
            if name not in commands:
                problems.append(f"gpux-pack {name}: no such command (in: {text.strip()[:100]})")
                continue
            group = commands[name]
            if group is not None and sub is not None:
                for s in sub.split("|"):
                    if s not in group:
                        problems.append(f"gpux-pack {name} {s}: no such command (in: {text.strip()[:100]})")
    assert not problems, f"{_name(doc)}:\n  " + "\n  ".join(problems)


def test_the_command_list_is_read_from_the_cli():
    commands = real_commands()
    assert {"build", "plan", "render", "push", "deploy", "run", "serve", "predict", "cache"} <= set(commands)
    assert commands["build"] is None and commands["cache"] and "ls" in commands["cache"]
