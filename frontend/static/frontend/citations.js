// Citations of answers from knowledge bases: numbered sources under the answer, the answer's
// [n] markers linked to them, and a panel with the cited passage.
//
// Where citations come from (both survive a reload: they are stored with the run):
//   - the run's start context (run.context, from the REST session detail): passages retrieved
//     before the first turn, block.data.citations;
//   - knowledge_search tool calls: tool.data.citations (the tool_call_succeeded frame's data,
//     or the REST tool call's result_data).
// A citation is {n, knowledge_base_id, document_id, document_title, chunk_id, position,
// heading, score, snippet}; numbers are unique within a run (the server numbers them so).
// The passage itself is read from GET /api/v1/knowledge/chunks/<id>/ when it is opened.
//
// Platform attribution: when the answer cites none of its passages, the platform may have
// matched its sentences to them (run.attributions, from the REST session detail or the
// run_completed frame: [{sentence_start, sentence_end, n, chunk_id, score}], offsets in the
// reply). Each matched sentence then gets a marker of its own, visibly not the model's
// citation (muted, "Matched by the platform: the model did not cite this"), opening the same
// passage panel; the sources heading says "Sources matched by the platform (k)".
// Built with textContent only (nothing here assigns innerHTML).

import { request } from './api.js';
import { h, replaceChildren } from './dom.js';

const MARKER = /\[(\d{1,3})\]/g;

/** The citations of a run, by number: Map(n -> citation), start context first, then tool calls. */
export function runCitations(run) {
  const byN = new Map();
  const add = (list) => {
    if (!Array.isArray(list)) return;
    for (const c of list) if (c && Number.isInteger(c.n) && !byN.has(c.n)) byN.set(c.n, c);
  };
  for (const block of run.context || []) add(block?.data?.citations);
  for (const tool of run.tools.values()) add(tool.data?.citations);
  return byN;
}

/** The numbers the reply cites ([n] markers that name a known citation), in order of first use. */
function citedNumbers(text, citations) {
  const seen = [];
  for (const match of String(text || '').matchAll(MARKER)) {
    const n = Number(match[1]);
    if (citations.has(n) && !seen.includes(n)) seen.push(n);
  }
  return seen;
}

const PLATFORM_NOTE = 'Matched by the platform: the model did not cite this';

/** The run's platform attributions whose passage is one of its citations, in reply order. */
function runAttributions(run, citations) {
  if (!Array.isArray(run.attributions)) return [];
  return run.attributions
    .filter((a) => a && Number.isInteger(a.n) && citations.has(a.n) && Number.isInteger(a.sentence_end))
    .sort((a, b) => a.sentence_end - b.sentence_end);
}

/** "Title › Section > Subsection": the heading path without the document's own title, which
 * a Markdown document's first heading usually repeats ("README › README > Quick start"). */
function sourceLabel(c) {
  const title = c.document_title || '';
  let heading = c.heading || '';
  if (title && heading === title) heading = '';
  else if (title && heading.startsWith(`${title} > `)) heading = heading.slice(title.length + 3);
  if (!title) return heading || `Passage ${c.n}`;
  return heading ? `${title} › ${heading}` : title;
}

// ------------------------------------------------------------ passage panel --

let dialog = null;

function passageDialog() {
  if (dialog) return dialog;
  const title = h('h2', { id: 'passage-title', class: 'passage-title' });
  const close = h('button', { type: 'button', class: 'btn passage-close', testid: 'passage-close', text: 'Close' });
  dialog = h(
    'dialog',
    { class: 'passage-dialog', testid: 'passage-panel', 'aria-labelledby': 'passage-title' },
    h('div', { class: 'passage-head' }, title, close),
    h('div', { class: 'passage-where' }),
    h('div', { class: 'passage-text', testid: 'passage-text' }),
  );
  close.addEventListener('click', () => dialog.close());
  document.body.append(dialog);
  return dialog;
}

/** Open the passage of citation `c` in the panel (its full text from the chunk API). */
export async function openPassage(c, opener) {
  const d = passageDialog();
  d.querySelector('.passage-title').textContent = `[${c.n}] ${c.document_title || 'Passage'}`;
  d.querySelector('.passage-where').textContent = c.heading || '';
  const body = d.querySelector('.passage-text');
  body.textContent = c.snippet || '';
  body.setAttribute('aria-busy', 'true');
  d.dataset.chunkId = String(c.chunk_id);
  if (!d.open) d.showModal();
  if (opener) d.addEventListener('close', () => opener.focus(), { once: true });
  try {
    const chunk = await request('GET', `knowledge/chunks/${encodeURIComponent(c.chunk_id)}/`);
    if (d.dataset.chunkId !== String(c.chunk_id)) return; // another passage was opened meanwhile
    body.textContent = chunk?.text || c.snippet || '';
    if (chunk?.heading) d.querySelector('.passage-where').textContent = chunk.heading;
  } catch (err) {
    body.textContent = `${c.snippet || ''}\n\n(The full passage could not be loaded: ${err.message || err})`;
  } finally {
    body.removeAttribute('aria-busy');
  }
}

// ---------------------------------------------------------------- markers --

/** Turn the [n] markers of the rendered reply into links that open passage n (idempotent:
 *  text already linked, code and pre are left alone). */
function linkMarkers(root, citations) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement?.closest('a, code, pre')
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    MARKER.lastIndex = 0;
    if (MARKER.test(node.data)) nodes.push(node);
  }
  for (const node of nodes) {
    const parts = [];
    let last = 0;
    for (const match of node.data.matchAll(MARKER)) {
      const c = citations.get(Number(match[1]));
      if (!c) continue;
      parts.push(node.data.slice(last, match.index));
      const link = h('a', {
        href: '#', class: 'cite-ref', testid: 'citation-marker', dataset: { n: String(c.n) },
        title: sourceLabel(c), text: match[0],
      });
      link.addEventListener('click', (event) => {
        event.preventDefault();
        openPassage(c, link);
      });
      parts.push(link);
      last = match.index + match[0].length;
    }
    if (!parts.length) continue;
    parts.push(node.data.slice(last));
    node.replaceWith(...parts.filter((p) => p !== ''));
  }
}

/** The end of a sentence as rendered (Markdown emphasis and code ticks dropped): its last
 *  words, at most 24 characters, cut at a word boundary. */
function sentenceTail(sentence) {
  const plain = sentence.replace(/[*_`]+/g, '').replace(/\s+/g, ' ').trim();
  if (plain.length <= 24) return plain;
  const tail = plain.slice(-24);
  const space = tail.indexOf(' ');
  return space > 0 && space < tail.length - 4 ? tail.slice(space + 1) : tail;
}

/** The reply's text nodes (platform markers left out) and their text joined, with each node's
 *  offset in it: a sentence is looked for in the joined text, so one whose end spans inline
 *  code or a link (`make run` command.) is found too. */
function joinedText(root) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement?.closest('.cite-platform')
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  let joined = '';
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    nodes.push({ node, offset: joined.length });
    joined += node.data;
  }
  return { nodes, joined };
}

function platformMarker(c) {
  const marker = h('a', {
    href: '#', class: 'cite-ref cite-platform', testid: 'platform-citation-marker',
    dataset: { n: String(c.n) }, title: `${PLATFORM_NOTE} (${sourceLabel(c)})`,
    'aria-label': `Passage ${c.n}: ${PLATFORM_NOTE}`, text: `[${c.n}]`,
  });
  marker.addEventListener('click', (event) => {
    event.preventDefault();
    openPassage(c, marker);
  });
  return marker;
}

/** After each attributed sentence of the rendered reply, a platform marker [n] that opens the
 *  passage (earlier ones removed first). Sentences are looked for in reply order, each after
 *  the previous one; a sentence ending inside code, a link or a code block gets its marker
 *  after that element; one not found in the rendered text gets no marker. */
function markAttributions(root, text, attributions, citations) {
  for (const old of root.querySelectorAll('.cite-platform')) old.remove();
  root.normalize();
  let from = 0; // offset in the joined text after the previous sentence's end
  for (const a of attributions) {
    const tail = sentenceTail(String(text).slice(a.sentence_start, a.sentence_end));
    const c = citations.get(a.n);
    if (!tail || !c) continue;
    const pattern = new RegExp(tail.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/ /g, '\\s+'), 'g');
    const { nodes, joined } = joinedText(root);
    pattern.lastIndex = from;
    const match = pattern.exec(joined);
    if (!match) continue;
    const end = match.index + match[0].length;
    const hit = nodes.findLast((n) => n.offset < end) || nodes[0];
    const marker = platformMarker(c);
    const inside = hit.node.parentElement?.closest('a, code, pre');
    if (inside && root.contains(inside)) {
      inside.after(marker);
    } else {
      hit.node.splitText(end - hit.offset).before(marker);
    }
    from = end; // (the joined text leaves the markers out)
  }
}

// ---------------------------------------------------------------- sources --

/**
 * Show the run's sources under its answer (view: a RunView with replyBody, reply, shownReply).
 * The cited passages, by number; when the answer cites none, the passages it was given.
 * Nothing while there is no answer or no citation.
 */
export function renderCitations(view, run) {
  const citations = runCitations(run);
  const text = view.shownReply || '';
  const attributions = runAttributions(run, citations);
  const key = JSON.stringify([text, [...citations.keys()], view.renderedReply === text, attributions]);
  if (key === view.citationsKey) return;
  view.citationsKey = key;
  if (!view.sourcesEl) {
    view.sourcesList = h('ol', { class: 'sources-list' });
    view.sourcesTitle = h('summary', { class: 'sources-title' });
    view.sourcesEl = h('details', { class: 'sources', testid: 'citation-sources', open: true },
      view.sourcesTitle, view.sourcesList);
  }
  if (!citations.size || !text) {
    view.sourcesEl.remove();
    return;
  }
  linkMarkers(view.replyBody, citations);
  const cited = citedNumbers(text, citations);
  // The model cited none: the passages the platform matched its sentences to, if any.
  const matched = cited.length ? [] : [...new Set(attributions.map((a) => a.n))];
  if (!cited.length) markAttributions(view.replyBody, text, attributions, citations);
  const numbers = cited.length ? cited : matched.length ? matched : [...citations.keys()];
  const shown = numbers.map((n) => citations.get(n));
  view.sourcesTitle.textContent = cited.length
    ? `Sources (${shown.length})`
    : matched.length
      ? `Sources matched by the platform (${shown.length})`
      : `Passages it was given (${shown.length}, none cited)`;
  view.sourcesEl.classList.toggle('sources-platform', !cited.length && matched.length > 0);
  replaceChildren(
    view.sourcesList,
    shown.map((c) => {
      const button = h('button', {
        type: 'button', class: 'link-btn source-open', testid: 'citation-source',
        dataset: { n: String(c.n), chunkId: String(c.chunk_id) },
      }, h('span', { class: 'source-n', text: `[${c.n}]` }), ' ', h('span', { class: 'source-label', text: sourceLabel(c) }));
      if (!cited.length && matched.length) button.title = PLATFORM_NOTE;
      button.addEventListener('click', () => openPassage(c, button));
      return h('li', { class: 'source' }, button);
    }),
  );
  if (view.sourcesEl.parentNode !== view.reply) view.reply.insertBefore(view.sourcesEl, view.replyActions);
}
