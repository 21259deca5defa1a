"""SKILL.md parsing (good and bad files), saving with a route by name, the import command,
the binding's validation and the console (admin) form."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError

from agents.models import CapabilityBinding, CapabilityKind
from agents.tests.factories import AgentFactory, RouteFactory
from capabilities.models import Skill
from capabilities.skills.parsing import MAX_SKILL_BYTES, SkillParseError, skill_parse
from capabilities.skills.services import skill_save_parsed
from tenants.scoping import tenant_scope

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

GOOD = textwrap.dedent("""\
    ---
    name: summarize-page
    description: Summarize a web page in five bullet points.
    allowed_tools: [web_read, "todo_*"]
    model_route: cheap
    max_loop_count: 5
    license: MIT
    ---
    # Summarize

    Read the page with web_read, then answer with five bullets.
    """)


def test_parse_a_good_skill_md():
    parsed = skill_parse(GOOD)
    assert parsed.name == "summarize-page"
    assert parsed.description == "Summarize a web page in five bullet points."
    assert parsed.allowed_tools == ["web_read", "todo_*"]
    assert parsed.model_route == "cheap"
    assert parsed.max_loop_count == 5
    assert parsed.instructions.startswith("# Summarize\n\nRead the page")
    assert parsed.source == GOOD


def test_parse_accepts_the_hyphenated_spelling_and_a_string_of_tools():
    parsed = skill_parse("---\nname: a_b\ndescription: d\nallowed-tools: web_read, todo_write  mcp__*\n---\nbody\n")
    assert parsed.allowed_tools == ["web_read", "todo_write", "mcp__*"]
    assert parsed.model_route is None and parsed.max_loop_count is None


def test_parse_without_allowed_tools_gives_no_tools():
    assert skill_parse("---\nname: x\ndescription: d\n---\nbody").allowed_tools == []


@pytest.mark.parametrize("text, message", [
    ("name: x\ndescription: d\n", "must start with YAML front matter"),
    ("--- x\nname: x\n---\nbody", "first line of SKILL.md must be exactly '---'"),
    ("---\nname: x\ndescription: d\nbody without a closing fence\n", "not closed"),
    ("---\nname: [x\ndescription: d\n---\nbody", "not valid YAML at line"),
    ("---\n- a\n- b\n---\nbody", "must be a YAML mapping"),
    ("---\ndescription: d\n---\nbody", "'name' must be"),
    ("---\nname: has space\ndescription: d\n---\nbody", "'name' must be"),
    ("---\nname: " + "n" * 65 + "\ndescription: d\n---\nbody", "'name' must be"),
    ("---\nname: x\n---\nbody", "'description' is required"),
    ("---\nname: x\ndescription: d\nallowed_tool: [a]\n---\nbody", "Unknown front matter key(s): allowed_tool"),
    ("---\nname: x\ndescription: d\nallowed_tools: {a: 1}\n---\nbody", "'allowed_tools' must be a list"),
    ("---\nname: x\ndescription: d\nallowed_tools: [1, 2]\n---\nbody", "'allowed_tools' must be a list"),
    ("---\nname: x\ndescription: d\nmax_loop_count: 0\n---\nbody", "'max_loop_count' must be"),
    ("---\nname: x\ndescription: d\nmax_loop_count: many\n---\nbody", "'max_loop_count' must be"),
    ("---\nname: x\ndescription: d\nmodel_route: 7\n---\nbody", "'model_route' must be"),
    ("---\nname: x\ndescription: d\n---\n   \n", "instructions"),
])
def test_parse_rejects_bad_files_with_a_clear_reason(text, message):
    with pytest.raises(SkillParseError) as exc:
        skill_parse(text)
    assert message in str(exc.value)


def test_parse_rejects_an_oversized_file():
    with pytest.raises(SkillParseError, match="larger than"):
        skill_parse("---\nname: x\ndescription: d\n---\n" + "a" * MAX_SKILL_BYTES)


@pytest.mark.django_db
def test_save_resolves_the_route_by_name_within_the_tenant(world, other_world):
    route = RouteFactory(tenant=world.tenant, name="cheap")
    RouteFactory(tenant=other_world.tenant, name="elsewhere")
    with tenant_scope(world.tenant.pk):
        skill, created = skill_save_parsed(tenant_id=world.tenant.pk, parsed=skill_parse(GOOD))
        assert created and skill.model_route_id == route.pk and skill.max_loop_count == 5
        foreign = skill_parse(GOOD.replace("model_route: cheap", "model_route: elsewhere"))
        with pytest.raises(SkillParseError, match="no model route named 'elsewhere'"):
            skill_save_parsed(tenant_id=world.tenant.pk, parsed=foreign)


def _write(folder: Path, sub: str, text: str) -> None:
    (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / sub / "SKILL.md").write_text(text, encoding="utf-8")


@pytest.mark.django_db
def test_import_command_creates_then_updates_by_name_and_reports_bad_files(world, other_world, tmp_path, capsys):
    RouteFactory(tenant=world.tenant, name="cheap")
    _write(tmp_path, "summarize", GOOD)
    _write(tmp_path, "echo", "---\nname: echo\ndescription: Echo things.\nallowed_tools: [test_echo]\n---\nEcho.\n")
    (tmp_path / "SKILL.md").write_text("---\nname: top\ndescription: At the top.\n---\nTop.\n")
    call_command("skills_import", world.tenant.slug, str(tmp_path))
    out = capsys.readouterr().out
    assert "created summarize-page" in out and "created echo" in out and "created top" in out
    rows = {s.name: s for s in Skill.all_tenants.filter(tenant=world.tenant)}
    assert set(rows) == {"summarize-page", "echo", "top"}
    assert rows["echo"].allowed_tools == ["test_echo"] and rows["echo"].source.startswith("---\nname: echo")
    assert not Skill.all_tenants.filter(tenant=other_world.tenant).exists()

    _write(tmp_path, "echo", "---\nname: echo\ndescription: Echo, v2.\n---\nEcho twice.\n")
    _write(tmp_path, "broken", "---\nname: broken\n---\nno description\n")
    with pytest.raises(CommandError, match="1 of 4"):
        call_command("skills_import", world.tenant.slug, str(tmp_path))
    captured = capsys.readouterr()
    assert "updated echo" in captured.out
    assert "broken/SKILL.md: 'description' is required" in captured.err
    echo = Skill.all_tenants.get(tenant=world.tenant, name="echo")
    assert (echo.description, echo.instructions, echo.allowed_tools) == ("Echo, v2.", "Echo twice.", [])
    assert Skill.all_tenants.filter(tenant=world.tenant).count() == 3


@pytest.mark.django_db
def test_import_command_errors(world, tmp_path):
    with pytest.raises(CommandError, match="No tenant with slug"):
        call_command("skills_import", "nope", str(tmp_path))
    with pytest.raises(CommandError, match="is not a directory"):
        call_command("skills_import", world.tenant.slug, str(tmp_path / "missing"))
    with pytest.raises(CommandError, match="No SKILL.md found"):
        call_command("skills_import", world.tenant.slug, str(tmp_path))


@pytest.mark.django_db
def test_skill_binding_validation(world, other_world):
    agent = AgentFactory(tenant=world.tenant)
    mine = Skill.all_tenants.create(tenant=world.tenant, name="mine", description="d", instructions="i")
    theirs = Skill.all_tenants.create(tenant=other_world.tenant, name="theirs", description="d", instructions="i")
    ok = CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.SKILL, skill=mine)
    ok.full_clean()
    with pytest.raises(ValidationError, match="Choose a skill"):
        CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.SKILL).full_clean()
    with pytest.raises(ValidationError, match="Skill not found"):
        CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.SKILL, skill=theirs).full_clean()
    with pytest.raises(ValidationError, match="Only bindings of kind skill"):
        CapabilityBinding(tenant=world.tenant, agent=agent, kind=CapabilityKind.BUILTIN, builtin_name="todo_write",
                          skill=mine).full_clean()


@pytest.mark.django_db
def test_skill_name_is_unique_per_tenant_and_follows_the_tool_name_rule(world, other_world):
    Skill.all_tenants.create(tenant=world.tenant, name="same", description="d", instructions="i")
    Skill.all_tenants.create(tenant=other_world.tenant, name="same", description="d", instructions="i")
    with pytest.raises(ValidationError):
        Skill(tenant=world.tenant, name="same", description="d", instructions="i").full_clean()
    with pytest.raises(ValidationError):
        Skill(tenant=world.tenant, name="bad name!", description="d", instructions="i").full_clean()


@pytest.mark.django_db
def test_admin_api_binds_a_skill_of_the_tenant(world):
    agent = AgentFactory(tenant=world.tenant)
    skill = Skill.all_tenants.create(tenant=world.tenant, name="mine", description="d", instructions="i")
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "skill", "skill": skill.pk}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["skill"] == skill.pk
    resp = client.post("/api/v1/admin/bindings/", {"agent": agent.pk, "kind": "skill"}, format="json")
    assert resp.status_code == 400 and "skill" in resp.json()["extra"]["fields"]


@pytest.mark.django_db
def test_console_pastes_a_whole_skill_md(client, world, other_world):
    RouteFactory(tenant=world.tenant, name="cheap")
    RouteFactory(tenant=other_world.tenant, name="cheap")
    client.force_login(world.admin)
    assert client.get("/admin/capabilities/skill/add/").status_code == 200
    resp = client.post("/admin/capabilities/skill/add/", {"skill_md": GOOD, "allowed_tools": "[]", "max_loop_count": 8})
    assert resp.status_code == 302, resp.content.decode()[:3000]
    skill = Skill.all_tenants.get(name="summarize-page")
    assert skill.tenant_id == world.tenant.pk and skill.model_route.tenant_id == world.tenant.pk
    assert (skill.allowed_tools, skill.max_loop_count, skill.source) == (["web_read", "todo_*"], 5, GOOD.strip())
    bad = client.post("/admin/capabilities/skill/add/", {"skill_md": "---\nname: x\n---\nbody", "allowed_tools": "[]",
                                                         "max_loop_count": 8})
    assert bad.status_code == 200 and "description" in bad.content.decode() and "is required" in bad.content.decode()
    again = client.post("/admin/capabilities/skill/add/", {"skill_md": GOOD, "allowed_tools": "[]", "max_loop_count": 8})
    assert again.status_code == 200 and "already has a skill named" in again.content.decode().replace("&#x27;", "'")
    no_route = client.post("/admin/capabilities/skill/add/", {
        "skill_md": GOOD.replace("summarize-page", "other").replace("cheap", "missing"), "allowed_tools": "[]",
        "max_loop_count": 8})
    assert no_route.status_code == 200 and "no model route named" in no_route.content.decode()
    theirs = Skill.all_tenants.create(tenant=other_world.tenant, name="theirs", description="d", instructions="i")
    listing = client.get("/admin/capabilities/skill/").content.decode()
    assert "summarize-page" in listing and "theirs" not in listing
    assert client.get(f"/admin/capabilities/skill/{theirs.pk}/change/").status_code == 302


@pytest.mark.django_db
def test_the_example_skills_in_docs_import(world):
    folder = Path(__file__).resolve().parents[2] / "docs" / "skills"
    call_command("skills_import", world.tenant.slug, str(folder))
    names = sorted(Skill.all_tenants.filter(tenant=world.tenant).values_list("name", flat=True))
    assert names == ["plan-and-track", "summarize-page"]


@pytest.mark.django_db
def test_admin_api_creates_skills_from_fields_or_a_skill_md_with_clear_errors(world):
    route = RouteFactory(tenant=world.tenant, name="cheap")
    client = world.client(admin=True)
    resp = client.post("/api/v1/admin/skills/", {"skill_md": GOOD}, format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert (body["name"], body["model_route"], body["allowed_tools"], body["max_loop_count"]) == (
        "summarize-page", route.pk, ["web_read", "todo_*"], 5)
    assert body["source"] == GOOD and "skill_md" not in body

    resp = client.post("/api/v1/admin/skills/", {"skill_md": GOOD}, format="json")  # same name again
    assert resp.status_code == 400 and "skill_md" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/skills/", {"skill_md": "---\nname: x\n---\nbody"}, format="json")
    assert resp.status_code == 400
    assert "'description' is required" in str(resp.json()["extra"]["fields"]["skill_md"])

    resp = client.post("/api/v1/admin/skills/", {"name": "plain", "description": "d", "instructions": "Do it.",
                                                 "allowed_tools": ["test_echo"]}, format="json")
    assert resp.status_code == 201 and resp.json()["max_loop_count"] == 8 and resp.json()["source"] == ""
    resp = client.post("/api/v1/admin/skills/", {"name": "bad name", "description": "d", "instructions": "i"},
                       format="json")
    assert resp.status_code == 400 and "name" in resp.json()["extra"]["fields"]
    resp = client.post("/api/v1/admin/skills/", {"name": "nodesc"}, format="json")
    assert resp.status_code == 400 and {"description", "instructions"} <= set(resp.json()["extra"]["fields"])

    skill_id = body["id"]
    resp = client.patch(f"/api/v1/admin/skills/{skill_id}/", {"max_loop_count": 3}, format="json")
    assert resp.status_code == 200 and resp.json()["max_loop_count"] == 3 and resp.json()["source"] == ""
    assert world.client().get("/api/v1/admin/skills/").status_code == 403
