"""The collector tuning of the web process (agent_platform/asgi.py) and the worker's run host.

The ASGI module is imported in a child process with the production settings module, so this
process's collector is left alone and the tuning is seen as a served app would have it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_platform.gc_tuning import gc_freeze_and_set_thresholds

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

ROOT = Path(__file__).resolve().parents[2]
_PROBE = "import gc, json, agent_platform.asgi; print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))"


def _import_in_a_child(web_gc_thresholds: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agent_platform.settings"}
    env.pop("WEB_GC_THRESHOLDS", None)
    if web_gc_thresholds is not None:
        env["WEB_GC_THRESHOLDS"] = web_gc_thresholds
    return subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _import_the_app(web_gc_thresholds: str | None) -> tuple[list[int], int]:
    out = _import_in_a_child(web_gc_thresholds)
    assert out.returncode == 0, out.stderr
    thresholds, frozen = json.loads(out.stdout.strip().splitlines()[-1])
    return thresholds, frozen


def test_the_served_app_freezes_its_set_up_and_sets_the_thresholds() -> None:
    thresholds, frozen = _import_the_app("40000,15,90")
    assert thresholds == [40000, 15, 90]
    assert frozen > 10_000  # Django, the project and its libraries: far more than this


def test_by_default_the_web_process_collects_its_young_objects_in_small_pieces() -> None:
    """Each message POST leaves ~200 objects in reference cycles (DRF's serializer fields,
    asgiref's locals). With the worker's thresholds (50000,20,100) a web process collected
    ~60,000 of them at once, stopping all its streams for 166–579 ms two or three times a
    round of 600 runs; with young collections of at most a few thousand objects, and
    generation 1 every ten of them, the longest of a round took 36–105 ms (bench/README.md,
    "Where a token's time goes, and the web process's young collections")."""
    thresholds, frozen = _import_the_app(None)
    assert thresholds[0] <= 2000 and thresholds[1] <= 10
    assert frozen > 10_000


def test_an_empty_setting_leaves_the_collector_as_cpython_sets_it() -> None:
    thresholds, frozen = _import_the_app("")
    default = subprocess.run([sys.executable, "-c", "import gc, json; print(json.dumps(gc.get_threshold()))"],
                             capture_output=True, text=True, timeout=60, check=True)
    assert thresholds == json.loads(default.stdout) and frozen == 0


def test_bad_thresholds_are_refused() -> None:
    out = _import_in_a_child("0,10,10")
    assert out.returncode != 0 and "WEB_GC_THRESHOLDS must be empty or three positive integers" in out.stderr
    with pytest.raises(ValueError, match="three positive integers"):
        gc_freeze_and_set_thresholds((700, 10))
