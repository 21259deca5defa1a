"""The ``a2a`` capability kind: a remote A2A agent as a tool of our agents (:mod:`.kind`)."""
