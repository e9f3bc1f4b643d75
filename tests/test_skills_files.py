"""Every skills/<name>/SKILL.md has valid front matter (as deepagents' skills loader expects)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

SKILLS_DIR = Path(__file__).resolve().parent.parent / "skills"
# Same delimiter rule as deepagents' loader: front matter must open the file.
FRONT_MATTER = re.compile(r"^---\s*\n(.*?)\n---\s*\n", re.DOTALL)
NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
SKILL_DIRS = sorted(p for p in SKILLS_DIR.iterdir() if p.is_dir()) if SKILLS_DIR.is_dir() else []


def test_skills_exist() -> None:
    names = {p.name for p in SKILL_DIRS}
    assert {"time-now", "notes", "web-page"} <= names


@pytest.mark.parametrize("skill_dir", SKILL_DIRS, ids=lambda p: p.name)
def test_skill_front_matter(skill_dir: Path) -> None:
    skill_file = skill_dir / "SKILL.md"
    assert skill_file.is_file(), f"{skill_dir.name} has no SKILL.md"
    text = skill_file.read_text(encoding="utf-8")
    match = FRONT_MATTER.match(text)
    assert match, f"{skill_file} does not start with --- front matter ---"
    meta = yaml.safe_load(match.group(1))
    assert isinstance(meta, dict)

    name = meta.get("name")
    assert name == skill_dir.name
    assert NAME_RE.match(name)
    assert len(name) <= 64

    description = meta.get("description")
    assert isinstance(description, str) and description.strip()
    assert len(description) <= 1024

    body = text[match.end():]
    assert body.strip(), f"{skill_file} has no instructions after the front matter"
