#!/usr/bin/env bash
# Mutation testing, on demand (never in CI): mutmut 3 over bounded module sets of the run engine,
# the router, tenancy and the capabilities, each run against its own fast tests.
#
#   scripts/mutation.sh --list            # the targets: modules mutated, tests run
#   scripts/mutation.sh naming            # one target (make mutation TARGETS=naming)
#   scripts/mutation.sh                   # every target (hours on 2 cores)
#   MUTATION_SAMPLE=150 scripts/mutation.sh run-engine router   # a seeded sample of each
#
# Each target works in a scratch copy of the tree, $MUTATION_DIR/<target>/ (outside the
# repository, so pytest never collects it; mutmut writes its mutated copy to mutants/ there;
# the working tree is never changed), with its own test
# database and Redis prefix (TEST_ISOLATION=mutation-<target>). At the end of each target it
# prints: mutants, killed (a test failed, timed out or was ended by a signal), survived, no
# tests, and the kill rate = killed / (killed + survived + suspicious), the mutants the tests
# reached. The survivors are listed: judge each (a meaningful gap gets a test; an equivalent
# mutant, such as a changed log message, does not). To look at one:
#   cd "$MUTATION_DIR/<target>" && <repo>/.venv/bin/mutmut show <mutant name>
#
# Environment:
#   MUTATION_JOBS    mutants at once (default 1: the tests share one database)
#   MUTATION_DIR     scratch directory (default ${TMPDIR:-/tmp}/agent-platform-mutation)
#   MUTATION_SAMPLE  N: test a seeded random sample of N of the target's mutants instead of all
#                    (the run engine has thousands; each takes seconds to minutes). The mutants
#                    are generated first (no test runs), listed from mutants/**/*.meta, sampled
#                    with MUTATION_SEED (default 24), and `mutmut run <names>` tests only those.
#                    The kill rate is then an estimate: it is printed with its 95 % Wilson score
#                    interval over the sampled mutants the tests reached.
#   MUTATION_SEED    the sample's seed (default 24): the same seed, tree and target give the
#                    same mutants, so two runs of one tree are comparable.
#   MUTATION_TREE    the tree to copy and mutate (default this repository's working tree,
#                    uncommitted edits included); e.g. an earlier commit for a before/after
#                    comparison: `git archive <commit> | tar -x -C /tmp/before`. This
#                    repository's .venv and var/ are used; the target's modules and tests must
#                    exist in that tree. A tree with other migrations needs its own test
#                    database: MUTATION_TAG (default: the tree's directory name when it is not
#                    this repository) is added to the scratch directory and TEST_ISOLATION.
#   MUTATION_TESTS   the tests to run instead of the target's own (space-separated pytest
#                    paths), e.g. the test files an earlier MUTATION_TREE had.
#   MUTATION_PYTEST_ARGS  more pytest arguments for every test run (split on spaces), e.g.
#                    "--deselect <test id>" for a timing-sensitive test that fails on a
#                    saturated machine: mutmut stops at any failure of its clean runs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MUTMUT=$ROOT/.venv/bin/mutmut
PYTHON=$ROOT/.venv/bin/python
JOBS=${MUTATION_JOBS:-1}
WORK=${MUTATION_DIR:-${TMPDIR:-/tmp}/agent-platform-mutation}
case "$(realpath -m "$WORK")/" in
  "$ROOT"/*) echo "MUTATION_DIR must be outside the repository (pytest would collect the copies)"; exit 2 ;;
esac
SAMPLE=${MUTATION_SAMPLE:-}
SEED=${MUTATION_SEED:-24}
if [[ -n $SAMPLE && ! $SAMPLE =~ ^[1-9][0-9]*$ ]]; then
  echo "MUTATION_SAMPLE must be a positive number of mutants (got '$SAMPLE')"; exit 2
fi
[[ $SEED =~ ^[0-9]+$ ]] || { echo "MUTATION_SEED must be a non-negative integer (got '$SEED')"; exit 2; }
SRC=$(realpath "${MUTATION_TREE:-$ROOT}") || { echo "MUTATION_TREE not found: $MUTATION_TREE"; exit 2; }
[[ -f $SRC/manage.py ]] || { echo "MUTATION_TREE is not a tree of this project (no manage.py): $SRC"; exit 2; }
if [[ $SRC == "$ROOT" ]]; then TAG=${MUTATION_TAG:-}; else TAG=${MUTATION_TAG:-$(basename "$SRC")}; fi
[[ $TAG =~ ^[A-Za-z0-9_-]*$ ]] || { echo "MUTATION_TAG may hold letters, digits, - and _ only (got '$TAG')"; exit 2; }

# target | modules mutated (space-separated) | tests (space-separated pytest paths/node ids)
TARGETS=(
  "naming|capabilities/naming.py|capabilities/tests/test_naming.py capabilities/tests/test_naming_guards.py"
  "approval-policy|agents/models.py capabilities/toolsets.py|sessions/tests/test_refactor_guards.py sessions/tests/test_approvals.py capabilities/tests/test_cli_models.py capabilities/tests/test_kind_registry.py capabilities/tests/test_toolsets.py agents/tests/test_agent_checks.py"
  "origins|browser/origins.py|browser/tests/test_server_origins.py browser/tests/test_origin_rules.py"
  "cli-template|capabilities/cli/template.py|capabilities/tests/test_cli_models.py capabilities/tests/test_cli.py"
  "llm-errors|llm/errors.py|llm/tests/test_errors.py"
  "router|llm/router.py llm/health.py|llm/tests/test_router.py llm/tests/test_timeouts.py llm/tests/test_health.py llm/tests/test_model.py"
  "tenancy|tenants/context.py tenants/scoping.py tenants/rls.py tenants/api/mixins.py|tenants/tests agent_platform/tests/test_tenant_isolation.py agent_platform/tests/test_tenant_isolation_app_layer.py"
  "confinement|capabilities/confinement.py|capabilities/tests/test_confinement.py capabilities/tests/test_sandbox_limits.py capabilities/tests/test_sandbox_location.py"
  "egress|capabilities/egress.py capabilities/checked_proxy.py|capabilities/tests/test_egress_proxy.py capabilities/tests/test_confinement.py"
  "netsafe|capabilities/netsafe.py|capabilities/tests/test_netsafe_outbound.py capabilities/tests/test_web_fetch.py"
  "run-lifecycle|sessions/runs/transitions.py sessions/runs/claim.py sessions/runs/ending.py sessions/runs/cancellation.py sessions/runs/approvals.py sessions/runs/subruns.py sessions/runs/handoff.py|sessions/tests/test_run_lifecycle.py sessions/tests/test_run_controls.py sessions/tests/test_approvals.py sessions/tests/test_cancellation.py sessions/tests/test_durability.py sessions/tests/test_subrun_approvals.py sessions/tests/test_run_handoff.py"
  "retrieval|knowledge/retrieval.py|knowledge/tests/test_retrieval.py knowledge/tests/test_retrieval_overlap.py knowledge/tests/test_retrieval_quality.py knowledge/tests/test_search_first.py"
  "memory|memory/services.py|memory/tests/test_api.py memory/tests/test_extract.py memory/tests/test_extraction.py memory/tests/test_scan_retention_recall.py memory/tests/test_recall_run.py"
  "run-engine|sessions/runner/loop.py sessions/runner/turn.py sessions/runner/streaming.py sessions/runner/tool_execution.py sessions/runner/compaction.py sessions/runner/cancellation.py sessions/runner/compression.py sessions/runner/toolset.py sessions/runner/interceptors.py sessions/runner/subrun.py|sessions/tests/test_runner.py sessions/tests/test_refactor_guards.py sessions/tests/test_approvals.py sessions/tests/test_compaction.py sessions/tests/test_cancel_hub.py sessions/tests/test_cancel_pubsub_guard.py sessions/tests/test_cancellation.py sessions/tests/test_subruns.py sessions/tests/test_budgets.py sessions/tests/test_runner_hardening.py sessions/tests/test_turn_steps.py sessions/tests/test_streamed_text.py sessions/tests/test_loop_ports.py sessions/tests/test_run_controls.py sessions/tests/test_mutation_gaps.py sessions/tests/test_tool_interceptors.py"
)

list_targets() {
  for t in "${TARGETS[@]}"; do
    IFS='|' read -r name modules tests <<<"$t"
    printf '%-16s mutates: %s\n%-16s tests:   %s\n' "$name" "$modules" "" "$tests"
  done
}

run_target() {
  local name=$1 modules=$2 tests=$3 ws=$WORK/$1${TAG:+-$TAG} isolation=mutation-$1${TAG:+-$TAG} p missing=()
  echo "== mutation: $name ($modules)${TAG:+ in $SRC}${SAMPLE:+, a sample of $SAMPLE mutants (seed $SEED)}"
  for p in $modules $tests; do [[ -e $SRC/$p ]] || missing+=("$p"); done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "not in $SRC: ${missing[*]}"; return 1
  fi
  rm -rf "$ws"
  mkdir -p "$ws"
  rsync -a --exclude .venv --exclude var --exclude .git --exclude node_modules --exclude __pycache__ \
    --exclude mutants "$SRC/" "$ws/"
  mkdir -p "$ws/mutants"
  ln -s "$ROOT/var" "$ws/mutants/var"  # the settings read var/secrets.env next to the code
  "$PYTHON" - "$ws/pyproject.toml" "$modules" "$tests" "${MUTATION_PYTEST_ARGS:-}" <<'EOF'
import json, os, sys
path, modules, tests, extra = sys.argv[1:]
modules, tests = modules.split(), tests.split()
packages = sorted({m.split("/")[0] for m in modules})
# Everything else at the top of the tree is copied into mutants/ as it is: a test run imports
# every installed app (the tree's own list, whichever apps it has), conftest.py, scripts/...
also_copy = sorted(p for p in os.listdir(os.path.dirname(path))
                   if p not in packages and p not in ("mutants", "pyproject.toml") and not p.startswith("."))
with open(path, "a", encoding="utf-8") as f:
    f.write("\n[tool.mutmut]\n")
    f.write(f"source_paths = {json.dumps(packages)}\n")
    f.write(f"only_mutate = {json.dumps(modules)}\n")
    f.write(f"also_copy = {json.dumps(also_copy)}\n")
    args = ["-p", "no:cacheprovider", "--reuse-db", "-m", "not local_model", *extra.split()]
    f.write(f"pytest_add_cli_args = {json.dumps(args)}\n")
    f.write(f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n")
EOF
  local names=()
  if [[ -n $SAMPLE ]]; then
    # Generate the mutants without running a test (what `mutmut run` does first; it skips a
    # file already generated), then draw the sample from their names in the .meta files.
    (cd "$ws" && "$PYTHON" - "$JOBS" <<'EOF'
import os, sys
from mutmut.__main__ import create_mutants
from mutmut.utils.file_utils import copy_src_dir
os.makedirs("mutants", exist_ok=True)
copy_src_dir()
stats = create_mutants(int(sys.argv[1]))
print(f"generated: {stats.mutated} files mutated, {stats.ignored} copied")
EOF
    ) || { echo "mutant generation failed for $name"; return 1; }
    mapfile -t names < <(cd "$ws" && "$PYTHON" - "$SAMPLE" "$SEED" <<'EOF'
import json, random, sys
from pathlib import Path
n, seed = int(sys.argv[1]), int(sys.argv[2])
every = sorted(k for meta in Path("mutants").rglob("*.py.meta")
               for k in json.loads(meta.read_text())["exit_code_by_key"])
chosen = sorted(random.Random(seed).sample(every, min(n, len(every))))
Path("sample.txt").write_text("".join(f"{k}\n" for k in chosen))
print(f"{len(every)} mutants generated, {len(chosen)} sampled", file=sys.stderr)
print("\n".join(chosen))
EOF
    )
    [[ ${#names[@]} -gt 0 ]] || { echo "no mutants to sample for $name"; return 1; }
  fi
  # The sandbox runs programs from the real environment (bubblewrap does not follow the symlink):
  # the one agent_platform/sandbox_paths.py names for this checkout.
  sandbox_venv=$(cd "$ROOT" && "$PYTHON" -m agent_platform.sandbox_paths)
  # The mutated tree first on sys.path (the project is also installed editable in .venv, a .pth
  # naming this checkout): without it the retrieval target's clean run found no rows (searches
  # returned [], most likely a module imported from both trees, with two tenant-scope
  # ContextVars); with it that run passes and the other targets are unchanged in kind.
  (cd "$ws" && PYTHONPATH="$ws/mutants${PYTHONPATH:+:$PYTHONPATH}" TEST_ISOLATION="$isolation" \
     SANDBOX_PYTHON="$sandbox_venv/bin/python" \
     SANDBOX_RO_BINDS="$sandbox_venv" "$MUTMUT" run --max-children "$JOBS" "${names[@]}") || {
    echo "mutmut run failed for $name (see above)"; return 1; }
  (cd "$ws" && "$PYTHON" - "$name" <<'EOF'
# Counts from mutmut's own per-file results (mutants/**/*.meta, exit code per mutant, read
# with mutmut's status_by_exit_code), over the sample when there is one.
import json, math, sys
from pathlib import Path
from mutmut.stats import status_by_exit_code
name = sys.argv[1]
status = {}
for meta in Path("mutants").rglob("*.py.meta"):
    for key, code in json.loads(meta.read_text())["exit_code_by_key"].items():
        status[key] = status_by_exit_code[code]
sample = Path("sample.txt")
keys = sample.read_text().split() if sample.exists() else sorted(status)
count = {}
for k in keys:
    count[status[k]] = count.get(status[k], 0) + 1
# Killed: a test failed, the CPU limit ended it (timeout) or a signal did (mutmut calls a
# SIGKILL/SIGSEGV exit "segfault"): each is a run of the tests the mutant did not pass.
killed = count.get("killed", 0) + count.get("timeout", 0) + count.get("segfault", 0)
reached = killed + count.get("survived", 0) + count.get("suspicious", 0)
line = (f"== {name}: {len(keys)} mutants{' (sampled of ' + str(len(status)) + ')' if sample.exists() else ''}, "
        f"{killed} killed ({count.get('timeout', 0)} by timeout, {count.get('segfault', 0)} by a signal), "
        f"{count.get('survived', 0)} survived, {count.get('suspicious', 0)} suspicious, "
        f"{count.get('no tests', 0)} without tests, {count.get('skipped', 0)} skipped, "
        f"{count.get('not checked', 0)} not checked")
if reached:
    p = killed / reached
    line += f": kill rate {100 * p:.1f} % ({killed}/{reached})"
    if sample.exists():
        # 95 % Wilson score interval for a binomial proportion (E. B. Wilson, "Probable
        # inference, the law of succession, and statistical inference", JASA 22 (1927),
        # 209-212; Agresti & Coull, The American Statistician 52 (1998), 119-126): unlike
        # p +- z*sqrt(p(1-p)/n) it stays inside [0, 1] and keeps its coverage near p = 1.
        # Drawn without replacement from a finite set, the true interval is a little narrower.
        z = 1.959964
        centre = (p + z * z / (2 * reached)) / (1 + z * z / reached)
        half = z / (1 + z * z / reached) * math.sqrt(p * (1 - p) / reached + z * z / (4 * reached * reached))
        line += f", 95 % CI {100 * (centre - half):.1f}-{100 * (centre + half):.1f} %"
else:
    line += ": no mutant reached by the tests"
print(line)
for k in keys:
    if status[k] in ("survived", "suspicious", "check was interrupted by user"):
        print(f"    {k}: {status[k]}")
EOF
  )
}

if [[ ${1:-} == "--list" ]]; then
  list_targets
  exit 0
fi
wanted=("$@")
known=" $(for t in "${TARGETS[@]}"; do printf '%s ' "${t%%|*}"; done)"
for w in "${wanted[@]}"; do
  [[ $known == *" $w "* ]] || { echo "unknown target: $w (scripts/mutation.sh --list)"; exit 2; }
done
failed=0
for t in "${TARGETS[@]}"; do
  IFS='|' read -r name modules tests <<<"$t"
  if [[ ${#wanted[@]} -gt 0 && ! " ${wanted[*]} " == *" $name "* ]]; then
    continue
  fi
  run_target "$name" "$modules" "${MUTATION_TESTS:-$tests}" || failed=1
done
exit $failed
