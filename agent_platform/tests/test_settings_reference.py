"""docs/settings.md is what scripts/settings_reference.py makes of agent_platform/settings.py
today: a setting added, removed or re-described without regenerating fails here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_SOURCE = (ROOT / "agent_platform" / "settings.py").read_text(encoding="utf-8")


def _generator():
    spec = importlib.util.spec_from_file_location("settings_reference", ROOT / "scripts" / "settings_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("settings_reference", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_docs_settings_md_is_up_to_date() -> None:
    expected = _generator().generate()
    current = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert current == expected, (
        "docs/settings.md is out of date with agent_platform/settings.py: run "
        "`.venv/bin/python scripts/settings_reference.py` and commit docs/settings.md")


def test_every_variable_settings_py_reads_is_listed() -> None:
    """Whatever way settings.py reads a variable (``os.environ.get``, ``_env_bool``, ``_secret``,
    ``_gc_thresholds``), it is in the reference, with the default the code uses."""
    generator = _generator()
    names = {v.name for v in generator.collect(SETTINGS_SOURCE)}
    in_source = set(re.findall(r'(?:os\.environ\.get|_env_bool|_secret|_gc_thresholds)\(\s*"([A-Z][A-Z0-9_]*)"',
                               SETTINGS_SOURCE))
    assert in_source and in_source - names == set()
    by_name = {v.name: v for v in generator.collect(SETTINGS_SOURCE)}
    assert by_name["RUN_STALE_SECONDS"].default == "`30`"
    assert by_name["DEBUG"].default == "`0`"  # _env_bool("DEBUG", False)
    assert by_name["RUN_HOST_GC_THRESHOLDS"].default == "`50000,20,100`"  # the helper's own default
    assert by_name["INVITATION_TTL_SECONDS"].default == "`604800`"  # str(7 * 24 * 3600)
    assert by_name["WORKER_CONCURRENCY"].setting == "CELERY_WORKER_CONCURRENCY"
    assert "DATABASE_URL" in names  # read through local_secrets, listed from the module docstring


def test_a_setting_added_without_regenerating_is_caught() -> None:
    """The check bites: a new variable (with its comment) changes the reference."""
    generator = _generator()
    source = SETTINGS_SOURCE + (
        '\n# How many widgets a worker keeps (a made-up setting for this test).\n'
        'WIDGETS_PER_WORKER = int(os.environ.get("WIDGETS_PER_WORKER", "7"))\n')
    text = generator.generate(source)
    assert text != generator.generate(SETTINGS_SOURCE)
    assert "| `WIDGETS_PER_WORKER` | `7` | `WIDGETS_PER_WORKER` |" in text
    assert "How many widgets a worker keeps" in text
