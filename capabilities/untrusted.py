"""Outside content framed as data for a model: :func:`frame_untrusted`.

One framing for every place outside text reaches a model: the runner's untrusted tool results
and retrieved passages (:mod:`sessions.runner.tool_execution`, :mod:`sessions.runner.run_context`)
and the passages the knowledge MCP server returns to other AI systems (:mod:`knowledge.mcp_server`).
"""

from __future__ import annotations

import re
import secrets

_MARKER = re.compile(r"<\s*/?\s*untrusted-data", re.IGNORECASE)
"""An opening or closing framing marker (as a forger would write it) inside outside content."""


def frame_untrusted(content: str, *, nonce: str | None = None) -> str:
    """Wrap outside content as data for the model, between markers carrying a random nonce.

    The nonce (64 random bits, hex) is fresh per tool call, so text inside the content cannot
    forge the closing marker; markers inside the content (``<untrusted-data…``,
    ``</untrusted-data…``, any case) are defused besides (``<`` becomes ``&lt;``), so a
    model that ignores nonces is not fooled either. This is the "spotlighting" by delimiting
    defence of Hines et al., *Defending Against Indirect Prompt Injection Attacks With
    Spotlighting* (arXiv:2403.14720).

    Returns:
        ``<untrusted-data nonce="…">\\n{content}\\n</untrusted-data nonce="…">``.
    """
    nonce = nonce or secrets.token_hex(8)
    content = _MARKER.sub(lambda m: "&lt;" + m.group(0)[1:], content)
    return f'<untrusted-data nonce="{nonce}">\n{content}\n</untrusted-data nonce="{nonce}">'
