"""web_read: a local HTML page (real socket) as readable Markdown."""

from __future__ import annotations

import pytest

from capabilities.builtin.registry import builtin_create
from capabilities.builtin.web import html_to_markdown
from capabilities.tests import http_test_server as hts
from capabilities.tools import ToolContext, ToolError

pytestmark = pytest.mark.usefixtures("all_tenants_scope")

PAGE = """<!doctype html>
<html><head><title>Release Notes &amp; More</title>
<style>body { color: red } .STYLE_TEXT {}</style>
<script>var token = "SCRIPT_TEXT";</script></head>
<body>
<header><a href="/">SITE_BANNER</a></header>
<nav><a href="/home">NAV_HOME</a> <a href="/about">NAV_ABOUT</a></nav>
<h1>Version 2.0</h1>
<p>Read the <a href="/docs/upgrade">upgrade guide</a> or <a href="https://example.org/faq">the FAQ</a>.</p>
<ul><li>Faster startup</li><li>New <b>plugin</b> API</li></ul>
<h2>Breaking changes</h2>
<ol><li>Python 3.11+</li></ol>
<pre><code>pip install thing==2.0</code></pre>
<div hidden>HIDDEN_TEXT</div>
<form><input name="q"><button>FORM_BUTTON</button></form>
<aside>SIDEBAR_TEXT</aside>
<!-- COMMENT_TEXT -->
<script>document.write("INLINE_SCRIPT")</script>
<footer>FOOTER_TEXT</footer>
</body></html>"""


def ctx() -> ToolContext:
    return ToolContext(tenant_id=1, session_id=1, run_id=1, tool_call_id=1)


@pytest.fixture
def site(settings):
    settings.WEB_FETCH_ALLOWED_CIDRS = ["127.0.0.1/32"]
    with hts.serve("127.0.0.1", {
        "/notes": hts.text(PAGE, "text/html; charset=utf-8"),
        "/plain.txt": hts.text("just text\n"),
        "/image.png": hts.text(b"\x89PNG\r\n\x1a\n\x00\x00", "image/png"),
        "/long": hts.text("<html><head><title>Long</title></head><body>"
                          + "".join(f"<p>Paragraph {i} " + "word " * 50 + "</p>" for i in range(400))
                          + "</body></html>", "text/html"),
        "/main": hts.text("<html><body><div>MENU_OUTSIDE_MAIN</div><main><h1>Inside</h1><p>Body text.</p></main>"
                          "</body></html>", "text/html"),
    }) as server:
        yield server


async def test_a_page_becomes_markdown_with_the_title_first(site):
    result = await builtin_create("web_read").execute({"url": site.url + "/notes"}, ctx())
    md = result.content
    assert md.startswith(f"# Release Notes & More\n\nSource: {site.url}/notes\n\n# Version 2.0\n")
    assert f"[upgrade guide]({site.url}/docs/upgrade)" in md
    assert "[the FAQ](https://example.org/faq)" in md
    assert "- Faster startup\n- New **plugin** API" in md
    assert "## Breaking changes" in md and "1. Python 3.11+" in md
    assert "```\npip install thing==2.0\n```" in md
    for junk in ("SCRIPT_TEXT", "INLINE_SCRIPT", "STYLE_TEXT", "NAV_HOME", "SITE_BANNER", "HIDDEN_TEXT",
                 "FORM_BUTTON", "SIDEBAR_TEXT", "COMMENT_TEXT", "FOOTER_TEXT"):
        assert junk not in md, junk
    assert result.data == {"url": site.url + "/notes", "title": "Release Notes & More", "status": 200,
                           "chars": len(md), "truncated": False}


async def test_the_main_element_is_preferred(site):
    result = await builtin_create("web_read").execute({"url": site.url + "/main"}, ctx())
    assert "# Inside" in result.content and "Body text." in result.content
    assert "MENU_OUTSIDE_MAIN" not in result.content


async def test_long_pages_are_cut_with_a_marker(site):
    result = await builtin_create("web_read").execute({"url": site.url + "/long", "max_chars": 5000}, ctx())
    body, marker = result.content.rsplit("\n\n[… truncated: ", 1)
    assert len(body) <= 5000 and marker.endswith(" more characters]")
    assert result.data["truncated"] is True


async def test_plain_text_is_returned_as_is(site):
    result = await builtin_create("web_read").execute({"url": site.url + "/plain.txt"}, ctx())
    assert result.content == f"Source: {site.url}/plain.txt\n\njust text\n"


async def test_binary_content_is_refused(site):
    with pytest.raises(ToolError) as info:
        await builtin_create("web_read").execute({"url": site.url + "/image.png"}, ctx())
    assert info.value.code == "unsupported_content" and "web_fetch" in info.value.message


async def test_web_read_uses_the_same_blocklist(site, settings):
    settings.WEB_FETCH_ALLOWED_CIDRS = []
    with pytest.raises(ToolError) as info:
        await builtin_create("web_read").execute({"url": site.url + "/notes"}, ctx())
    assert info.value.code == "blocked_address"
    assert site.seen == []


def test_html_to_markdown_drops_data_urls_and_javascript_links():
    title, md = html_to_markdown(
        '<h1>T</h1><p><a href="javascript:alert(1)">click</a> <img src="data:image/png;base64,AAAA" alt="logo">'
        ' <img src="/a.png" alt="chart"></p>', base_url="https://example.com/x/")
    assert title == "T"
    assert "javascript:" not in md and "data:" not in md
    assert "[image: logo]" in md and "![chart](https://example.com/a.png)" in md
