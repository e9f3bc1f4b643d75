"""Reads the skills folder the way a user needs to see it: the skills that load, and why others don't."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
_NAME = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
# Front matter as deepagents reads it: a YAML block between two '---' lines at the top.
_FRONT_MATTER = re.compile(r"^---\s*\n(.*?)\n---\s*\n", re.DOTALL)


@dataclass(frozen=True)
class Skill:
    """A skill that loads: what the model sees of it, and where the agent reads it."""

    name: str
    description: str
    path: str


@dataclass(frozen=True)
class SkillError:
    """A SKILL.md that is skipped, and why."""

    file: str
    reason: str


def scan_skills(skills_dir: Path, *, route: str = "/skills/") -> tuple[list[Skill], list[SkillError]]:
    """Every skill folder under `skills_dir`: the valid skills and the load errors, sorted by name."""
    skills: list[Skill] = []
    errors: list[SkillError] = []
    if not skills_dir.is_dir():
        return skills, [SkillError(str(skills_dir), "the skills folder does not exist")]
    for folder in sorted(p for p in skills_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        file = folder / SKILL_FILE
        reason = _problem(file, folder.name)
        if isinstance(reason, str):
            errors.append(SkillError(str(file), reason))
        else:
            skills.append(Skill(reason["name"], reason["description"], f"{route}{folder.name}/{SKILL_FILE}"))
    return skills, errors


def as_json(items: list[Skill] | list[SkillError]) -> list[dict[str, Any]]:
    """JSON-ready dicts of skills or errors."""
    return [asdict(item) for item in items]


def _problem(file: Path, folder_name: str) -> str | dict[str, str]:
    """The front matter of a valid SKILL.md, or why it is invalid."""
    if not file.is_file():
        return f"no {SKILL_FILE} in the folder"
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read: {exc}"
    match = _FRONT_MATTER.match(text)
    if not match:
        return "no YAML front matter (a block between two '---' lines at the top)"
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        return f"invalid YAML in the front matter: {' '.join(str(exc).split())}"
    if not isinstance(meta, dict):
        return "the front matter is not a mapping of keys"
    name, description = str(meta.get("name") or "").strip(), str(meta.get("description") or "").strip()
    if not name or not description:
        return "the front matter needs both 'name' and 'description'"
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        return f"name '{name}' must be lowercase letters, digits and single hyphens, at most {MAX_NAME} characters"
    if name != folder_name:
        return f"name '{name}' must equal the folder name '{folder_name}'"
    if len(description) > MAX_DESCRIPTION:
        return f"description is {len(description)} characters; the limit is {MAX_DESCRIPTION}"
    return {"name": name, "description": description}
