"""``web_fetch`` and ``web_read``: read the public web, safely.

Both fetch through :func:`capabilities.netsafe.safe_fetch` (SSRF-safe: public addresses only,
checked per redirect hop and on the connected socket; size cap; timeouts; a fresh client and
no cookies per call). Their results come from outside the platform, so both tools are
``untrusted``: the runner frames their output as data before the model reads it. Error
messages never quote the fetched body (they are not framed).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin, urlsplit

from bs4 import BeautifulSoup, Comment
from markdownify import MarkdownConverter

from capabilities import netsafe
from capabilities.builtin.registration import register_builtin
from capabilities.tools import Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

READ_MAX_BYTES = 2_000_000
"""``web_read`` reads at most 2 MB of HTML."""
READ_DEFAULT_CHARS = 15_000
"""Below the runner's 16,000-character artifact threshold (``sessions.runner.compression``), so
a default read reaches the model whole; longer results are stored as artifacts by the runner."""
READ_MAX_CHARS = 40_000


def _tool_error(exc: netsafe.FetchError) -> ToolError:
    return ToolError(exc.message, code=exc.code)


def _status_error(result: netsafe.FetchResult) -> ToolError:
    return ToolError(
        f"HTTP {result.status_code} {result.reason} from {_short(result.url)}. The page could not be fetched"
        + (" (it may need a login, or the URL is wrong)." if result.status_code < 500 else " (server error; try later)."),
        code="http_error",
    )


def _short(url: str, limit: int = 300) -> str:
    return url if len(url) <= limit else url[:limit] + "…"


def _artifact_name(url: str, default: str) -> str:
    name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    name = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:100]
    return name or default


FETCH_DESCRIPTION = f"""Fetch a public web URL with HTTP GET and return its status, final URL, content type and body.

Use it for raw content: JSON APIs, plain text, source files, feeds. For reading an article or
documentation page as clean Markdown, use `web_read` instead. Only public internet addresses
can be fetched (internal, private and metadata addresses are refused). Redirects are followed
(at most {netsafe.MAX_REDIRECTS}). The body is cut at `max_bytes` (default {netsafe.DEFAULT_MAX_BYTES:,},
at most {netsafe.HARD_MAX_BYTES:,}) with a marker. Binary bodies (images, PDFs…) are saved as an
artifact and reported by id. HTTP errors (4xx/5xx) fail the call with the status. Long text
results are stored by the platform; read the rest with `read_artifact`."""


@register_builtin("web_fetch")
class WebFetchTool(Tool):
    """HTTP GET of a public URL (see :data:`FETCH_DESCRIPTION`).

    Arguments: ``url`` (http/https), ``max_bytes`` (1 … 5,000,000; default 1,000,000).
    Result data: ``{status, url, content_type, bytes, truncated, redirects, artifact_id}``.
    Errors (``ToolError.code``): ``invalid_url``, ``invalid_arguments``, ``blocked_address``,
    ``timeout``, ``http_error`` (DNS/connection/TLS failure, too many redirects, status ≥ 400).
    A body longer than ``max_bytes`` is cut with a marker (not an error). Side effect: a
    binary body is stored as an Artifact (``artifact_updated``). Long text is returned whole:
    the runner stores results over 16,000 characters as artifacts and shows the model a preview.
    """

    untrusted = True
    spec = ToolSpec(
        name="web_fetch",
        description=FETCH_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "An http:// or https:// URL."},
                "max_bytes": {"type": "integer", "minimum": 1, "maximum": netsafe.HARD_MAX_BYTES,
                              "default": netsafe.DEFAULT_MAX_BYTES,
                              "description": "Cut the body after this many bytes."},
            },
            "required": ["url"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        max_bytes = arguments.get("max_bytes", netsafe.DEFAULT_MAX_BYTES)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= netsafe.HARD_MAX_BYTES:
            raise ToolError(f"`max_bytes` must be an integer from 1 to {netsafe.HARD_MAX_BYTES:,}.",
                            code="invalid_arguments")
        try:
            result = await netsafe.safe_fetch(arguments.get("url"), max_bytes=max_bytes)
        except netsafe.FetchError as exc:
            raise _tool_error(exc) from exc
        if result.status_code >= 400:
            raise _status_error(result)

        data: dict[str, Any] = {
            "status": result.status_code, "url": result.url, "content_type": result.content_type,
            "bytes": len(result.body), "truncated": result.truncated, "redirects": result.redirects,
            "artifact_id": None,
        }
        header = f"HTTP {result.status_code} {result.reason}\nURL: {result.url}\nContent-Type: {result.content_type or '(none)'}"
        if result.redirects:
            header += "\nRedirected from: " + " → ".join(result.redirects)
        cut_note = (f"\n[… body cut at {max_bytes:,} bytes (max_bytes); the rest was not fetched]"
                    if result.truncated else "")

        text = _as_text(result)
        if text is None:
            if result.truncated or not result.body:
                note = (f"[binary body ({result.mime_type or 'unknown type'}), more than {max_bytes:,} bytes: "
                        "not saved; raise max_bytes to get all of it]" if result.body else "[empty body]")
                return ToolResult(content=f"{header}\n\n{note}", data=data)
            artifact_id = await context.artifact_save(
                name=_artifact_name(result.url, "download"),
                mime_type=result.mime_type or "application/octet-stream", data=result.body,
            )
            data["artifact_id"] = artifact_id
            return ToolResult(
                content=f"{header}\n\n[binary body ({result.mime_type or 'unknown type'}, {len(result.body):,} bytes) "
                        f"saved as artifact:{artifact_id}]",
                data=data,
            )
        return ToolResult(content=f"{header}\n\n{text}{cut_note}", data=data)


def _as_text(result: netsafe.FetchResult) -> str | None:
    """The body as text when it is text (by MIME type, or UTF-8 without NULs when untyped)."""
    if netsafe.is_text(result.mime_type):
        return netsafe.decode_text(result)
    if not result.mime_type or result.mime_type == "application/octet-stream":
        try:
            text = result.body.decode("utf-8")
        except UnicodeDecodeError:
            return None
        return None if "\x00" in text else text
    return None


# ------------------------------------------------------------------------------------------ web_read

READ_DESCRIPTION = f"""Read a public web page as Markdown: its title first, then the main content with headings, links (absolute URLs), lists, tables and code blocks.

Scripts, styles, navigation, headers/footers, sidebars and forms are removed. Prefer this over
`web_fetch` for articles and documentation. `max_chars` caps the Markdown (default
{READ_DEFAULT_CHARS:,}, at most {READ_MAX_CHARS:,}); a longer page ends with a marker. Only public
internet addresses can be read."""

_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed", "form",
              "button", "input", "select", "textarea", "nav", "aside", "dialog", "link", "meta")
_DROP_ROLES = ("navigation", "banner", "contentinfo", "complementary", "search", "dialog", "alert")


@register_builtin("web_read")
class WebReadTool(Tool):
    """A public web page as readable Markdown (see :data:`READ_DESCRIPTION`).

    Arguments: ``url``, ``max_chars`` (1,000 … 40,000; default 15,000).
    Result data: ``{url, title, status, chars, truncated}``.
    Errors: those of ``web_fetch`` plus ``unsupported_content`` (not HTML or text).
    """

    untrusted = True
    spec = ToolSpec(
        name="web_read",
        description=READ_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "An http:// or https:// URL of a web page."},
                "max_chars": {"type": "integer", "minimum": 1000, "maximum": READ_MAX_CHARS,
                              "default": READ_DEFAULT_CHARS},
            },
            "required": ["url"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        max_chars = arguments.get("max_chars", READ_DEFAULT_CHARS)
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or not 1000 <= max_chars <= READ_MAX_CHARS:
            raise ToolError(f"`max_chars` must be an integer from 1,000 to {READ_MAX_CHARS:,}.", code="invalid_arguments")
        try:
            result = await netsafe.safe_fetch(
                arguments.get("url"), max_bytes=READ_MAX_BYTES,
                accept="text/html,application/xhtml+xml;q=0.9,text/plain;q=0.8,*/*;q=0.5",
            )
        except netsafe.FetchError as exc:
            raise _tool_error(exc) from exc
        if result.status_code >= 400:
            raise _status_error(result)
        text = _as_text(result)
        if text is None:
            raise ToolError(
                f"{_short(result.url)} is not a web page ({result.mime_type or 'unknown type'}); "
                "use web_fetch to download it.",
                code="unsupported_content",
            )
        if result.mime_type in ("text/html", "application/xhtml+xml") or (
                not result.mime_type and re.search(r"<html|<body|<!doctype html", text[:2000], re.I)):
            title, markdown = html_to_markdown(text, base_url=result.url)
        else:
            title, markdown = "", text.strip()
        page = (f"# {title}\n\n" if title else "") + f"Source: {result.url}\n\n{markdown}".rstrip() + "\n"
        truncated = len(page) > max_chars or result.truncated
        if len(page) > max_chars:
            page = page[:max_chars].rstrip() + f"\n\n[… truncated: {len(page) - max_chars:,} more characters]"
        elif result.truncated:
            page += f"\n[… the page is longer than {READ_MAX_BYTES:,} bytes; only the start was read]"
        return ToolResult(content=page, data={
            "url": result.url, "title": title, "status": result.status_code, "chars": len(page), "truncated": truncated,
        })


def _decompose(tags: list[Any]) -> None:
    for tag in tags:
        if not tag.decomposed:
            tag.decompose()


class _Converter(MarkdownConverter):
    """markdownify with absolute links and no ``data:`` images."""

    def __init__(self, *, base_url: str, **options: Any) -> None:
        super().__init__(**options)
        self.base_url = base_url

    def convert_a(self, el: Any, text: str, parent_tags: Any) -> str:
        href = el.get("href")
        if href and not href.startswith(("#", "javascript:", "data:", "mailto:")):
            el["href"] = urljoin(self.base_url, href)
        elif href and href.startswith(("javascript:", "data:")):
            del el["href"]
        return super().convert_a(el, text, parent_tags)

    def convert_img(self, el: Any, text: str, parent_tags: Any) -> str:
        src = el.get("src") or ""
        if not src or src.startswith("data:"):
            alt = (el.get("alt") or "").strip()
            return f"[image: {alt}]" if alt else ""
        el["src"] = urljoin(self.base_url, src)
        return super().convert_img(el, text, parent_tags)


def html_to_markdown(html: str, *, base_url: str) -> tuple[str, str]:
    """Readable Markdown of an HTML page.

    The main content is ``<main>`` (or ``[role=main]``, or the only ``<article>``) when the
    page marks it, else ``<body>``; scripts, styles, forms, navigation, sidebars, page-level
    headers/footers, hidden elements and comments are dropped; links and images become
    absolute against ``base_url``.

    Returns:
        ``(title, markdown)``: the ``<title>`` (else ``og:title``, else the first ``<h1>``;
        '' if none) and ATX-heading Markdown with runs of blank lines collapsed.
    """
    soup = BeautifulSoup(html, "lxml")
    title = ""
    if soup.title and soup.title.get_text(strip=True):
        title = soup.title.get_text(" ", strip=True)
    elif (og := soup.find("meta", attrs={"property": "og:title"})) and og.get("content"):
        title = str(og["content"]).strip()
    elif (h1 := soup.find("h1")) and h1.get_text(strip=True):
        title = h1.get_text(" ", strip=True)
    title = re.sub(r"\s+", " ", title)[:300]

    for node in soup.find_all(string=lambda s: isinstance(s, Comment)):
        node.extract()
    _decompose(soup.find_all(_DROP_TAGS))
    _decompose(soup.find_all(attrs={"role": _DROP_ROLES}))
    _decompose(soup.find_all(lambda t: t.has_attr("hidden") or t.get("aria-hidden") == "true"
                             or "display:none" in (t.get("style") or "").replace(" ", "").lower()))

    mains = soup.find_all("main") or soup.find_all(attrs={"role": "main"})
    articles = soup.find_all("article")
    root = mains[0] if len(mains) == 1 else articles[0] if len(articles) == 1 else (soup.body or soup)
    # Page-level headers/footers (site banner, copyright) go; an article's own header stays.
    _decompose([t for t in root.find_all(["header", "footer"]) if t.find_parent(["article", "main", "section"]) is None])

    converter = _Converter(base_url=base_url, heading_style="ATX", bullets="-", strip_document="STRIP",
                           escape_underscores=False, escape_asterisks=False)
    markdown = converter.convert_soup(root)
    markdown = re.sub(r"[ \t]+\n", "\n", markdown)
    markdown = re.sub(r"\n{3,}", "\n\n", markdown).strip()
    if title and markdown.startswith(f"# {title}\n"):
        markdown = markdown[len(title) + 2:].lstrip()
    return title, markdown
