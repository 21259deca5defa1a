"""``manage.py catalogue_check`` (issue 37): a catalogue program installed where the sandbox
cannot see or enter it is named, with what to do, before a tenant's run meets it; the shipped
catalogue's time server starts confined and lists its tools."""

from __future__ import annotations

import io
import os

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from capabilities.catalogue import ProgramTemplate
from capabilities.catalogue_check import program_problems
from capabilities.confinement import SandboxProfile
from capabilities.tests.confined_servers import needs_sandbox


def test_a_program_under_root_home_or_tmp_is_named_with_where_to_put_it(tmp_path):
    profile = SandboxProfile(uid=65534, gid=65534)
    [root] = program_problems("/root/.local/bin/mcp-server-x", profile)
    assert "does not exist" in root and "/usr/local" in root
    program = tmp_path / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    [tmp] = program_problems(str(program), profile)
    assert tmp.startswith(f"{program} is a fresh, empty tmpfs inside the sandbox") and "ro_binds" in tmp
    [missing] = program_problems("no-such-program-anywhere", profile)
    assert "is not on the sandbox's PATH" in missing
    assert program_problems("python3", profile) == []  # /usr/bin: seen and entered by anyone
    assert program_problems("/usr/bin/python3", profile) == []


def test_a_virtualenv_of_a_hidden_python_and_a_closed_directory_are_named(tmp_path):
    """The two mistakes operators made in issue 37's trials: a venv made from a pyenv Python
    under /root (its bin/python links there), and an install directory of mode 0700."""
    venv = tmp_path / "opt" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    profile = SandboxProfile(uid=65534, gid=65534, ro_binds=(str(tmp_path / "opt"),))
    [linked] = program_problems(str(venv / "bin" / "python"), profile)
    assert linked.startswith("/root/.pyenv/versions/3.11.7/bin/python3.11 (where its link leads) is hidden")
    assert "python3 -m venv" in linked

    closed = tmp_path / "opt" / "closed"
    closed.mkdir(mode=0o700)
    tool = closed / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o700)
    problems = program_problems(str(tool), profile)
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    if uid == os.stat(closed).st_uid:  # not root: the programs run as this user, who owns them
        assert not [p for p in problems if str(closed) in p]
        return
    assert any(p.startswith(f"the directory {closed} is mode 0700") and f"chmod o+x {closed}" in p for p in problems)
    assert any(p.startswith(f"{tool} is mode 0700") and f"chmod o+rx {tool}" in p for p in problems)


@needs_sandbox
@pytest.mark.django_db
@pytest.mark.timeout(90)
def test_the_command_starts_the_shipped_time_server_and_fails_a_hidden_one():
    call_command("catalogue_import", "deploy/catalogue.yaml", stdout=io.StringIO())
    ProgramTemplate.objects.create(slug="hidden-server", name="Hidden", kind="mcp_stdio",
                                   argv=["/root/servers/mcp-hidden", "--stdio"])
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 of 2 template"):
        call_command("catalogue_check", "mcp-server-time", "hidden-server", stdout=out)
    text = out.getvalue()
    assert "ok    mcp-server-time (mcp_stdio): 2 tools: get_current_time, convert_time" in text, text
    assert "FAIL  hidden-server (mcp_stdio)\n      - /root/servers/mcp-hidden does not exist" in text, text
    with pytest.raises(CommandError, match="No program template nope"):
        call_command("catalogue_check", "nope")
