"""``scale_out.py --cgroups``' groups (bench/_cgroups.py), on a directory laid out as the cgroup
file systems are: where the groups go, and that every process goes back where it came from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cgroups import CgroupsUnavailable, CpuCgroups  # noqa: E402


def _procs(path: Path) -> list[str]:
    return (path / "cgroup.procs").read_text().split()


def test_cgroup_v1_groups_take_the_processes_and_give_them_back(tmp_path: Path) -> None:
    (tmp_path / "cpu" / "system.slice" / "postgresql").mkdir(parents=True)
    (tmp_path / "cpu" / "cgroup.procs").write_text("")
    origins = {10: "1:cpu,cpuacct:/system.slice/postgresql\n0::/\n", 11: "1:cpu,cpuacct:/system.slice/postgresql\n",
               20: "2:memory:/x\n1:cpu:/\n"}

    def read_cgroup(pid: int) -> str:
        if pid not in origins:
            raise FileNotFoundError(f"/proc/{pid}/cgroup")
        return origins[pid]

    groups = CpuCgroups("bench-x", root=tmp_path, read_cgroup=read_cgroup)

    groups.place("postgres", [10, 11])
    groups.place("web-0", [20])
    groups.place("web-0", [99])  # gone meanwhile: /proc/99/cgroup is not there
    assert groups.version == 1 and groups.path("postgres") == tmp_path / "cpu" / "bench-x-postgres"
    assert _procs(groups.path("postgres")) == ["10", "11"]
    assert _procs(groups.path("web-0")) == ["20"]

    groups.close()
    assert _procs(tmp_path / "cpu" / "system.slice" / "postgresql") == ["10", "11"]
    assert _procs(tmp_path / "cpu") == ["20"]


def test_cgroup_v2_groups_sit_at_the_top_of_the_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (tmp_path / "user.slice").mkdir()
    groups = CpuCgroups("bench-y", root=tmp_path, read_cgroup=lambda pid: "0::/user.slice\n")

    groups.place("redis", [7])
    assert groups.version == 2
    assert _procs(tmp_path / "bench-y-redis") == ["7"]
    groups.close()
    assert _procs(tmp_path / "user.slice") == ["7"]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "no cgroup v1 cpu hierarchy or cgroup v2 cpu controller"),
        ({"cgroup.controllers": "cpu io", "cgroup.subtree_control": "io"}, "not enabled for its children"),
        ({"cgroup.controllers": "cpu", "cgroup.subtree_control": "cpu", "bench-z-redis": ""}, "cannot create"),
    ],
)
def test_without_a_usable_hierarchy_it_says_why(tmp_path: Path, files: dict[str, str], reason: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)  # (bench-z-redis: a file where the group should go)
    with pytest.raises(CgroupsUnavailable, match=reason):
        CpuCgroups("bench-z", root=tmp_path, read_cgroup=lambda pid: "0::/\n").place("redis", [7])
