"""``scale_out.py --cgroups``' groups (bench/_cgroups.py), on a directory laid out as the cgroup
file systems are: where the groups go, and that every process goes back where it came from."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cgroups import CgroupsUnavailable, CpuCgroups, compose_cpu_shares  # noqa: E402


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


@pytest.mark.parametrize("version", [1, 2])
def test_with_a_parent_the_groups_sit_under_it(tmp_path: Path, version: int) -> None:
    if version == 1:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cgroup.procs").write_text("")
        mount, origin = tmp_path / "cpu", "1:cpu:/\n"
    else:
        (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
        (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
        mount, origin = tmp_path, "0::/\n"
    groups = CpuCgroups("bench-p", root=tmp_path, read_cgroup=lambda pid: origin, parent="docker")

    groups.place("web-0", [20])
    groups.place("worker-0", [30])
    assert groups.path("web-0") == mount / "docker" / "bench-p-web-0"
    assert _procs(mount / "docker" / "bench-p-web-0") == ["20"]
    assert _procs(mount / "docker" / "bench-p-worker-0") == ["30"]
    if version == 2:  # the parent hands the cpu controller on to its groups
        assert (mount / "docker" / "cgroup.subtree_control").read_text() == "+cpu\n"

    groups.close()
    assert _procs(mount) == ["20", "30"]


def test_a_groups_weight_is_docker_cpu_shares_on_v1_and_the_same_ratio_on_v2(tmp_path: Path) -> None:
    (tmp_path / "v1" / "cpu").mkdir(parents=True)
    (tmp_path / "v1" / "cpu" / "cgroup.procs").write_text("")
    v1 = CpuCgroups("bench-w", root=tmp_path / "v1", read_cgroup=lambda pid: "1:cpu:/\n")
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "v2" / "cgroup.subtree_control").write_text("cpu\n")
    v2 = CpuCgroups("bench-w", root=tmp_path / "v2", read_cgroup=lambda pid: "0::/\n")

    for groups in (v1, v2):
        groups.place("web-0", [20], shares=2048)
        groups.place("redis", [30])
    assert (v1.path("web-0") / "cpu.shares").read_text() == "2048\n"
    assert (v2.path("web-0") / "cpu.weight").read_text() == "200\n"  # cpu.weight's default is 100
    assert not (v1.path("redis") / "cpu.shares").exists() and not (v2.path("redis") / "cpu.weight").exists()


def test_compose_cpu_shares_reads_the_services_that_set_them(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yml"
    compose.write_text("services:\n  web:\n    cpu_shares: 2048\n  redis:\n    image: redis\n  beat:\n")
    assert compose_cpu_shares(compose) == {"web": 2048}
    compose.write_text("services:\n  web:\n    cpu_shares: lots\n")
    with pytest.raises(ValueError, match="web.cpu_shares must be an integer"):
        compose_cpu_shares(compose)
    compose.write_text("volumes: {}\n")
    with pytest.raises(ValueError, match="no services"):
        compose_cpu_shares(compose)
