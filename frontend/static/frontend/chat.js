// The chat screen: a session's runs (user message, tool call cards, assistant
// reply, error), a todo panel and the composer, kept live by SessionSocket.
//
// State model: one plain object per run, keyed by run id, fed from two sources:
//   - the REST session detail (canonical, fetched on open, after a run ends
//     and after a reconnect), merged with mergeSession();
//   - WebSocket frames, applied with applyFrame().
// Both merges are idempotent and never move a run or tool call "backwards"
// (e.g. a replayed run_running cannot undo a completed run), so the order in
// which REST answers and frames arrive does not matter.
// Views are updated in place (so open/closed <details> survive updates) and
// batched per animation frame (token streams can be fast).

import { applyBrowserOperation, renderBrowserOperation } from './browser.js'; // browser capability
import { renderCitations } from './citations.js'; // knowledge-base citations under the answer
import { mountMemoryButton } from './memory.js'; // long-term memory: the header's "Memory" dialog
import { applyDocumentStatus, mountKnowledgeUploads } from './knowledge_uploads.js'; // "Add to knowledge" on attachments, "My knowledge"
import { api, ApiError } from './api.js';
import { SessionSocket } from './ws.js';
import {
  h,
  replaceChildren,
  spinner,
  shortTime,
  fullTime,
  formatDuration,
  formatSize,
} from './dom.js';
import { renderRichText, copyText, flashCopied, wireCopyButtons } from './richtext.js';
import { settings } from './settings.js';
import { icon } from './icons.js';

// ---------------------------------------------------------------- helpers --

const ACTIVE_STATUSES = new Set(['queued', 'pending', 'running', 'awaiting_approval']);
const isActive = (status) => ACTIVE_STATUSES.has(status);

/** Progress rank of a run/tool status: queued < running = awaiting approval < anything final.
 * A run goes running → awaiting_approval → running again, so those two share a rank. */
function rank(status) {
  if (status === 'queued' || status === 'pending') return 0;
  if (status === 'running' || status === 'awaiting_approval') return 1;
  return 2;
}

const FAILED_TOOL_STATUSES = new Set(['failed', 'error', 'timed_out']);

/** Frame timestamps may be epoch seconds (float) or ISO strings. */
function toIso(ts) {
  if (typeof ts === 'number' && Number.isFinite(ts)) {
    return new Date(ts < 1e12 ? ts * 1000 : ts).toISOString();
  }
  return typeof ts === 'string' ? ts : null;
}

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
function pretty(value) {
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

/** Insert `node` into `parent` (before `before`) when `show`, else detach it. */
function attach(parent, node, show, before) {
  if (show && node.parentNode !== parent) parent.insertBefore(node, before);
  else if (!show && node.parentNode) node.remove();
}

function newRun(id) {
  return {
    id: String(id),
    status: 'queued',
    input: '',
    reply: null, // final reply (REST or run_completed)
    stream: '', // text streamed by content_token frames
    error: '',
    reason: '',
    createdAt: null,
    tools: new Map(), // tool call id -> tool object, in arrival order
    notices: [], // model_fallback / model_retry messages, in arrival order
    approvals: new Map(), // approval id -> {id, kind, status, tool_name, arguments, reason, question, skill}
    steered: false, // posted while another run worked, to an agent in steer mode
    steeredInto: null, // the run its message was handed to
    waitingBehind: false, // posted while another run worked (queue mode): waits its turn
  };
}

/** Merge an approval (REST shape or event payload) into a run; decided ones never go back to pending. */
function upsertApproval(run, raw) {
  const id = String(raw.id ?? raw.approval_id);
  const current = run.approvals.get(id);
  const incoming = {
    id,
    kind: raw.kind || 'tool_call',
    status: raw.status || 'pending',
    tool_name: raw.tool_name || '',
    arguments: raw.arguments,
    reason: raw.reason || '',
    question: raw.question || '',
    skill: raw.skill || '',
    answer: raw.answer || '',
  };
  if (!current) run.approvals.set(id, incoming);
  else if (current.status === 'pending') Object.assign(current, incoming);
  else if (!current.answer && incoming.answer) current.answer = incoming.answer;
}

const ERROR_LABELS = {
  rate_limit: 'a rate limit',
  quota_exhausted: 'an exhausted quota',
  overloaded: 'an overload',
  server: 'a server error',
  timeout: 'a timeout',
  network: 'a network error',
  context_window: 'a too-long conversation',
  content_policy: 'a content filter',
  auth: 'an authentication error',
  not_found: 'a missing model',
  cooldown: 'a cooldown',
  no_tool_support: 'missing tool support',
};

function errorLabel(errorClass) {
  return ERROR_LABELS[errorClass] || (errorClass ? errorClass.replace(/_/g, ' ') : 'an error');
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

/** What happened and what to do next, for a run's failure reason. */
const FAILURE_HELP = {
  model_unavailable: ['The AI model could not be reached.', 'Try again in a minute. If it keeps failing, tell your workspace admin.'],
  model_error: ['The AI model refused or could not process the request.', 'Rephrase your message and try again.'],
  stream_interrupted: ['The answer broke off while it was being written.', 'Try again.'],
  max_loop_count: ['The agent took too many steps without finishing.', 'Ask for a smaller step, or try again.'],
  budget_exceeded: ['This would go over the usage budget.', 'Ask your workspace admin to raise the budget.'],
  context_window: ['This chat has become too long for the model.', 'Start a new chat with a summary of this one.'],
  turn_timeout: ['The model took too long to answer.', 'Try again, or ask a shorter question.'],
  run_timeout: ['The agent took too long to finish.', 'Try again, or split the task into smaller steps.'],
  compaction_failed: ['The chat could not be shortened to fit the model.', 'Start a new chat with a summary of this one.'],
  configuration: ['This agent is not set up correctly.', 'Tell your workspace admin.'],
  capability_unavailable: ['A tool this agent needs could not be reached.', 'Try again later, or tell your workspace admin.'],
  worker_lost: ['The server working on this stopped unexpectedly.', 'Try again.'],
  approval_expired: ['Nobody answered the approval request in time.', 'Try again and answer the request when it appears.'],
  internal_error: ['Something went wrong on the server.', 'Try again. If it keeps happening, tell your workspace admin.'],
};

function normalizeTool(raw) {
  return {
    id: String(raw.id ?? raw.tool_call_id),
    name: raw.name || 'tool',
    arguments: raw.arguments,
    status: raw.status || 'running',
    result: raw.result ?? null,
    error: raw.error ?? null,
    duration_ms: raw.duration_ms ?? null,
    data: raw.data ?? raw.result_data ?? null, // structured result (citations.js reads its citations)
  };
}

/** Merge tool data into a run without moving its status backwards. */
function upsertTool(run, raw) {
  const incoming = normalizeTool(raw);
  const current = run.tools.get(incoming.id);
  if (!current) {
    run.tools.set(incoming.id, incoming);
    return;
  }
  if (incoming.name && incoming.name !== 'tool') current.name = incoming.name;
  if (incoming.arguments !== undefined && incoming.arguments !== null) {
    current.arguments = incoming.arguments;
  }
  if (rank(incoming.status) >= rank(current.status)) {
    current.status = incoming.status;
    if (incoming.result !== null) current.result = incoming.result;
    if (incoming.error !== null) current.error = incoming.error;
    if (incoming.duration_ms !== null) current.duration_ms = incoming.duration_ms;
    if (incoming.data !== null) current.data = incoming.data;
  }
}

// ------------------------------------------------------------- tool card --

class ToolCardView {
  constructor() {
    this.statusEl = h('span', { class: 'tool-status' });
    this.nameEl = h('span', { class: 'tool-name' });
    this.rawNameEl = h('code', { class: 'tool-raw-name' });
    this.docLink = h('button', { type: 'button', class: 'link-btn tool-doc-open', testid: 'tool-doc-open', hidden: true, text: 'Open document' });
    this.durationEl = h('span', { class: 'tool-duration' });
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
      this.docLink,
      this.args,
      this.out,
      (this.browserEl = h('div', { class: 'browser-op', testid: 'browser-operation', hidden: true })), // browser.js
    );
    this.expanded = false;
    this.outKind = null; // 'result' | 'error' once output is shown
    this.outText = '';
    this.key = '';
  }

  update(tool) {
    // Skip work when nothing changed (cheap string key).
    const key = JSON.stringify([tool.name, tool.status, tool.duration_ms, tool.result, tool.error, tool.browser]);
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

// -------------------------------------------------------------- approval --

/** A pending approval (Approve / Deny) or an ask_user question (answer box), then its outcome. */
class ApprovalView {
  constructor(id) {
    this.id = id;
    this.title = h('div', { class: 'approval-title' });
    this.detail = h('pre', { class: 'tool-pre approval-args' });
    this.reason = h('div', { class: 'approval-reason' });
    this.answer = h('textarea', { class: 'approval-answer', rows: 2, testid: 'approval-answer-input', 'aria-label': 'Your answer' });
    this.error = h('div', { class: 'approval-error', role: 'alert', hidden: true });
    this.approveBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'approval-approve', text: 'Approve' });
    this.denyBtn = h('button', { type: 'button', class: 'btn', testid: 'approval-deny', text: 'Deny' });
    this.sendBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'approval-answer-send', text: 'Send answer' });
    this.approveBtn.addEventListener('click', () => this.decide({ decision: 'approve' }));
    this.denyReason = h('input', {
      type: 'text',
      class: 'approval-deny-reason',
      testid: 'approval-deny-reason',
      maxlength: '2000',
      placeholder: 'Reason (optional)',
      'aria-label': 'Reason for denying (optional)',
    });
    this.denyBtn.addEventListener('click', () => {
      const reason = this.denyReason.value.trim();
      this.decide(reason ? { decision: 'deny', reason } : { decision: 'deny' });
    });
    this.sendBtn.addEventListener('click', () => this.decide({ answer: this.answer.value.trim() }));
    this.actions = h('div', { class: 'approval-actions' });
    this.outcome = h('div', { class: 'approval-outcome', testid: 'approval-outcome' });
    this.el = h(
      'div',
      { class: 'approval-card', testid: 'approval-card' },
      this.title,
      this.reason,
      this.detail,
      this.actions,
      this.error,
      this.outcome,
    );
    this.key = '';
    this.busy = false;
  }

  async decide(body) {
    if (this.busy) return;
    if ('answer' in body && !body.answer) {
      this.showError('Type an answer first.');
      return;
    }
    this.busy = true;
    this.showError('');
    for (const b of [this.approveBtn, this.denyBtn, this.sendBtn]) b.disabled = true;
    try {
      const decided = await api.decideApproval(this.id, body);
      this.update({ ...this.approval, status: decided.status, answer: decided.answer || '' });
    } catch (err) {
      this.showError(err instanceof ApiError ? err.message : 'Could not send the decision.');
    } finally {
      this.busy = false;
      for (const b of [this.approveBtn, this.denyBtn, this.sendBtn]) b.disabled = false;
    }
  }

  showError(text) {
    this.error.textContent = text;
    this.error.hidden = !text;
  }

  update(approval) {
    this.approval = approval;
    const key = JSON.stringify([approval.status, approval.kind, approval.tool_name, approval.question, approval.skill, approval.answer]);
    if (key === this.key) return;
    this.key = key;
    const question = approval.kind === 'question';
    const pending = approval.status === 'pending';
    this.el.dataset.status = approval.status;
    this.el.classList.toggle('is-pending', pending);
    // A skill's sub-run asks through its user's run: say which skill.
    const inSkill = approval.skill ? ` (in the skill ${approval.skill})` : '';
    this.title.textContent = question
      ? `${approval.question}`
      : `Allow ${approval.tool_name || 'this tool'}${inSkill}?`;
    this.reason.textContent = question ? `The agent asks${inSkill}:` : approval.reason;
    this.reason.hidden = !this.reason.textContent;
    this.detail.textContent = question ? '' : pretty(approval.arguments) || '{}';
    this.detail.hidden = question;
    replaceChildren(
      this.actions,
      pending ? (question ? [this.answer, this.sendBtn] : [this.approveBtn, this.denyReason, this.denyBtn]) : [],
    );
    const labels = { approved: 'Approved', denied: 'Denied', answered: 'Answered', expired: 'Expired' };
    const why = approval.status === 'denied' && approval.answer ? ` — ${approval.answer}` : '';
    this.outcome.textContent = pending ? '' : `${labels[approval.status] || approval.status}${why}`;
    this.outcome.hidden = pending;
  }
}

// ------------------------------------------------------------------- run --

class RunView {
  /**
   * @param {string} agentName
   * @param {object} actions callbacks of the chat: copy(text, button), edit(run, content),
   *   retry(run), continueWithSummary(run), openDocument(id)
   */
  constructor(agentName, actions) {
    this.agentName = agentName;
    this.actions = actions;
    this.userText = h('div', { class: 'bubble', testid: 'user-message' });
    this.userTime = h('time', { class: 'msg-time' });
    this.userChip = h('span', { class: 'chip', testid: 'run-chip', hidden: true });
    this.userCopy = h('button', { type: 'button', class: 'msg-action', testid: 'copy-user', text: 'Copy' });
    this.userEdit = h('button', { type: 'button', class: 'msg-action', testid: 'edit-message', text: 'Edit' });
    this.userCopy.addEventListener('click', () => this.actions.copy(this.run.input, this.userCopy));
    this.userEdit.addEventListener('click', () => this.startEdit());
    this.userActions = h('div', { class: 'msg-actions' }, this.userCopy, this.userEdit);
    this.editBox = null;
    this.userMsg = h(
      'div',
      { class: 'msg msg-user' },
      h('div', { class: 'msg-meta' }, h('span', { class: 'msg-author', text: 'You' }), this.userTime, this.userChip),
      this.userText,
      this.userActions,
    );
    this.tools = h('div', { class: 'tool-list' });
    this.pendingText = h('span');
    this.pending = h(
      'div',
      { class: 'pending', hidden: true },
      h('span', { class: 'dots', 'aria-hidden': 'true' }, h('i'), h('i'), h('i')),
      this.pendingText,
    );
    this.replyBody = h('div', { class: 'bubble rich', testid: 'assistant-reply' });
    this.replyName = h('span', { class: 'msg-author' });
    this.stoppedChip = h('span', { class: 'chip chip-stopped', testid: 'stopped-chip', text: 'Stopped', hidden: true });
    this.replyCopy = h('button', { type: 'button', class: 'msg-action', testid: 'copy-reply', text: 'Copy' });
    this.replyCopy.addEventListener('click', () => this.actions.copy(this.shownReply || '', this.replyCopy));
    this.regenerateBtn = h('button', { type: 'button', class: 'msg-action', testid: 'regenerate', text: 'Regenerate', hidden: true });
    this.regenerateBtn.addEventListener('click', () => this.actions.retry(this.run));
    this.replyActions = h('div', { class: 'msg-actions' }, this.replyCopy, this.regenerateBtn);
    this.reply = h(
      'div',
      { class: 'msg msg-assistant' },
      h('div', { class: 'msg-meta' }, this.replyName, this.stoppedChip),
      this.replyBody,
      this.replyActions,
    );
    this.errorTitle = h('strong', { class: 'run-error-title' });
    this.errorNext = h('div', { class: 'run-error-next', testid: 'run-error-next' });
    this.errorText = h('div', { class: 'run-error-text' });
    this.retryBtn = h('button', { type: 'button', class: 'btn', testid: 'retry-run', text: 'Retry' });
    this.retryBtn.addEventListener('click', () => this.actions.retry(this.run));
    this.summaryBtn = h('button', {
      type: 'button',
      class: 'btn btn-primary',
      testid: 'continue-with-summary',
      text: 'Start a new chat with a summary',
    });
    this.summaryBtn.addEventListener('click', () => this.actions.continueWithSummary(this.run));
    this.errorActions = h('div', { class: 'run-error-actions' });
    this.error = h(
      'div',
      { class: 'run-error', testid: 'run-error', role: 'alert' },
      this.errorTitle,
      this.errorNext,
      h('details', { class: 'run-error-details' }, h('summary', { text: 'Details' }), this.errorText),
      this.errorActions,
    );
    this.stoppedText = h('span', { testid: 'run-stopped-text' });
    this.stoppedRetry = h('button', { type: 'button', class: 'msg-action', testid: 'retry-stopped', text: 'Ask again' });
    this.stoppedRetry.addEventListener('click', () => this.actions.retry(this.run));
    this.stopped = h('div', { class: 'run-stopped', testid: 'run-stopped' }, this.stoppedText, ' ', this.stoppedRetry);
    this.el = h(
      'article',
      { class: 'run', testid: 'run' },
      this.userMsg,
      this.tools,
      this.pending,
    );
    // The reply and the error box are attached only while they have content,
    // so their test ids never match empty, hidden elements.
    this.toolViews = new Map();
    this.renderedReply = null;
    this.noticeSummary = h('summary', { class: 'model-notice-summary' });
    this.noticeList = h('div', { class: 'model-notice-list' });
    this.notices = h('details', { class: 'model-notices' }, this.noticeSummary, this.noticeList);
    this.renderedNotices = 0;
    this.approvals = h('div', { class: 'approval-list' });
    this.approvalViews = new Map();
  }

  startEdit() {
    if (this.editBox) return;
    const area = h('textarea', { class: 'edit-input', testid: 'edit-input', rows: '3', 'aria-label': 'Edit your message' });
    area.value = this.run.input;
    const save = h('button', { type: 'button', class: 'btn btn-primary', testid: 'edit-save', text: 'Save & send' });
    const cancel = h('button', { type: 'button', class: 'btn', testid: 'edit-cancel', text: 'Cancel' });
    const note = h('div', { class: 'edit-note', text: 'Sending replaces this message and everything after it.' });
    const close = () => {
      this.editBox?.remove();
      this.editBox = null;
      this.userText.hidden = false;
      this.userActions.hidden = false;
    };
    save.addEventListener('click', async () => {
      const content = area.value.trim();
      if (!content) return;
      save.disabled = true;
      if (await this.actions.edit(this.run, content)) close();
      else save.disabled = false;
    });
    cancel.addEventListener('click', close);
    area.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') {
        event.stopPropagation();
        close();
      } else if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) save.click();
    });
    this.editBox = h('div', { class: 'edit-box' }, area, note, h('div', { class: 'edit-actions' }, cancel, save));
    this.userText.hidden = true;
    this.userActions.hidden = true;
    this.userMsg.append(this.editBox);
    area.focus();
  }

  /** @param {object} ctx {isLast: bool, showNotices: bool} */
  update(run, ctx = {}) {
    this.run = run;
    this.el.dataset.runStatus = run.status;
    this.el.dataset.runId = run.id;
    const active = isActive(run.status);
    this.el.setAttribute('aria-busy', active ? 'true' : 'false');

    if (this.userText.textContent !== run.input) this.userText.textContent = run.input;
    this.userTime.textContent = shortTime(run.createdAt);
    if (run.createdAt) this.userTime.setAttribute('datetime', run.createdAt);
    this.userTime.title = fullTime(run.createdAt);
    const chip = run.steered || run.steeredInto ? 'Steered' : run.waitingBehind && run.status === 'queued' ? 'Queued' : '';
    this.userChip.textContent = chip;
    this.userChip.hidden = !chip;
    this.userChip.title = chip === 'Steered'
      ? 'Handed to the answer in progress: the agent reads it at its next step.'
      : chip ? 'Waits for the answer in progress, then runs.' : '';
    this.userEdit.hidden = active;

    // Tool cards, in arrival order.
    for (const tool of run.tools.values()) {
      let view = this.toolViews.get(tool.id);
      if (!view) {
        view = new ToolCardView();
        view.docLink.addEventListener('click', () => this.actions.openDocument(view.docLink.dataset.documentId));
        this.toolViews.set(tool.id, view);
        this.tools.append(view.el);
      }
      view.update(tool);
    }

    // Approvals and questions waiting for the user, below the tool cards.
    for (const approval of run.approvals.values()) {
      let view = this.approvalViews.get(approval.id);
      if (!view) {
        view = new ApprovalView(approval.id);
        this.approvalViews.set(approval.id, view);
        this.approvals.append(view.el);
      }
      view.update(approval);
    }
    attach(this.el, this.approvals, this.approvalViews.size > 0, this.pending);

    // Routing notices (fallbacks, retries): one quiet, folded line above the reply.
    if (run.notices.length !== this.renderedNotices) {
      this.renderedNotices = run.notices.length;
      const switches = run.notices.filter((t) => t.startsWith('Switched')).length;
      const retries = run.notices.length - switches;
      const parts = [];
      if (switches) parts.push(`${switches} model switch${switches > 1 ? 'es' : ''}`);
      if (retries) parts.push(`${retries} retr${retries > 1 ? 'ies' : 'y'}`);
      this.noticeSummary.textContent = parts.join(', ');
      replaceChildren(
        this.noticeList,
        run.notices.map((text) => h('div', { class: 'model-notice', testid: 'model-notice', text })),
      );
    }
    attach(this.el, this.notices, run.notices.length > 0, this.pending);
    this.notices.hidden = ctx.showNotices === false;

    // Reply: the final text once known, the streamed text meanwhile (a stopped run keeps it).
    const cancelled = run.status === 'cancelled';
    const shown = (run.reply ? run.reply : run.reply !== null && !cancelled ? run.reply : run.stream) || '';
    this.shownReply = shown;
    if (shown !== this.renderedReply) {
      this.renderedReply = shown;
      replaceChildren(this.replyBody, renderRichText(shown));
    }
    attach(this.el, this.reply, !!shown, this.pending);
    renderCitations(this, run); // citations.js: sources under the answer, [n] markers linked
    this.replyName.textContent = this.agentName || 'Assistant';
    this.replyBody.classList.toggle('streaming', active && !!shown);
    this.stoppedChip.hidden = !cancelled;
    this.replyActions.hidden = active;
    this.regenerateBtn.hidden = !(ctx.isLast && !active);

    // "Thinking" indicator while active and nothing is streaming yet.
    const runningTool = [...run.tools.values()].some((t) => isActive(t.status));
    this.pending.hidden = !active || (!!shown && !runningTool);
    this.pendingText.textContent =
      run.status === 'queued' || run.status === 'pending'
        ? run.steered ? 'Handed to the agent…' : 'Queued…'
        : run.status === 'awaiting_approval'
          ? 'Waiting for you…'
          : runningTool
          ? 'Running tools…'
          : 'Thinking…';

    // Stopped by the user: a quiet line, not an error.
    attach(this.el, this.stopped, cancelled, null);
    if (cancelled) {
      this.stoppedText.textContent = shown ? 'You stopped this answer.' : 'You stopped this request before an answer.';
      this.stoppedRetry.hidden = !ctx.isLast || !!shown; // with text, the answer's Regenerate does it
    }
    const failed = run.status === 'failed' || run.status === 'error';
    const showError = failed || (!active && !cancelled && !!run.error);
    attach(this.el, this.error, showError, this.stopped.parentNode ? this.stopped : null);
    this.el.classList.toggle('is-cancelled', cancelled);
    if (showError) {
      const [what, next] = FAILURE_HELP[run.reason] || ['The agent could not answer this message.', 'Try again.'];
      this.errorTitle.textContent = what;
      this.errorNext.textContent = next;
      this.errorText.textContent = `${run.error || 'No details.'}${run.reason ? ` (${run.reason})` : ''}`;
      const tooLong = run.reason === 'context_window' || run.reason === 'compaction_failed';
      replaceChildren(
        this.errorActions,
        tooLong ? this.summaryBtn : null,
        ctx.isLast ? this.retryBtn : null,
      );
    }
  }
}

// ------------------------------------------------------------ todo panel --

const TODO_ICONS = { completed: '✓', in_progress: '◐', cancelled: '✕', pending: '○' };

class TodoPanel {
  constructor() {
    this.count = h('span', { class: 'todo-count' });
    this.list = h('ol', { class: 'todo-list' });
    this.el = h(
      'aside',
      { class: 'todo-panel', testid: 'todo-panel', 'aria-label': 'Agent plan' },
      h(
        'details',
        { open: true },
        h('summary', {}, h('span', { class: 'todo-title', text: 'Plan' }), this.count),
        this.list,
      ),
    );
  }

  /** Render into `parent`; the panel is detached while there are no todos. */
  update(todos, parent) {
    const items = Array.isArray(todos) ? todos : [];
    attach(parent, this.el, items.length > 0, null);
    const done = items.filter((t) => t.status === 'completed').length;
    this.count.textContent = `${done}/${items.length}`;
    replaceChildren(
      this.list,
      items.map((todo) => {
        const status = todo.status || 'pending';
        return h(
          'li',
          { class: `todo todo-${status}`, dataset: { status } },
          h('span', { class: 'todo-icon', 'aria-hidden': 'true', text: TODO_ICONS[status] || '○' }),
          h('span', { class: 'todo-content', text: todo.content || '' }),
          todo.priority
            ? h('span', { class: `todo-priority prio-${todo.priority}`, text: todo.priority })
            : null,
          h('span', { class: 'visually-hidden', text: ` (${status.replace('_', ' ')})` }),
        );
      }),
    );
  }
}

// ------------------------------------------------------------- chat view --

const CONNECTION_LABELS = {
  connecting: 'Connecting…',
  open: 'Live',
  reconnecting: 'Reconnecting…',
  closed: '',
};

export class ChatView {
  /**
   * @param {object} opts
   * @param {string} opts.sessionId
   * @param {string} opts.wsBase
   * @param {(message: string, kind?: string) => void} opts.toast
   * @param {(session: object) => void} [opts.onSession] called with each fetched session
   * @param {(opts?: {quiet?: boolean, message?: string}) => void} [opts.onAuthLost]
   *   the API answered 401/403 (the app checks whether the login expired)
   */
  constructor({ sessionId, wsBase, toast, onSession, onAuthLost, onNewChat, isAdmin = false }) {
    this.sessionId = String(sessionId);
    this.onNewChat = onNewChat || (() => {});
    this.isAdmin = isAdmin;
    this.wsBase = wsBase;
    this.toast = toast;
    this.onSession = onSession || (() => {});
    this.onAuthLost = onAuthLost || (() => {});

    this.session = null;
    this.runs = new Map();
    this.order = [];
    this.views = new Map();
    this.dirty = new Set();
    this.todos = null;
    this.loaded = false;
    this.sending = false;
    this.destroyed = false;
    this.stick = true;
    this.frameRequested = false;
    this.lastFetchAt = 0;
    this.lastFrameAt = Date.now();
    this.socket = null;
    this.socketFailures = 0;
    this.attachments = []; // files picked/dropped/pasted for the next message: {file, id}
    this.lastRunId = null; // the run that may be regenerated / retried
    this.actions = {
      copy: (text, button) => copyText(text).then((ok) => flashCopied(button, ok)),
      edit: (run, content) => this.editRun(run, content),
      retry: (run) => this.retryRun(run),
      continueWithSummary: (run) => this.continueWithSummary(run),
      openDocument: (id) => this.openFiles({ documentId: id }),
    };
    this.onKeydown = (event) => {
      if (event.key !== 'Escape' || event.defaultPrevented || this.destroyed) return;
      if (document.querySelector('dialog[open]')) return;
      if (this.hasActiveRun()) {
        event.preventDefault();
        this.stop();
      }
    };
    document.addEventListener('keydown', this.onKeydown);
    this.offSettings = settings.onChange(() => {
      for (const id of this.order) this.dirty.add(id);
      this.schedule();
    });

    this.build();
  }

  build() {
    this.titleEl = h('h1', { class: 'chat-title', id: 'chat-title', text: 'Loading…' });
    this.subEl = h('div', { class: 'chat-sub' });
    this.connEl = h('span', { class: 'conn', role: 'status', hidden: true });
    this.usageEl = h('span', { class: 'chat-usage', testid: 'chat-usage', hidden: true });
    this.filesBtn = h('button', {
      type: 'button',
      class: 'btn btn-ghost files-toggle',
      testid: 'files-toggle',
      'aria-expanded': 'false',
      'aria-controls': 'files-panel',
      text: 'Files',
    });
    this.filesBtn.addEventListener('click', () => (this.filesOpen ? this.closeFiles() : this.openFiles()));
    this.live = h('div', { class: 'visually-hidden', 'aria-live': 'polite', role: 'status', testid: 'reply-announcer' });
    this.filesPanel = h('aside', { class: 'files-panel', id: 'files-panel', testid: 'files-panel', 'aria-label': 'Files of this chat', hidden: true });
    this.filesOpen = false;
    this.runsEl = h('div', { class: 'runs' });
    this.stateEl = h('div', { class: 'chat-state' }, spinner(), ' Loading conversation…');
    this.column = h('div', { class: 'chat-column' }, this.stateEl, this.runsEl);
    this.scroller = h(
      'div',
      { class: 'chat-scroll', tabindex: '0', 'aria-label': 'Conversation' },
      this.column,
    );
    this.scroller.addEventListener('scroll', () => {
      const gap = this.scroller.scrollHeight - this.scroller.scrollTop - this.scroller.clientHeight;
      this.stick = gap < 80;
    });
    this.todoPanel = new TodoPanel();

    this.input = h('textarea', {
      id: 'composer-input',
      class: 'composer-input',
      testid: 'composer-input',
      rows: '1',
      placeholder: 'Message…',
      'aria-describedby': 'composer-hint',
      disabled: true,
    });
    this.sendBtn = h(
      'button',
      {
        type: 'submit',
        class: 'btn btn-primary composer-send',
        testid: 'composer-send',
        disabled: true,
      },
      'Send',
    );
    this.stopBtn = h('button', {
      type: 'button',
      class: 'btn composer-stop',
      testid: 'composer-stop',
      title: 'Stop the answer (Esc)',
      hidden: true,
    }, h('span', { class: 'stop-square', 'aria-hidden': 'true' }), 'Stop');
    this.stopBtn.addEventListener('click', () => this.stop());
    this.fileInput = h('input', { type: 'file', multiple: true, class: 'visually-hidden', id: 'composer-file', testid: 'composer-file', tabindex: '-1', 'aria-hidden': 'true' });
    this.fileInput.addEventListener('change', () => {
      this.addFiles([...this.fileInput.files]);
      this.fileInput.value = '';
    });
    this.attachBtn = h('button', { type: 'button', class: 'btn btn-ghost composer-attach', testid: 'composer-attach', 'aria-label': 'Attach files', title: 'Attach files (or drop or paste them)' }, icon('paperclip'));
    this.attachBtn.addEventListener('click', () => this.fileInput.click());
    this.chipsEl = h('ul', { class: 'attach-chips', testid: 'attachment-chips', 'aria-label': 'Attached files', hidden: true });
    this.input.addEventListener('paste', (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (files.length) {
        event.preventDefault();
        this.addFiles(files);
      }
    });
    this.input.addEventListener('keydown', (event) => {
      // Enter sends, Shift+Enter inserts a newline; never while an IME is composing.
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
        event.preventDefault();
        this.send();
      }
    });
    this.input.addEventListener('input', () => {
      this.autosize();
      this.updateComposer();
    });
    this.form = h(
      'form',
      { class: 'composer', 'aria-label': 'Send a message' },
      this.chipsEl,
      h(
        'div',
        { class: 'composer-inner' },
        this.attachBtn,
        this.fileInput,
        h('label', { class: 'visually-hidden', for: 'composer-input', text: 'Message' }),
        this.input,
        this.stopBtn,
        this.sendBtn,
      ),
      (this.hintEl = h('div', {
        class: 'composer-hint',
        id: 'composer-hint',
        text: 'Enter to send · Shift+Enter for a new line',
      })),
    );
    this.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.send();
    });

    // The todo panel is attached to bodyEl (next to chat-main) when there are todos.
    this.mainEl = h('div', { class: 'chat-main' }, this.scroller, this.form);
    this.bodyEl = h('div', { class: 'chat-body' }, this.mainEl, this.filesPanel);
    // Drop files anywhere on the conversation or the composer.
    this.mainEl.addEventListener('dragover', (event) => {
      if (![...(event.dataTransfer?.types || [])].includes('Files')) return;
      event.preventDefault();
      this.mainEl.classList.add('is-dropping');
    });
    this.mainEl.addEventListener('dragleave', (event) => {
      if (!this.mainEl.contains(event.relatedTarget)) this.mainEl.classList.remove('is-dropping');
    });
    this.mainEl.addEventListener('drop', (event) => {
      const files = [...(event.dataTransfer?.files || [])];
      this.mainEl.classList.remove('is-dropping');
      if (!files.length) return;
      event.preventDefault();
      this.addFiles(files);
    });
    wireCopyButtons(this.scroller);
    wireCopyButtons(this.filesPanel);
    this.el = h(
      'section',
      { class: 'chat', 'aria-labelledby': 'chat-title' },
      h(
        'header',
        { class: 'chat-header' },
        h('div', { class: 'chat-titles' }, this.titleEl, this.subEl),
        this.usageEl,
        this.connEl,
        this.filesBtn,
      ),
      this.bodyEl,
      this.live,
    );
  }

  // -------------------------------------------------------- lifecycle --

  async load() {
    try {
      const session = await this.fetchSession();
      if (this.destroyed || !session) return;
      this.loaded = true;
      this.stateEl.hidden = true;
      this.flush();
      this.scrollToBottom();
      this.updateComposer();
      if (!this.input.disabled) this.input.focus();
    } catch (err) {
      if (this.destroyed) return;
      this.showLoadError(err);
      return;
    }
    // Start after the REST snapshot; after_seq=0 asks for a full replay, which
    // the idempotent merge absorbs (it also restores the todo panel and the
    // streamed text of a run in progress).
    this.socket = new SessionSocket(this.sessionId, {
      wsBase: this.wsBase,
      onFrame: (frame) => this.applyFrame(frame),
      onStatus: (status) => this.showConnection(status),
      onReconnect: () => this.refetchSoon(0),
      onClose: ({ code, opened }) => {
        // 4404: the session is gone or not ours; retrying cannot help.
        if (code === 4404) return false;
        // 4401 (not authenticated), or handshakes failing again and again:
        // the login probably expired; let the app check (it moves to the
        // login screen if so). Keep retrying meanwhile.
        if (code === 4401 || code === 4403) this.socketFailures += 3;
        else this.socketFailures = opened ? 0 : this.socketFailures + 1;
        if (this.socketFailures >= 3 && !this.authChecked) {
          this.authChecked = true;
          this.onAuthLost({ quiet: true });
        }
        return true;
      },
    });
    this.socket.start();
    // Safety net so the composer never stays locked if frames go missing:
    // while a run is active, re-fetch when the socket is down or silent.
    this.watchdog = setInterval(() => this.checkStalled(), 5000);
  }

  destroy() {
    this.destroyed = true;
    document.removeEventListener('keydown', this.onKeydown);
    this.offSettings();
    if (this.socket) this.socket.stop();
    clearInterval(this.watchdog);
    clearTimeout(this.refetchTimer);
    if (this.fetchAbort) this.fetchAbort.abort();
  }

  showLoadError(err) {
    // If the login expired the app moves to the login screen; otherwise (a
    // permission problem) the message below stays on screen.
    if (err instanceof ApiError && err.isAuth) this.onAuthLost({ quiet: true });
    const notFound = err instanceof ApiError && err.status === 404;
    this.titleEl.textContent = notFound ? 'Chat not found' : 'Could not load this chat';
    const retry = h('button', { type: 'button', class: 'btn', text: 'Retry' });
    retry.addEventListener('click', () => {
      replaceChildren(this.stateEl, spinner(), ' Loading conversation…');
      this.load();
    });
    replaceChildren(
      this.stateEl,
      h(
        'div',
        { class: 'empty' },
        h('p', {
          text: notFound
            ? 'This chat does not exist or you do not have access to it.'
            : err.message || 'Something went wrong.',
        }),
        h('p', {}, notFound ? null : retry, ' ', h('a', { href: '#/', text: 'Back to start' })),
      ),
    );
  }

  // ------------------------------------------------------------ REST --

  async fetchSession() {
    if (this.fetchAbort) this.fetchAbort.abort();
    const controller = new AbortController();
    this.fetchAbort = controller;
    this.lastFetchAt = Date.now();
    try {
      const session = await api.getSession(this.sessionId, { signal: controller.signal });
      if (this.destroyed) return null;
      this.mergeSession(session);
      return session;
    } catch (err) {
      if (err && err.name === 'AbortError') return null;
      throw err;
    } finally {
      if (this.fetchAbort === controller) this.fetchAbort = null;
    }
  }

  /** Re-fetch the canonical session shortly (coalesces bursts of requests). */
  refetchSoon(delay = 200) {
    if (this.destroyed || !this.loaded) return;
    clearTimeout(this.refetchTimer);
    this.refetchTimer = setTimeout(() => {
      this.fetchSession().catch((err) => {
        if (this.destroyed) return;
        if (err instanceof ApiError && err.isAuth) this.onAuthLost({ quiet: true });
        else console.warn('Session refresh failed', err);
      });
    }, delay);
  }

  checkStalled() {
    if (this.destroyed || !this.hasActiveRun()) return;
    const now = Date.now();
    const socketDown = !this.socket || this.socket.status !== 'open';
    const quiet = now - this.lastFrameAt > 30000;
    const sinceFetch = now - this.lastFetchAt;
    if ((socketDown && sinceFetch > 8000) || (quiet && sinceFetch > 30000)) this.refetchSoon(0);
  }

  /** A title the server gave the chat (`session_titled`): the header, the sidebar and the tab follow. */
  applyTitle(title) {
    if (typeof title !== 'string' || !title || !this.session) return;
    this.session = { ...this.session, title };
    this.titleEl.textContent = title;
    this.onSession(this.session);
  }

  mergeSession(session) {
    this.session = session;
    const agent = session.agent || {};
    this.agentName = agent.name || 'Assistant';
    this.titleEl.textContent = session.title || 'New chat';
    replaceChildren(
      this.subEl,
      h('span', { class: 'chat-agent', text: this.agentName }),
      agent.description ? h('span', { class: 'chat-desc', text: ` · ${agent.description}` }) : null,
    );
    mountMemoryButton(this, session); // --- memory (memory.js): the "Memory" button in the header ---

    const runs = Array.isArray(session.runs) ? [...session.runs] : [];
    // Oldest first (stable sort keeps server order for equal timestamps).
    runs.sort((a, b) => String(a.created_at || '').localeCompare(String(b.created_at || '')));
    for (const raw of runs) {
      const run = this.ensureRun(raw.id);
      if (raw.input) run.input = raw.input;
      if (raw.created_at) run.createdAt = raw.created_at;
      if (raw.steered_into !== undefined && raw.steered_into !== null) run.steeredInto = raw.steered_into;
      if (rank(raw.status) >= rank(run.status)) run.status = raw.status;
      if (!isActive(raw.status)) {
        // Final state from the database is canonical.
        if (typeof raw.reply === 'string' && raw.reply) run.reply = raw.reply;
        else if (run.reply === null) run.reply = raw.reply ?? null;
        run.error = raw.error || '';
        if (raw.reason) run.reason = raw.reason;
      }
      for (const tool of raw.tool_calls || []) upsertTool(run, tool);
      for (const approval of raw.approvals || []) upsertApproval(run, approval);
      if (Array.isArray(raw.context)) run.context = raw.context; // the run's start context (citations.js)
      if (raw.attributions !== undefined) run.attributions = raw.attributions; // platform attribution (citations.js)
      this.dirty.add(run.id);
    }
    // Canonical order: the server's runs, then any only seen live so far. Runs the
    // server no longer lists (edited or regenerated away) leave the chat.
    const serverIds = runs.map((r) => String(r.id));
    // Ids only grow: a run older than the newest the server lists, and not listed, was
    // edited or regenerated away (truncation).
    this.maxServerRunId = Math.max(0, ...serverIds.map(Number).filter(Number.isFinite));
    const gone = (id) => this.goneRuns?.has(id) || (!serverIds.includes(id) && Number(id) < this.maxServerRunId);
    for (const id of this.order) {
      if (!serverIds.includes(id) && gone(id)) {
        this.runs.delete(id);
        this.views.get(id)?.el.remove();
        this.views.delete(id);
      }
    }
    const liveOnly = this.order.filter((id) => !serverIds.includes(id) && !gone(id));
    this.order = [...serverIds, ...liveOnly];
    this.orderChanged = true;
    this.messageMode = agent.message_mode || 'queue';
    this.showUsage(session.usage);

    if (Array.isArray(session.todos)) this.setTodos(session.todos);
    this.schedule();
    this.onSession(session);
  }

  // ------------------------------------------------------- live frames --

  ensureRun(id) {
    const key = String(id);
    let run = this.runs.get(key);
    if (!run) {
      run = newRun(key);
      this.runs.set(key, run);
      this.order.push(key);
      this.orderChanged = true;
    }
    return run;
  }

  applyFrame(frame) {
    this.lastFrameAt = Date.now();
    const data = frame.data || {};
    if (frame.type === 'todo_updated') {
      this.setTodos(data.todos);
      return;
    }
    if (frame.type === 'artifact_updated') {
      if (this.filesOpen) this.loadFiles(); // a document or file of this chat changed
      return;
    }
    if (frame.type === 'session_titled') {
      this.applyTitle(data.title); // the model named the chat after its first answer
      return;
    }
    if (frame.type === 'document_status_changed') {
      applyDocumentStatus(frame); // a file added to the user's knowledge from this chat moved on
      return;
    }
    if (frame.run_id === null || frame.run_id === undefined) return;
    // A skill's sub-run: shown as its parent's tool call, not as a run of the conversation.
    if (data.parent_run_id !== undefined && data.parent_run_id !== null) return;
    const known = this.runs.has(String(frame.run_id));
    // Replayed frames of runs edited or regenerated away: not part of the chat any more.
    if (!known && (this.goneRuns?.has(String(frame.run_id)) || Number(frame.run_id) < (this.maxServerRunId || 0))) return;
    const handlers = {
      run_queued: (run) => {
        if (!run.input && typeof data.input === 'string') run.input = data.input;
        if (!run.createdAt) run.createdAt = toIso(frame.ts);
      },
      run_running: (run) => {
        if (rank(run.status) < 2) run.status = 'running';
        if (data.steered_into !== undefined && data.steered_into !== null) run.steeredInto = data.steered_into;
      },
      run_awaiting_approval: (run) => {
        if (rank(run.status) < 2) run.status = 'awaiting_approval';
        for (const approval of data.approvals || []) upsertApproval(run, approval);
        // A run pauses once its other calls have results: a call still shown running is a
        // skill whose sub-run waits for this approval.
        for (const tool of run.tools.values()) if (isActive(tool.status)) tool.status = 'awaiting_approval';
      },
      approval_resolved: (run) => {
        const approval = run.approvals.get(String(data.approval_id));
        if (approval) approval.status = data.status || 'approved';
      },
      model_fallback: (run) => {
        run.notices.push(
          `Switched from ${data.from_model || 'the first model'} to ${data.to_model || 'the next model'} ` +
            `after ${errorLabel(data.error_class)}.`,
        );
      },
      model_retry: (run) => {
        if (data.turn_restarted) {
          run.stream = ''; // the broken answer is discarded; the turn starts again
          run.notices.push('The answer broke off; asking the model again.');
        } else {
          const wait = Number(data.wait_seconds) > 0 ? ` in ${Number(data.wait_seconds).toFixed(1)} s` : '';
          run.notices.push(`Retrying ${data.model || 'the model'}${wait} after ${errorLabel(data.error_class)}.`);
        }
      },
      content_token: (run) => {
        if (isActive(run.status) && typeof data.text === 'string') {
          run.stream += data.text;
          if (rank(run.status) < 1) run.status = 'running';
        }
      },
      tool_call_started: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          arguments: data.arguments,
          status: 'running',
        }),
      tool_call_succeeded: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          status: 'succeeded',
          result: data.result ?? '',
          duration_ms: data.duration_ms,
          data: data.data, // e.g. knowledge_search's citations
        }),
      tool_call_failed: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          status: data.status || 'failed', // 'failed' | 'timed_out'
          error: data.error ?? '',
          duration_ms: data.duration_ms,
        }),
      // --- browser capability (browser.js): what the agent does in the browser ---
      browser_operation: (run) => applyBrowserOperation(run, data),
      // --- end browser capability ---
      run_completed: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'completed';
        run.reply = typeof data.reply === 'string' ? data.reply : (run.reply ?? run.stream);
        if (Array.isArray(data.attributions)) run.attributions = data.attributions; // citations.js
        // Re-fetch for the canonical view (not for replays of finished runs).
        if (wasActive) {
          this.refetchSoon();
          if (!data.steered_into) this.announce(`${this.agentName} replied: ${String(run.reply || '').slice(0, 300)}`);
        }
      },
      run_failed: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'failed';
        run.error = data.error || run.error || 'The run failed.';
        run.reason = data.reason || run.reason || '';
        if (wasActive) {
          this.refetchSoon();
          this.announce(`The answer failed: ${(FAILURE_HELP[run.reason] || ['The agent could not answer.'])[0]}`);
        }
      },
      run_cancelled: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'cancelled';
        if (data.reason) run.reason = data.reason;
        if (wasActive) this.refetchSoon();
      },
    };
    const handler = handlers[frame.type];
    if (!handler) return; // unknown frame type: ignore
    // Frames of a run we never saw (e.g. trimmed history) create a placeholder
    // that the next REST refresh fills in.
    const run = this.ensureRun(frame.run_id);
    if (!known && frame.type !== 'run_queued' && rank(run.status) < 1) run.status = 'running';
    handler(run);
    this.dirty.add(run.id);
    this.schedule();
  }

  setTodos(todos) {
    this.todos = Array.isArray(todos) ? todos : [];
    this.todoPanel.update(this.todos, this.bodyEl);
  }

  // ----------------------------------------------------------- render --

  schedule() {
    if (this.frameRequested || this.destroyed) return;
    this.frameRequested = true;
    requestAnimationFrame(() => {
      this.frameRequested = false;
      this.flush();
    });
  }

  flush() {
    if (this.destroyed) return;
    const stick = this.stick;
    // Runs posted while an earlier one works wait their turn ("Queued" chip).
    let busyBefore = false;
    for (const id of this.order) {
      const run = this.runs.get(id);
      if (!run) continue;
      const waiting = busyBefore && run.status === 'queued';
      if (waiting !== run.waitingBehind) {
        run.waitingBehind = waiting;
        this.dirty.add(id);
      }
      if (isActive(run.status) && !run.steeredInto && !run.steered) busyBefore = true;
    }
    const lastId = this.order.length ? this.order[this.order.length - 1] : null;
    if (lastId !== this.lastRunId) {
      if (this.lastRunId) this.dirty.add(this.lastRunId);
      if (lastId) this.dirty.add(lastId);
      this.lastRunId = lastId;
    }
    const showNotices = settings.showModelNotices(this.isAdmin);
    for (const id of this.dirty) {
      const run = this.runs.get(id);
      if (!run) continue;
      let view = this.views.get(id);
      if (!view) {
        view = new RunView(this.agentName, this.actions);
        this.views.set(id, view);
        this.orderChanged = true;
      }
      view.agentName = this.agentName;
      view.update(run, { isLast: id === lastId, showNotices });
    }
    this.dirty.clear();
    if (this.orderChanged) {
      const wanted = this.order.map((id) => this.views.get(id)?.el).filter(Boolean);
      const current = [...this.runsEl.children];
      if (wanted.length !== current.length || wanted.some((el, i) => el !== current[i])) {
        // append() moves existing nodes: this re-sorts without re-creating them.
        for (const el of current) if (!wanted.includes(el)) el.remove();
        this.runsEl.append(...wanted);
      }
      this.orderChanged = false;
    }
    if (this.loaded && this.order.length === 0) {
      this.stateEl.hidden = false;
      replaceChildren(
        this.stateEl,
        h(
          'div',
          { class: 'empty' },
          h('p', { class: 'empty-title', text: `Start chatting with ${this.agentName}` }),
          this.session?.agent?.description
            ? h('p', { text: this.session.agent.description })
            : null,
        ),
      );
    } else if (this.loaded) {
      this.stateEl.hidden = true;
    }
    this.updateComposer();
    if (stick) this.scrollToBottom();
  }

  scrollToBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.stick = true;
  }

  showConnection(status) {
    let label = CONNECTION_LABELS[status] ?? '';
    if (status === 'closed' && !this.destroyed) label = 'Disconnected';
    this.connEl.hidden = !label;
    this.connEl.textContent = label;
    this.connEl.className = `conn conn-${status}`;
  }

  // --------------------------------------------------------- composer --

  hasActiveRun() {
    for (const run of this.runs.values()) if (isActive(run.status)) return true;
    return false;
  }

  updateComposer() {
    const running = this.hasActiveRun();
    // The composer stays usable during a run: a message sent then is queued or steered.
    const locked = !this.loaded || this.sending;
    const name = this.agentName || 'the agent';
    const steer = this.messageMode === 'steer';
    this.input.placeholder = running
      ? steer
        ? `${name} is working… a message now joins the current answer`
        : `${name} is working… a message now waits its turn`
      : `Message ${name}…`;
    const wasDisabled = this.input.disabled;
    this.input.disabled = locked;
    const hasText = !!this.input.value.trim();
    this.sendBtn.disabled = locked || !hasText;
    this.form.classList.toggle('is-locked', locked);
    this.form.classList.toggle('is-running', running);
    // While a run works, Send becomes Stop; typing brings Send (queue / steer) back next to it.
    this.stopBtn.hidden = !running;
    this.sendBtn.hidden = running && !hasText;
    this.sendBtn.textContent = this.sending ? 'Sending…' : running ? (steer ? 'Steer' : 'Queue') : 'Send';
    this.hintEl.textContent = running
      ? 'Esc to stop · Enter to send'
      : 'Enter to send · Shift+Enter for a new line';
    // Give focus back when a run finishes, unless the user is elsewhere.
    if (wasDisabled && !locked && this.loaded) {
      const active = document.activeElement;
      if (!active || active === document.body || active === this.sendBtn) this.input.focus();
    }
  }

  autosize() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }

  async send() {
    const typed = this.input.value.trim();
    if (!typed || this.input.disabled || this.sending) return;
    this.sending = true;
    const wasRunning = this.hasActiveRun();
    this.updateComposer();
    try {
      let content = typed;
      if (this.attachments.length) {
        const uploaded = await api.uploadAttachments(this.sessionId, this.attachments.map((a) => a.file));
        content = `${uploaded.map((a) => a.reference).join('\n\n')}\n\n${typed}`;
        this.attachments = [];
        this.renderChips();
        if (this.filesOpen) this.loadFiles();
      }
      const answer = await api.sendMessage(this.sessionId, content);
      if (this.destroyed) return;
      this.input.value = '';
      this.autosize();
      const created = answer && (answer.run || answer);
      if (created && created.id !== undefined && created.id !== null) {
        const run = this.ensureRun(created.id);
        if (!run.input) run.input = content;
        if (created.status && rank(created.status) > rank(run.status)) run.status = created.status;
        if (!run.createdAt) run.createdAt = created.created_at || new Date().toISOString();
        if (wasRunning && this.messageMode === 'steer') run.steered = true;
        this.dirty.add(run.id);
      }
      this.stick = true;
    } catch (err) {
      if (this.destroyed) return;
      if (err instanceof ApiError && err.isAuth) this.onAuthLost({ message: err.message });
      else this.toast(err.message || 'Could not send the message.', 'error');
    } finally {
      this.sending = false;
      if (!this.destroyed) {
        this.flush();
        this.schedule();
      }
    }
  }

  /** Stop the answer in progress (the latest active run of the chat). */
  async stop() {
    const active = this.order
      .map((id) => this.runs.get(id))
      .filter((run) => run && isActive(run.status) && !run.steeredInto && !run.steered);
    if (!active.length || this.stopping) return;
    this.stopping = true;
    this.stopBtn.disabled = true;
    try {
      // The one working first; queued ones behind it are cancelled too (as ChatGPT's Stop).
      for (const run of active.reverse()) {
        try {
          await api.cancelRun(run.id);
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 409)) throw err;
        }
      }
      this.refetchSoon(300);
    } catch (err) {
      if (err instanceof ApiError && err.isAuth) this.onAuthLost({ message: err.message });
      else this.toast(err.message || 'Could not stop the answer.', 'error');
    } finally {
      this.stopping = false;
      this.stopBtn.disabled = false;
    }
  }

  /** Forget runs the server replaced (edit / regenerate truncate the chat). */
  dropRunsFrom(run) {
    const index = this.order.indexOf(String(run.id));
    if (index < 0) return;
    this.goneRuns = this.goneRuns || new Set();
    for (const id of this.order.slice(index)) {
      this.goneRuns.add(id);
      this.runs.delete(id);
      this.views.get(id)?.el.remove();
      this.views.delete(id);
    }
    this.order = this.order.slice(0, index);
    this.orderChanged = true;
  }

  async resend(run, request) {
    try {
      const answer = await request();
      if (this.destroyed) return false;
      this.dropRunsFrom(run);
      const created = answer.run;
      const fresh = this.ensureRun(created.id);
      fresh.input = created.input;
      fresh.createdAt = created.created_at;
      this.dirty.add(fresh.id);
      this.stick = true;
      this.schedule();
      this.refetchSoon(300);
      return true;
    } catch (err) {
      if (err instanceof ApiError && err.isAuth) this.onAuthLost({ message: err.message });
      else this.toast(err.message || 'That did not work.', 'error');
      return false;
    }
  }

  editRun(run, content) {
    return this.resend(run, () => api.editRun(run.id, content));
  }

  retryRun(run) {
    return this.resend(run, () => api.retryRun(run.id));
  }

  async continueWithSummary() {
    try {
      const answer = await api.continueChat(this.sessionId);
      if (this.destroyed) return;
      this.onNewChat(answer.session, answer.draft);
    } catch (err) {
      this.toast(err.message || 'Could not start a new chat.', 'error');
    }
  }

  /** Pre-fill the composer (a new chat's draft). */
  setDraft(text) {
    this.input.value = text || '';
    this.autosize();
    this.updateComposer();
  }

  showUsage(usage) {
    if (!usage) return;
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    this.usageEl.hidden = !tokens;
    const cost = Number(usage.cost_usd || 0);
    this.usageEl.textContent = `${formatTokens(tokens)} tokens · $${cost < 0.01 && cost > 0 ? cost.toFixed(4) : cost.toFixed(2)}`;
    this.usageEl.title = `This chat: ${usage.prompt_tokens || 0} prompt + ${usage.completion_tokens || 0} completion tokens, $${usage.cost_usd}`;
  }

  announce(text) {
    this.live.textContent = '';
    setTimeout(() => {
      this.live.textContent = text;
    }, 50);
  }

  // ------------------------------------------------------- attachments --

  addFiles(files) {
    const limit = 10 * 1024 * 1024;
    for (const file of files) {
      if (file.size > limit) {
        this.toast(`“${file.name}” is larger than 10 MB and was not attached.`, 'error');
        continue;
      }
      this.attachments.push({ file, id: Math.random().toString(36).slice(2) });
    }
    this.attachments = this.attachments.slice(0, 10);
    this.renderChips();
    this.input.focus();
  }

  renderChips() {
    this.chipsEl.hidden = !this.attachments.length;
    replaceChildren(
      this.chipsEl,
      this.attachments.map((a) => {
        const remove = h('button', { type: 'button', class: 'chip-remove', 'aria-label': `Remove ${a.file.name}`, text: '×' });
        remove.addEventListener('click', () => {
          this.attachments = this.attachments.filter((x) => x.id !== a.id);
          this.renderChips();
          this.input.focus();
        });
        return h(
          'li',
          { class: 'attach-chip', testid: 'attachment-chip' },
          icon(a.file.type.startsWith('image/') ? 'image' : 'file'),
          h('span', { class: 'attach-name', text: a.file.name }),
          h('span', { class: 'attach-size', text: formatBytes(a.file.size) }),
          remove,
        );
      }),
    );
  }

  // ------------------------------------------------------------ files --

  async openFiles({ documentId = null } = {}) {
    this.filesOpen = true;
    this.filesPanel.hidden = false;
    this.filesBtn.setAttribute('aria-expanded', 'true');
    await this.loadFiles();
    if (documentId) await this.showDocument(documentId);
  }

  closeFiles() {
    this.filesOpen = false;
    this.filesPanel.hidden = true;
    this.filesBtn.setAttribute('aria-expanded', 'false');
    this.filesBtn.focus();
  }

  async loadFiles() {
    const close = h('button', { type: 'button', class: 'btn btn-ghost', 'aria-label': 'Close files', text: '×' });
    close.addEventListener('click', () => this.closeFiles());
    const head = h('div', { class: 'files-head' }, h('h2', { class: 'files-title', text: 'Files' }), close);
    replaceChildren(this.filesPanel, head, h('div', { class: 'side-note' }, spinner(), ' Loading…'));
    let artifacts = [];
    let documents = [];
    try {
      [artifacts, documents] = await Promise.all([
        api.listArtifacts(this.sessionId),
        api.listDocuments(this.sessionId),
      ]);
    } catch (err) {
      replaceChildren(this.filesPanel, head, h('p', { class: 'side-note side-error', text: err.message || 'Could not load files.' }));
      return;
    }
    const docItems = documents.map((doc) => {
      const open = h('button', { type: 'button', class: 'file-item', testid: 'file-document', dataset: { documentId: String(doc.id) } },
        icon('doc'),
        h('span', { class: 'file-name', text: doc.title || `Document ${doc.id}` }),
        h('span', { class: 'file-meta', text: `v${doc.version}` }));
      open.addEventListener('click', () => this.showDocument(doc.id));
      return h('li', {}, open);
    });
    const artifactItems = artifacts.map((a) =>
      h('li', {}, h('a', {
        class: 'file-item',
        testid: 'file-artifact',
        dataset: { artifactId: String(a.id) },
        href: `/api/v1/artifacts/${encodeURIComponent(a.id)}/content`,
        target: '_blank',
        rel: 'noopener',
      },
      a.mime_type.startsWith('image/')
        ? h('img', { class: 'file-thumb', src: `/api/v1/artifacts/${encodeURIComponent(a.id)}/content`, alt: '' })
        : icon('file'),
      h('span', { class: 'file-name', text: a.name }),
      h('span', { class: 'file-meta', text: formatBytes(a.size_bytes) }))));
    this.docView = h('div', { class: 'doc-view', testid: 'document-view', hidden: true });
    replaceChildren(
      this.filesPanel,
      head,
      h('h3', { class: 'files-sub', text: 'Documents' }),
      docItems.length ? h('ul', { class: 'files' }, docItems) : h('p', { class: 'side-note', text: 'No documents yet.' }),
      h('h3', { class: 'files-sub', text: 'Files and attachments' }),
      artifactItems.length ? h('ul', { class: 'files' }, artifactItems) : h('p', { class: 'side-note', text: 'Nothing attached yet.' }),
      this.docView,
    );
    mountKnowledgeUploads(this); // --- knowledge_uploads.js: "Add to knowledge" under attachments ---
  }

  async showDocument(id) {
    try {
      const doc = await api.getDocument(id);
      if (!this.docView) return;
      this.docView.hidden = false;
      replaceChildren(
        this.docView,
        h('h3', { class: 'doc-title', text: doc.title || `Document ${doc.id}` }),
        h('div', { class: 'bubble rich doc-body' }, renderRichText(doc.content || '')),
      );
      this.docView.scrollIntoView({ block: 'nearest' });
    } catch (err) {
      this.toast(err.message || 'Could not open the document.', 'error');
    }
  }
}

/** "1.2k", "3.4M". */
function formatTokens(n) {
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1000).toFixed(n < 10000 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(1)}M`;
}

/** "512 B", "1.2 kB", "3.4 MB". */
function formatBytes(n) {
  if (n < 1000) return `${n} B`;
  if (n < 1e6) return `${(n / 1000).toFixed(1)} kB`;
  return `${(n / 1e6).toFixed(1)} MB`;
}
