"""CLI commands as :class:`capabilities.tools.Tool`: validate, render the argv, run it sandboxed.

No Django imports at module level (the bwrap path setting is read lazily). The runner builds a
:class:`CliTool` per bound command from a :class:`CliCommandConfig` (loaded and decrypted by
``sessions.runner.adapters.run_spec_load``).

Outcome rule: a command that ran is a *successful* tool call whatever its exit code, and
also when it was killed for its timeout or its output; the result's first line states which
(``exit code 1``, ``timed out after 5 s…``) with the output so far, and the model decides
what it means (``grep`` exits 1 for "no match", ``diff`` 1 for "differs"). Failed tool calls
are reserved for what the model can fix or must hear as a refusal: invalid arguments
(``invalid_arguments``), no sandbox (``sandbox_unavailable``) and a command stopped by a
resource limit of the sandbox (``resource_limit``: CPU time, memory, processes, file size or
open files; the message names the limit, then the output so far). The agent's own ``tool_timeout_seconds`` still applies on
top (the runner then records ``timed_out`` and the process group is killed on cancellation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from capabilities.cli.sandbox import CommandResult, SandboxPolicy, SandboxUnavailable, run_command
from capabilities.cli.template import ArgumentsInvalid, render_argv
from capabilities.confinement import SandboxProfile
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec


@dataclass(frozen=True, slots=True)
class CliCommandConfig:
    """One CLI command as the runner needs it: the tenant's ``CliCommand`` row over the operator's
    template (argv, schema, sandbox profile), its secrets decrypted into ``profile.env``."""

    name: str
    """The tool name (``[a-zA-Z0-9_-]{1,64}``)."""
    description: str
    argv_template: tuple[str, ...]
    parameters_schema: dict[str, Any]
    timeout_seconds: float = 30.0
    max_output_bytes: int = 64 * 1024
    profile: SandboxProfile = field(default_factory=SandboxProfile)
    """The sandbox (network, binds, environment with decrypted secrets: never logged)."""


class CliTool(Tool):
    """A bound CLI command offered to the model under ``exposed_name``."""

    untrusted = True  # command output can carry anything (file contents, network data)

    def __init__(self, config: CliCommandConfig, *, exposed_name: str | None = None) -> None:
        """Args:
            config: The command.
            exposed_name: The name the model sees (default ``config.name``).
        """
        if not (config.timeout_seconds > 0 and math.isfinite(config.timeout_seconds)):
            raise ValueError("timeout_seconds must be positive and finite")
        self.config = config
        self.spec = ToolSpec(
            name=exposed_name or config.name,
            description=config.description or f"Runs {config.argv_template[0]!r}.",
            parameters=config.parameters_schema or {"type": "object", "properties": {}},
        )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        """Validate ``arguments``, run the command, return its exit code and output.

        Returns:
            ToolResult: ``content`` a readable rendering; ``data`` =
            ``{exit_code, stdout, stderr, truncated, timed_out, stdout_dropped_bytes,
            stderr_dropped_bytes, duration_ms, sandboxed}``.

        Raises:
            ToolError: ``invalid_arguments`` (schema/option-injection message),
                ``sandbox_unavailable`` (bubblewrap, prlimit or setpriv missing on the worker),
                ``resource_limit`` (the command hit a limit of the sandbox: the message names it).

        Side effects: ``tool_call_progress`` events with the output lines as they come
        (``data.stream`` = ``stdout``/``stderr``).
        """
        try:
            argv = render_argv(list(self.config.argv_template), self.config.parameters_schema, arguments)
        except ArgumentsInvalid as exc:
            raise ToolError(f"Invalid arguments: {exc}", code="invalid_arguments") from exc
        policy = SandboxPolicy(
            timeout_seconds=self.config.timeout_seconds, max_output_bytes=self.config.max_output_bytes,
            profile=self.config.profile,
        )
        sent = {"stdout": 0, "stderr": 0}

        async def on_output(stream: str, text: str) -> None:
            sent[stream] += len(text)
            if context.publish is not None:
                await context.publish("tool_call_progress", {
                    "tool_call_id": context.tool_call_id, "message": text, "stream": stream,
                    "progress": sent["stdout"] + sent["stderr"], "total": None,
                })

        try:
            result = await run_command(argv, policy, on_output=on_output)
        except SandboxUnavailable as exc:
            raise ToolError(
                f"The command {self.config.name!r} cannot run: {exc}. Programs only run in the sandbox. "
                "Tell the user; do not retry.",
                code="sandbox_unavailable",
            ) from exc
        content = render_result(result, timeout_seconds=self.config.timeout_seconds)
        if result.limit_exceeded:
            raise ToolError(
                f"The command {self.config.name!r} was stopped by a limit of the sandbox (the operator's): "
                f"{result.limit_exceeded}.\n{content}",
                code="resource_limit",
            )
        return ToolResult(content=content, data={
            "exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
            "truncated": result.truncated, "timed_out": result.timed_out,
            "stdout_dropped_bytes": result.stdout_dropped_bytes, "stderr_dropped_bytes": result.stderr_dropped_bytes,
            "output_limit_exceeded": result.output_limit_exceeded, "duration_ms": result.duration_ms,
            "sandboxed": result.sandboxed,
        })


def render_result(result: CommandResult, *, timeout_seconds: float) -> str:
    """The text the model reads: status line, then stdout and stderr with truncation markers."""
    if result.timed_out:
        status = f"timed out after {timeout_seconds:g} s; the command and its children were killed"
    elif result.output_limit_exceeded:
        status = f"killed: output far over the limit (exit code {result.exit_code})"
    elif result.exit_code is not None and result.exit_code < 0:
        status = f"killed by signal {-result.exit_code}"
    else:
        status = f"exit code {result.exit_code}"
    parts = [status]
    for name, text, dropped in (("stdout", result.stdout, result.stdout_dropped_bytes),
                                ("stderr", result.stderr, result.stderr_dropped_bytes)):
        if not text and not dropped and name == "stderr":
            continue
        body = text if text or dropped else "(empty)"
        if dropped:
            body = body + ("" if body.endswith("\n") else "\n") + f"[… truncated {dropped} bytes]"
        parts.append(f"--- {name} ---\n{body.rstrip(chr(10))}")
    return "\n".join(parts)
