.PHONY: run test bench lint mutation

# Every recipe's Python may keep its bytecode (docs/operations-security.md, "Bytecode").
unexport PYTHONDONTWRITEBYTECODE

## Start the whole platform (model server, worker, web) on http://127.0.0.1:8000/
run:
	scripts/run.sh

## Run the whole test suite (sets everything up first)
test:
	scripts/test.sh

## Print the benchmark figures (see bench/README.md)
bench:
	scripts/bootstrap.sh
	.venv/bin/python bench/turn_overhead.py
	.venv/bin/python bench/concurrent_runs.py
	.venv/bin/python bench/door_overhead.py
	.venv/bin/python bench/openai_stream_fanout.py
	.venv/bin/python bench/stream_floor.py
	.venv/bin/python bench/fanout_receive.py
	.venv/bin/python bench/publish_overhead.py
	.venv/bin/python bench/compaction_savings.py
	.venv/bin/python bench/storage.py
	.venv/bin/python bench/router_overhead.py
	.venv/bin/python bench/router_chaos.py
	.venv/bin/python bench/mcp_overhead.py
	.venv/bin/python bench/web_fetch_overhead.py
	.venv/bin/python bench/cli_overhead.py
	.venv/bin/python bench/browser_roundtrip.py
	.venv/bin/python bench/embedding_throughput.py
	.venv/bin/python bench/knowledge_search.py
	.venv/bin/python bench/knowledge_quality.py
	.venv/bin/python bench/memory_tokens.py
	.venv/bin/python bench/guardrails.py

## Static checks (ruff: the rule set in pyproject.toml [tool.ruff]) and the layer contracts (import-linter, pyproject.toml)
lint:
	.venv/bin/ruff check .
	PYTHONPATH=. .venv/bin/lint-imports

## Mutation testing on demand, never in CI (scripts/mutation.sh --list; TARGETS="naming router" for some)
mutation:
	scripts/mutation.sh $(TARGETS)
