"""The browser capability: the Chrome extension bridge and the server-side Playwright backend."""
