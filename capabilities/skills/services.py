"""Creating and updating skills from SKILL.md text or a folder of SKILL.md files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from capabilities.skills.models import Skill
from capabilities.skills.parsing import ParsedSkill, SkillParseError, skill_parse
from llm.models import ModelRoute
from tenants.models import Tenant


@transaction.atomic
def skill_save_parsed(*, tenant_id: int, parsed: ParsedSkill, skill: Skill | None = None) -> tuple[Skill, bool]:
    """Update ``skill`` (saved or new) from a parsed SKILL.md; without ``skill``, the tenant's
    skill named ``parsed.name`` (created if there is none).

    Requires tenant scope (``tenant_id``'s). Fields absent from the file get their defaults
    (``max_loop_count`` 8, no route), so the file is the whole truth about the skill.

    Returns:
        (the skill, True if it was created).

    Raises:
        SkillParseError: ``model_route`` names no route of the tenant, or the fields are invalid
            (a name another skill of the tenant has, too).
    """
    route = None
    if parsed.model_route:
        route = ModelRoute.objects.filter(name=parsed.model_route).first()
        if route is None:
            raise SkillParseError(f"'model_route': the tenant has no model route named {parsed.model_route!r}.")
    if skill is None:
        skill = Skill.objects.filter(name=parsed.name).first() or Skill(tenant_id=tenant_id)
    created = skill.pk is None
    skill.name = parsed.name
    skill.description = parsed.description
    skill.instructions = parsed.instructions
    skill.allowed_tools = parsed.allowed_tools
    skill.model_route = route
    skill.max_loop_count = parsed.max_loop_count or 8
    skill.source = parsed.source
    try:
        skill.full_clean()
    except ValidationError as exc:
        raise SkillParseError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
    skill.save()
    return skill, created


@dataclass(frozen=True, slots=True)
class ImportResult:
    path: Path
    name: str = ""
    created: bool = False
    error: str = ""


def skills_import_folder(*, tenant_id: int, folder: Path) -> list[ImportResult]:
    """Import ``folder/SKILL.md`` and every ``folder/*/SKILL.md`` (sorted by path).

    Each file is created or updated by name in its own transaction; a bad file is reported
    in its result and does not stop the others. Requires tenant scope.

    Raises:
        FileNotFoundError: ``folder`` is not a directory.
    """
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a directory")
    paths = [p for p in [folder / "SKILL.md", *sorted(folder.glob("*/SKILL.md"))] if p.is_file()]
    results = []
    for path in paths:
        try:
            parsed = skill_parse(path.read_text(encoding="utf-8"))
            skill, created = skill_save_parsed(tenant_id=tenant_id, parsed=parsed)
        except (SkillParseError, UnicodeDecodeError) as exc:
            results.append(ImportResult(path=path, error=str(exc)))
            continue
        results.append(ImportResult(path=path, name=skill.name, created=created))
    return results


@transaction.atomic
def skill_save(*, tenant: Tenant, skill: Skill | None = None, skill_md: str | None = None, **fields: Any) -> Skill:
    """Create or update a skill from ``skill_md`` (a whole SKILL.md, which wins) or from ``fields``.

    Requires the tenant's scope. Editing fields clears ``source`` (it no longer matches).

    Raises:
        ValidationError: a bad SKILL.md (on ``skill_md``, with the parser's reason) or invalid
            fields (a duplicate name, a foreign route...).
    """
    skill = skill or Skill(tenant=tenant)
    if skill_md:
        try:
            saved, _ = skill_save_parsed(tenant_id=tenant.pk, parsed=skill_parse(skill_md), skill=skill)
        except SkillParseError as exc:
            raise ValidationError({"skill_md": str(exc)}) from exc
        return saved
    for name, value in fields.items():
        setattr(skill, name, value)
    if fields:
        skill.source = ""
    skill.full_clean()
    skill.save()
    return skill
