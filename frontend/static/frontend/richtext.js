// Minimal, safe rendering of model output.
//
// Supported: ``` fenced code blocks (optionally with a language tag) and
// `inline code`. Everything else is plain text; line breaks are preserved by
// CSS (white-space: pre-wrap). Output is built from text nodes only, so any
// HTML in the text is shown literally, never parsed.
//
// An unterminated fence (common while a reply is still streaming) runs to the
// end of the text, so the code block appears as soon as it starts.

import { h } from './dom.js';

const FENCE_OPEN = /^\s*```\s*([\w+#.-]*)\s*$/;
const FENCE_CLOSE = /^\s*```\s*$/;
const INLINE_CODE = /`([^`\n]+)`/g;

/** Split text into [{kind: 'text'|'code', text, lang}] blocks. */
export function parseBlocks(text) {
  const blocks = [];
  const lines = String(text ?? '').split('\n');
  let buffer = [];
  let code = null; // {lang, lines} while inside a fence

  const flushText = () => {
    if (buffer.length) blocks.push({ kind: 'text', text: buffer.join('\n') });
    buffer = [];
  };

  for (const line of lines) {
    if (code) {
      if (FENCE_CLOSE.test(line)) {
        blocks.push({ kind: 'code', lang: code.lang, text: code.lines.join('\n') });
        code = null;
      } else {
        code.lines.push(line);
      }
      continue;
    }
    const open = FENCE_OPEN.exec(line);
    if (open) {
      flushText();
      code = { lang: open[1] || '', lines: [] };
    } else {
      buffer.push(line);
    }
  }
  if (code) blocks.push({ kind: 'code', lang: code.lang, text: code.lines.join('\n'), open: true });
  flushText();
  return blocks;
}

/** Text with `inline code` spans, as an array of nodes. */
function inlineNodes(text) {
  const nodes = [];
  let last = 0;
  for (const match of text.matchAll(INLINE_CODE)) {
    if (match.index > last) nodes.push(document.createTextNode(text.slice(last, match.index)));
    nodes.push(h('code', { class: 'inline-code' }, match[1]));
    last = match.index + match[0].length;
  }
  if (last < text.length) nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

/** Render `text` into a DocumentFragment (safe: text nodes only). */
export function renderRichText(text) {
  const fragment = document.createDocumentFragment();
  for (const block of parseBlocks(text)) {
    let node = null;
    if (block.kind === 'code') {
      // The language label is drawn by CSS (attr(data-lang)) so that the
      // element's textContent stays the reply text minus the fences.
      node = h(
        'div',
        { class: 'code-block', dataset: block.lang ? { lang: block.lang } : null },
        h('pre', {}, h('code', { text: block.text })),
      );
    } else {
      // Trim the blank line that usually surrounds a fence: block spacing is CSS's job.
      const trimmed = block.text.replace(/^\n+|\n+$/g, '');
      if (trimmed) node = h('div', { class: 'text-block' }, inlineNodes(trimmed));
    }
    if (!node) continue;
    // A newline between blocks: invisible between block boxes, but keeps
    // textContent (and copy/paste) readable.
    if (fragment.childNodes.length) fragment.append('\n');
    fragment.append(node);
  }
  return fragment;
}
