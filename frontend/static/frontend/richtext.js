// Markdown rendering of model output (and of the user's own messages).
//
// CommonMark + GFM (tables, task lists, strikethrough, autolinks) by marked, sanitised by
// DOMPurify, code highlighted by highlight.js (its common-languages build): all three are
// vendored under ./vendor/ (versions, sha256s and how to update: vendor/README.md), so
// the app works offline and the Content-Security-Policy stays `script-src 'self'`.
//
// Safety: marked's HTML output goes through DOMPurify before it touches the DOM; `style`
// attributes, forms, iframes and event handlers are removed; links open in a new tab with
// rel="noopener noreferrer"; only http(s), mailto and relative URLs survive.
//
// Streaming: CommonMark runs an unclosed ``` fence to the end of the text, so while a
// reply streams its last code block is styled as code and everything before it keeps its
// own formatting ("an unclosed fence styles only its own block").
//
// Code blocks get a header with the language label and a Copy button (focusable); the
// button works through event delegation (see wireCopyButtons / copyText).

import { marked } from './vendor/marked.esm.js';
import DOMPurify from './vendor/purify.es.js';
import hljs from './vendor/highlight.min.js';

marked.use({ gfm: true, breaks: true });

const SAFE_URL = /^(?:https?:|mailto:|#|\/(?!\/)|\.{0,2}\/|[^:]*$)/i;

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    const href = node.getAttribute('href') || '';
    if (!SAFE_URL.test(href)) node.removeAttribute('href');
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer');
  }
  if (node.tagName === 'IMG') {
    // Only images from this origin (artifacts) or data: URLs render; the CSP blocks others anyway.
    const src = node.getAttribute('src') || '';
    if (!/^(?:\/(?!\/)|data:image\/)/i.test(src)) node.removeAttribute('src');
    if (!node.hasAttribute('alt')) node.setAttribute('alt', '');
  }
});

// Classes from the model's HTML could borrow the app's styles: only marked's
// `language-xxx` on <code> survives (it names the code block's language).
DOMPurify.addHook('uponSanitizeAttribute', (node, data) => {
  if (data.attrName !== 'class') return;
  const lang = node.tagName === 'CODE' ? /(?:^|\s)(language-[\w+#.-]+)(?:\s|$)/.exec(data.attrValue || '') : null;
  if (lang) data.attrValue = lang[1];
  else data.keepAttr = false;
});

const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ['style', 'form', 'input', 'button', 'textarea', 'select', 'iframe', 'object', 'embed', 'svg', 'math'],
  FORBID_ATTR: ['style', 'id', 'name'],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#|\/|data:image\/)/i,
};

/** A language name highlight.js knows, or ''. */
function knownLanguage(lang) {
  const name = String(lang || '').trim().toLowerCase();
  return name && hljs.getLanguage(name) ? name : '';
}

/** Turn every <pre><code> of `root` into a code block: header (language, Copy) + highlighted code. */
function decorateCodeBlocks(root) {
  for (const pre of [...root.querySelectorAll('pre')]) {
    const code = pre.querySelector('code') || pre;
    const match = /language-([\w+#.-]+)/.exec(code.className || '');
    const label = match ? match[1] : '';
    const lang = knownLanguage(label);
    const text = code.textContent;
    code.className = 'hljs';
    if (lang) {
      try {
        code.innerHTML = hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
      } catch {
        code.textContent = text;
      }
    }
    const copy = document.createElement('button');
    copy.type = 'button';
    copy.className = 'code-copy';
    copy.dataset.copy = 'code';
    copy.textContent = 'Copy';
    copy.setAttribute('aria-label', label ? `Copy ${label} code` : 'Copy code');
    const langEl = document.createElement('span');
    langEl.className = 'code-lang';
    langEl.textContent = label || 'text';
    const head = document.createElement('div');
    head.className = 'code-head';
    head.append(langEl, copy);
    const block = document.createElement('div');
    block.className = 'code-block';
    if (label) block.dataset.lang = label;
    pre.replaceWith(block);
    pre.tabIndex = 0; // scrollable code is reachable by keyboard
    pre.setAttribute('aria-label', label ? `${label} code` : 'code');
    block.append(head, pre);
  }
}

/** Wrap tables so that wide ones scroll inside the bubble. */
function wrapTables(root) {
  for (const table of [...root.querySelectorAll('table')]) {
    const wrap = document.createElement('div');
    wrap.className = 'table-wrap';
    wrap.tabIndex = 0;
    wrap.setAttribute('role', 'region');
    wrap.setAttribute('aria-label', 'Table');
    table.replaceWith(wrap);
    wrap.append(table);
  }
}

/** Render Markdown `text` into a DocumentFragment (sanitised). */
export function renderRichText(text) {
  const source = String(text ?? '');
  const html = marked.parse(source, { async: false });
  const clean = DOMPurify.sanitize(html, { ...PURIFY, RETURN_DOM_FRAGMENT: true });
  decorateCodeBlocks(clean);
  wrapTables(clean);
  return clean;
}

/** `text` as a ```json code block, indented, when all of it is one JSON object or array
 * (structured output); else `text` unchanged. */
export function jsonAsMarkdown(text) {
  const trimmed = String(text ?? '').trim();
  if (!/^[[{]/.test(trimmed)) return text;
  try {
    return '```json\n' + JSON.stringify(JSON.parse(trimmed), null, 2) + '\n```';
  } catch {
    return text;
  }
}

/** Copy `text` to the clipboard; resolves true on success (falls back to execCommand). */
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement('textarea');
    area.value = text;
    area.setAttribute('readonly', '');
    area.className = 'visually-hidden';
    document.body.append(area);
    area.select();
    let ok = false;
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    area.remove();
    return ok;
  }
}

/** Show "Copied" on `button` for a moment. */
export function flashCopied(button, ok = true) {
  const before = button.dataset.label || button.textContent;
  const beforeName = button.dataset.ariaLabel ?? button.getAttribute('aria-label') ?? '';
  button.dataset.label = before;
  button.dataset.ariaLabel = beforeName;
  const text = ok ? 'Copied' : 'Copy failed';
  button.textContent = text;
  if (beforeName) button.setAttribute('aria-label', text); // the name keeps the visible text
  clearTimeout(button._copyTimer);
  button._copyTimer = setTimeout(() => {
    button.textContent = before;
    if (beforeName) button.setAttribute('aria-label', beforeName);
  }, 1500);
}

/** One delegated listener for every code block's Copy button under `root`. */
export function wireCopyButtons(root) {
  root.addEventListener('click', async (event) => {
    const button = event.target.closest && event.target.closest('button.code-copy');
    if (!button || !root.contains(button)) return;
    const pre = button.closest('.code-block')?.querySelector('pre');
    if (!pre) return;
    flashCopied(button, await copyText(pre.textContent));
  });
}
