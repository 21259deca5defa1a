// A tool call's card in a run: a plain-language label ("Looked up the time in Asia/Tokyo"),
// its status and duration, the arguments and the output (long output truncated, "Show all"
// expands it), an "Open document" link for doc_write and the browser operation (browser.js).

import { renderBrowserOperation } from './browser.js'; // browser capability
import { isActive } from './chat_state.js';
import { h, replaceChildren, spinner, formatDuration, formatSize } from './dom.js';
import { renderToolFiles } from './tool_files.js'; // an MCP result's images, downloads and resource links

const FAILED_TOOL_STATUSES = new Set(['failed', 'error', 'timed_out']);

/** Arguments may arrive as an object or as a JSON string. */
function parseMaybeJson(value) {
  if (typeof value !== 'string') return value;
  const t = value.trim();
  if (!(t.startsWith('{') || t.startsWith('['))) return value;
  try {
    return JSON.parse(t);
  } catch {
    return value;
  }
}

/** Pretty text for a JSON value or a (possibly JSON) string. */
export function pretty(value) {
  if (value === undefined || value === null) return '';
  const parsed = parseMaybeJson(value);
  if (typeof parsed === 'string') return parsed;
  try {
    return JSON.stringify(parsed, null, 2);
  } catch {
    return String(parsed);
  }
}

/** One-line preview of the arguments for the collapsed summary. */
function compact(value, max = 90) {
  const parsed = parseMaybeJson(value);
  let text;
  try {
    text = typeof parsed === 'string' ? parsed : JSON.stringify(parsed);
  } catch {
    text = String(parsed);
  }
  text = (text || '').replace(/\s+/g, ' ');
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

// Long tool output is shown truncated first ("Show all" expands it).
const TRUNCATE_CHARS = 1500;
const TRUNCATE_LINES = 20;

function truncate(text) {
  let cut = text;
  const lines = cut.split('\n');
  if (lines.length > TRUNCATE_LINES) cut = lines.slice(0, TRUNCATE_LINES).join('\n');
  if (cut.length > TRUNCATE_CHARS) cut = cut.slice(0, TRUNCATE_CHARS);
  return cut.length < text.length ? cut : null;
}

// ------------------------------------------------------ plain language --

/** First string value among `keys` of an arguments object. */
function argOf(args, ...keys) {
  if (!args || typeof args !== 'object') return '';
  for (const key of keys) {
    const v = args[key];
    if (typeof v === 'string' && v.trim()) return v.trim();
    if (typeof v === 'number') return String(v);
  }
  return '';
}

function clip(text, max = 60) {
  const t = String(text).replace(/\s+/g, ' ').trim();
  return t.length > max ? `${t.slice(0, max - 1)}…` : t;
}

const VERBS = [
  [/ (time|clock|date|now|timezone) /, (a) => `Looked up the time${argOf(a, 'timezone', 'tz', 'zone', 'city') ? ` in ${argOf(a, 'timezone', 'tz', 'zone', 'city')}` : ''}`],
  [/ (weather|forecast) /, (a) => `Checked the weather${argOf(a, 'city', 'location', 'place') ? ` in ${argOf(a, 'city', 'location', 'place')}` : ''}`],
  [/ doc |document/, (a) => {
    const op = argOf(a, 'action', 'operation', 'op', 'mode');
    const title = argOf(a, 'title', 'name');
    const verb = /read|get|list|search/.test(op) ? 'Read' : /edit|update|append|replace|patch/.test(op) ? 'Edited' : 'Wrote';
    return `${verb} a document${title ? ` “${clip(title, 50)}”` : ''}`;
  }],
  [/ (search|lookup|find|query) /, (a) => `Searched${argOf(a, 'query', 'q', 'text', 'term') ? ` for “${clip(argOf(a, 'query', 'q', 'text', 'term'), 50)}”` : ''}`],
  [/ (browser|click|navigate|screenshot) /, (a) => `Used the browser${argOf(a, 'url') ? ` on ${clip(argOf(a, 'url'), 50)}` : ''}`],
  [/ (fetch|http|browse|url|web) /, (a) => `Opened ${clip(argOf(a, 'url', 'href', 'link') || 'a web page', 60)}`],
  [/ todo /, () => 'Updated the plan'],
  [/ artifact /, () => 'Read an attached file'],
  [/ ask user /, () => 'Asked you a question'],
  [/ echo /, (a) => `Echoed “${clip(argOf(a, 'text', 'message') || '…', 50)}”`],
  [/ (sleep|wait) /, (a) => `Waited${argOf(a, 'seconds') ? ` ${argOf(a, 'seconds')} s` : ''}`],
  [/ (calc|calculate|calculator|math|compute) /, (a) => `Calculated ${clip(argOf(a, 'expression', 'expr', 'input'), 50)}`.trim()],
];

/** A readable label for a tool call ("Looked up the time in Asia/Tokyo"), from its name and arguments. */
export function toolLabel(name, args) {
  const parsed = parseMaybeJson(args);
  const words = ` ${String(name || '').toLowerCase().replace(/[_\-.\s]+/g, ' ').trim()} `;
  for (const [pattern, make] of VERBS) if (pattern.test(words)) return make(parsed);
  const first = argOf(parsed, ...Object.keys(parsed && typeof parsed === 'object' ? parsed : {}));
  return `Used ${words.trim() || 'a tool'}${first ? ` (${clip(first, 40)})` : ''}`;
}

// ------------------------------------------------------------- tool card --

/** Show ``bar`` ({value, total}) in the <progress> element ``el``: determinate when the total is
 * known (value capped at it), indeterminate otherwise; hidden without a bar. */
function renderProgressBar(el, bar) {
  el.hidden = !bar;
  if (!bar) return;
  if (bar.total) {
    el.max = bar.total;
    el.value = Math.max(0, Math.min(bar.value, bar.total));
    el.setAttribute('aria-valuetext', `${Math.round((el.value / bar.total) * 100)}%`);
  } else {
    el.removeAttribute('value'); // indeterminate
    el.removeAttribute('aria-valuetext');
  }
}

export class ToolCardView {
  constructor() {
    this.statusEl = h('span', { class: 'tool-status' });
    this.nameEl = h('span', { class: 'tool-name' });
    this.rawNameEl = h('code', { class: 'tool-raw-name' });
    this.docLink = h('button', { type: 'button', class: 'link-btn tool-doc-open', testid: 'tool-doc-open', hidden: true, text: 'Open document' });
    this.durationEl = h('span', { class: 'tool-duration' });
    this.progressEl = h('div', { class: 'tool-progress', testid: 'tool-progress', hidden: true });
    // An MCP server's progress: determinate when it gave a total, else indeterminate (no value).
    this.progressBar = h('progress', { class: 'tool-progress-bar', testid: 'tool-progress-bar', hidden: true });
    this.argsPreview = h('span', { class: 'tool-preview' });
    this.argsPre = h('pre', { class: 'tool-pre' });
    this.args = h(
      'details',
      { class: 'tool-section' },
      h('summary', {}, h('span', { class: 'tool-label', text: 'Arguments' }), this.argsPreview),
      this.argsPre,
    );
    this.outLabel = h('span', { class: 'tool-label' });
    this.outSize = h('span', { class: 'tool-preview' });
    this.outPre = h('pre', { class: 'tool-pre' });
    this.expandBtn = h('button', { type: 'button', class: 'link-btn tool-expand', hidden: true });
    this.expandBtn.addEventListener('click', () => {
      this.expanded = !this.expanded;
      this.renderOutput();
    });
    this.out = h(
      'details',
      { class: 'tool-section tool-output', hidden: true },
      h('summary', {}, this.outLabel, this.outSize),
      this.outPre,
      this.expandBtn,
    );
    this.el = h(
      'div',
      { class: 'tool-card', testid: 'tool-call-card' },
      h(
        'div',
        { class: 'tool-head' },
        h('span', { class: 'tool-glyph', 'aria-hidden': 'true', text: '⚙' }),
        this.nameEl,
        this.rawNameEl,
        this.statusEl,
        this.durationEl,
      ),
      this.progressBar,
      this.progressEl,
      this.docLink,
      this.args,
      this.out,
      (this.browserEl = h('div', { class: 'browser-op', testid: 'browser-operation', hidden: true })), // browser.js
      (this.filesEl = h('ul', { class: 'tool-files', testid: 'tool-files', 'aria-label': 'Files of the result', hidden: true })), // tool_files.js
    );
    this.expanded = false;
    this.outKind = null; // 'result' | 'error' once output is shown
    this.outText = '';
    this.key = '';
  }

  update(tool) {
    // Skip work when nothing changed (cheap string key).
    const key = JSON.stringify([tool.name, tool.status, tool.duration_ms, tool.result, tool.error, tool.browser,
      tool.progress, tool.progressBar]);
    renderBrowserOperation(this.browserEl, tool.browser); // browser.js
    const argsText = pretty(tool.arguments);
    if (key === this.key && argsText === this.argsPre.textContent) return;
    this.key = key;

    this.el.dataset.toolName = tool.name;
    this.el.dataset.status = tool.status;
    this.nameEl.textContent = toolLabel(tool.name, tool.arguments);
    this.rawNameEl.textContent = tool.name;
    // doc_write's result names the document ("Created document:6 «Title» …"): offer to open it.
    const doc = /document:(\d+)/.exec(typeof tool.result === 'string' ? tool.result : '');
    this.docLink.hidden = !doc;
    if (doc) this.docLink.dataset.documentId = doc[1];

    const running = isActive(tool.status);
    const failed = FAILED_TOOL_STATUSES.has(tool.status);
    this.el.classList.toggle('is-running', running);
    this.el.classList.toggle('is-failed', failed);
    this.el.classList.toggle('is-done', !running && !failed);
    replaceChildren(
      this.statusEl,
      running ? spinner() : null,
      h('span', { text: String(tool.status).replace(/_/g, ' ') }),
    );
    this.statusEl.className = `tool-status status-${failed ? 'failed' : running ? 'running' : 'ok'}`;
    this.durationEl.textContent = formatDuration(tool.duration_ms);
    // The tool's last progress line, while it runs (tool_call_progress).
    this.progressEl.textContent = running && tool.progress ? tool.progress : '';
    this.progressEl.hidden = !(running && tool.progress);
    renderProgressBar(this.progressBar, running ? tool.progressBar : null);

    this.argsPre.textContent = argsText || '{}';
    this.argsPreview.textContent = compact(tool.arguments) || '{}';

    // Output: the error for failed calls, else the result once finished.
    let kind = null;
    let text = '';
    if (failed) {
      kind = 'error';
      text = tool.error || tool.result || 'The tool call failed.';
    } else if (!running) {
      kind = 'result';
      text = pretty(tool.result);
    }
    this.out.hidden = kind === null;
    if (kind && kind !== this.outKind) {
      // First time this kind of output shows: errors and short results open.
      this.out.open = kind === 'error' || (text.length <= 300 && text.split('\n').length <= 6);
    }
    this.outKind = kind;
    this.outText = text;
    this.outLabel.textContent = kind === 'error' ? 'Error' : 'Result';
    renderToolFiles(this.filesEl, kind === 'result' ? text : ''); // tool_files.js
    this.outSize.textContent = text ? formatSize(text.length) : 'empty';
    this.renderOutput();
  }

  renderOutput() {
    const cut = truncate(this.outText);
    const showCut = cut !== null && !this.expanded;
    this.outPre.textContent = showCut ? `${cut}\n…` : this.outText || '(empty)';
    this.expandBtn.hidden = cut === null;
    let label = '';
    if (cut !== null)
      label = this.expanded ? 'Show less' : `Show all (${formatSize(this.outText.length)})`;
    this.expandBtn.textContent = label;
  }
}
