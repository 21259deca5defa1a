"""CLI capabilities: admin-defined argv templates run in a bubblewrap sandbox.

- :mod:`capabilities.cli.template`: the template and parameter-schema rules, and rendering
  validated arguments into an argv (no Django).
- :mod:`capabilities.cli.sandbox`: running an argv under ``bwrap`` (or, explicitly
  unsandboxed, directly) with a timeout, an output cap and streamed output (no Django).
- :mod:`capabilities.cli.tool`: :class:`~capabilities.cli.tool.CliTool`, the Tool the runner sees.
- :mod:`capabilities.cli.models`: the ``CliCommand`` row an admin edits in the console.
"""
