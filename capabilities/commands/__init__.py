"""Slash commands: tenant-written prompt templates (:class:`~capabilities.commands.models.Command`)
bound to agents with the capability kind ``command``, and the MCP prompts of an agent's servers
(:mod:`capabilities.mcp.prompts`), both offered in the chat app's ``/`` picker."""
