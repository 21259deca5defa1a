"""Sub-agents: another agent of the tenant bound as a tool (capability kind ``agent``)."""
