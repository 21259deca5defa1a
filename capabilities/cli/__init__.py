"""CLI capabilities: operator-defined argv templates (the catalogue) run confined.

- :mod:`capabilities.cli.template`: the template and parameter-schema rules, and rendering
  validated arguments into an argv (no Django).
- :mod:`capabilities.cli.sandbox`: running an argv confined (:mod:`capabilities.confinement`)
  with a timeout, an output cap and streamed output (no Django).
- :mod:`capabilities.cli.tool`: :class:`~capabilities.cli.tool.CliTool`, the Tool the runner sees.
- :mod:`capabilities.cli.models`: the ``CliCommand`` row a tenant admin makes from a template.
"""
