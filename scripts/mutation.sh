#!/usr/bin/env bash
# Mutation testing, on demand (never in CI): mutmut 3 over bounded module sets of the run engine,
# the router, tenancy and the capabilities, each run against its own fast tests.
#
#   scripts/mutation.sh --list            # the targets: modules mutated, tests run
#   scripts/mutation.sh naming            # one target (make mutation TARGETS=naming)
#   scripts/mutation.sh                   # every target (hours on 2 cores)
#
# Each target works in a scratch copy of the tree, $MUTATION_DIR/<target>/ (outside the
# repository, so pytest never collects it; mutmut writes its mutated copy to mutants/ there;
# the working tree is never changed), with its own test
# database and Redis prefix (TEST_ISOLATION=mutation-<target>). At the end of each target it
# prints: mutants, killed (a test failed or timed out), survived, no tests, and the kill rate
# = killed / (killed + survived + suspicious), the mutants the tests reached. The survivors
# are listed (`mutmut results`): judge each (a meaningful gap gets a test; an equivalent
# mutant, such as a changed log message, does not). To look at one:
#   cd "$MUTATION_DIR/<target>" && <repo>/.venv/bin/mutmut show <mutant name>
#
# Environment: MUTATION_JOBS (mutants at once, default 1: the tests share one database),
# MUTATION_DIR (default ${TMPDIR:-/tmp}/agent-platform-mutation).
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

# target | modules mutated (space-separated) | tests (space-separated pytest paths/node ids)
TARGETS=(
  "naming|capabilities/naming.py|capabilities/tests/test_naming.py capabilities/tests/test_naming_guards.py"
  "approval-policy|agents/models.py capabilities/toolsets.py|sessions/tests/test_refactor_guards.py sessions/tests/test_approvals.py capabilities/tests/test_cli_models.py capabilities/tests/test_kind_registry.py"
  "origins|browser/origins.py|browser/tests/test_server_origins.py"
  "cli-template|capabilities/cli/template.py|capabilities/tests/test_cli_models.py capabilities/tests/test_cli.py"
  "llm-errors|llm/errors.py|llm/tests/test_errors.py"
  "router|llm/router.py llm/health.py|llm/tests/test_router.py llm/tests/test_timeouts.py llm/tests/test_health.py"
  "tenancy|tenants/context.py tenants/scoping.py tenants/rls.py tenants/api/mixins.py|tenants/tests agent_platform/tests/test_tenant_isolation.py agent_platform/tests/test_tenant_isolation_app_layer.py"
  "run-engine|sessions/runner/loop.py sessions/runner/turn.py sessions/runner/streaming.py sessions/runner/tool_execution.py sessions/runner/compaction.py sessions/runner/cancellation.py sessions/runner/compression.py sessions/runner/toolset.py sessions/runner/subrun.py|sessions/tests/test_runner.py sessions/tests/test_refactor_guards.py sessions/tests/test_approvals.py sessions/tests/test_compaction.py sessions/tests/test_cancel_hub.py sessions/tests/test_cancel_pubsub_guard.py sessions/tests/test_cancellation.py sessions/tests/test_subruns.py sessions/tests/test_budgets.py sessions/tests/test_runner_hardening.py sessions/tests/test_turn_steps.py sessions/tests/test_streamed_text.py"
)

# Everything a test run imports besides the mutated packages (copied into mutants/).
TREE=(agent_platform agents browser capabilities console documents frontend llm sessions tenants
      chrome_extension deploy scripts conftest.py manage.py)

list_targets() {
  for t in "${TARGETS[@]}"; do
    IFS='|' read -r name modules tests <<<"$t"
    printf '%-16s mutates: %s\n%-16s tests:   %s\n' "$name" "$modules" "" "$tests"
  done
}

run_target() {
  local name=$1 modules=$2 tests=$3 ws=$WORK/$1
  echo "== mutation: $name ($modules)"
  rm -rf "$ws"
  mkdir -p "$ws"
  rsync -a --exclude .venv --exclude var --exclude .git --exclude node_modules --exclude __pycache__ \
    --exclude mutants "$ROOT/" "$ws/"
  mkdir -p "$ws/mutants"
  ln -s "$ROOT/var" "$ws/mutants/var"  # the settings read var/secrets.env next to the code
  "$PYTHON" - "$ws/pyproject.toml" "$modules" "$tests" "${TREE[@]}" <<'EOF'
import json, sys
path, modules, tests, *tree = sys.argv[1:]
modules, tests = modules.split(), tests.split()
packages = sorted({m.split("/")[0] for m in modules})
also_copy = [p for p in tree if p not in packages]
with open(path, "a", encoding="utf-8") as f:
    f.write("\n[tool.mutmut]\n")
    f.write(f"source_paths = {json.dumps(packages)}\n")
    f.write(f"only_mutate = {json.dumps(modules)}\n")
    f.write(f"also_copy = {json.dumps(also_copy)}\n")
    f.write('pytest_add_cli_args = ["-p", "no:cacheprovider", "--reuse-db", "-m", "not local_model"]\n')
    f.write(f"pytest_add_cli_args_test_selection = {json.dumps(tests)}\n")
EOF
  # The sandbox runs programs from the real var/sandbox (bubblewrap does not follow the symlink).
  (cd "$ws" && TEST_ISOLATION="mutation-$name" SANDBOX_PYTHON="$ROOT/var/sandbox/venv/bin/python" \
     SANDBOX_RO_BINDS="$ROOT/var/sandbox/venv" "$MUTMUT" run --max-children "$JOBS") || {
    echo "mutmut run failed for $name (see above)"; return 1; }
  (cd "$ws" && "$MUTMUT" export-cicd-stats >/dev/null && "$MUTMUT" results || true)
  "$PYTHON" - "$ws/mutants/mutmut-cicd-stats.json" "$name" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
killed = s["killed"] + s["timeout"]
reached = killed + s["survived"] + s["suspicious"]
rate = 100.0 * killed / reached if reached else 0.0
print(f"== {sys.argv[2]}: {s['total']} mutants, {killed} killed ({s['timeout']} by timeout), "
      f"{s['survived']} survived, {s['suspicious']} suspicious, {s['no_tests']} without tests, "
      f"{s['skipped']} skipped: kill rate {rate:.1f} %")
EOF
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
  run_target "$name" "$modules" "$tests" || failed=1
done
exit $failed
