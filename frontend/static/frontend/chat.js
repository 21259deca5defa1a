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
import { renderRichText } from './richtext.js';

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
  };
  if (!current) run.approvals.set(id, incoming);
  else if (current.status === 'pending') Object.assign(current, incoming);
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

function normalizeTool(raw) {
  return {
    id: String(raw.id ?? raw.tool_call_id),
    name: raw.name || 'tool',
    arguments: raw.arguments,
    status: raw.status || 'running',
    result: raw.result ?? null,
    error: raw.error ?? null,
    duration_ms: raw.duration_ms ?? null,
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
  }
}

// ------------------------------------------------------------- tool card --

class ToolCardView {
  constructor() {
    this.statusEl = h('span', { class: 'tool-status' });
    this.nameEl = h('span', { class: 'tool-name' });
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
        this.statusEl,
        this.durationEl,
      ),
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
    this.nameEl.textContent = tool.name;

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
    this.answer = h('textarea', { class: 'approval-answer', rows: 2, testid: 'approval-answer-input' });
    this.error = h('div', { class: 'approval-error', role: 'alert', hidden: true });
    this.approveBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'approval-approve', text: 'Approve' });
    this.denyBtn = h('button', { type: 'button', class: 'btn', testid: 'approval-deny', text: 'Deny' });
    this.sendBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'approval-answer-send', text: 'Send answer' });
    this.approveBtn.addEventListener('click', () => this.decide({ decision: 'approve' }));
    this.denyBtn.addEventListener('click', () => this.decide({ decision: 'deny' }));
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
      this.update({ ...this.approval, status: decided.status });
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
    const key = JSON.stringify([approval.status, approval.kind, approval.tool_name, approval.question, approval.skill]);
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
      pending ? (question ? [this.answer, this.sendBtn] : [this.approveBtn, this.denyBtn]) : [],
    );
    const labels = { approved: 'Approved', denied: 'Denied', answered: 'Answered', expired: 'Expired' };
    this.outcome.textContent = pending ? '' : labels[approval.status] || approval.status;
    this.outcome.hidden = pending;
  }
}

// ------------------------------------------------------------------- run --

class RunView {
  constructor(agentName) {
    this.agentName = agentName;
    this.userText = h('div', { class: 'bubble' });
    this.userTime = h('time', { class: 'msg-time' });
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
    this.reply = h(
      'div',
      { class: 'msg msg-assistant' },
      h('div', { class: 'msg-meta' }, this.replyName),
      this.replyBody,
    );
    this.errorTitle = h('strong');
    this.errorText = h('div', { class: 'run-error-text' });
    this.errorReason = h('div', { class: 'run-error-reason' });
    this.error = h(
      'div',
      { class: 'run-error', testid: 'run-error', role: 'alert' },
      this.errorTitle,
      this.errorText,
      this.errorReason,
    );
    this.el = h(
      'article',
      { class: 'run', testid: 'run' },
      h(
        'div',
        { class: 'msg msg-user' },
        h(
          'div',
          { class: 'msg-meta' },
          h('span', { class: 'msg-author', text: 'You' }),
          this.userTime,
        ),
        this.userText,
      ),
      this.tools,
      this.pending,
    );
    // The reply and the error box are attached only while they have content,
    // so their test ids never match empty, hidden elements.
    this.toolViews = new Map();
    this.renderedReply = null;
    this.notices = h('div', { class: 'model-notices', role: 'status' });
    this.renderedNotices = 0;
    this.approvals = h('div', { class: 'approval-list' });
    this.approvalViews = new Map();
  }

  update(run) {
    this.el.dataset.runStatus = run.status;
    this.el.dataset.runId = run.id;
    const active = isActive(run.status);
    this.el.setAttribute('aria-busy', active ? 'true' : 'false');

    if (this.userText.textContent !== run.input) this.userText.textContent = run.input;
    this.userTime.textContent = shortTime(run.createdAt);
    if (run.createdAt) this.userTime.setAttribute('datetime', run.createdAt);
    this.userTime.title = fullTime(run.createdAt);

    // Tool cards, in arrival order.
    for (const tool of run.tools.values()) {
      let view = this.toolViews.get(tool.id);
      if (!view) {
        view = new ToolCardView();
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

    // Routing notices (fallbacks, retries), above the reply.
    if (run.notices.length !== this.renderedNotices) {
      this.renderedNotices = run.notices.length;
      replaceChildren(
        this.notices,
        run.notices.map((text) => h('div', { class: 'model-notice', testid: 'model-notice', text })),
      );
    }
    attach(this.el, this.notices, run.notices.length > 0, this.pending);

    // Reply: the final text once known, the streamed text meanwhile.
    const shown = (run.reply !== null ? run.reply : run.stream) || '';
    if (shown !== this.renderedReply) {
      this.renderedReply = shown;
      replaceChildren(this.replyBody, renderRichText(shown));
    }
    attach(this.el, this.reply, !!shown, this.pending);
    this.replyName.textContent = this.agentName || 'Assistant';
    this.replyBody.classList.toggle('streaming', active && !!shown);

    // "Thinking" indicator while active and nothing is streaming yet.
    const runningTool = [...run.tools.values()].some((t) => isActive(t.status));
    this.pending.hidden = !active || (!!shown && !runningTool);
    this.pendingText.textContent =
      run.status === 'queued' || run.status === 'pending'
        ? 'Queued…'
        : run.status === 'awaiting_approval'
          ? 'Waiting for you…'
          : runningTool
          ? 'Running tools…'
          : 'Thinking…';

    const failed = run.status === 'failed' || run.status === 'error';
    const cancelled = run.status === 'cancelled';
    const showError = failed || cancelled || (!active && !!run.error);
    attach(this.el, this.error, showError, null);
    this.el.classList.toggle('is-cancelled', cancelled);
    if (showError) {
      this.errorTitle.textContent = cancelled ? 'Run cancelled' : 'Run failed';
      this.errorText.textContent =
        run.error ||
        (cancelled ? 'This run was cancelled.' : 'The agent could not complete this request.');
      this.errorReason.textContent = run.reason ? `Reason: ${run.reason}` : '';
      this.errorReason.hidden = !run.reason;
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
  constructor({ sessionId, wsBase, toast, onSession, onAuthLost }) {
    this.sessionId = String(sessionId);
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

    this.build();
  }

  build() {
    this.titleEl = h('h1', { class: 'chat-title', id: 'chat-title', text: 'Loading…' });
    this.subEl = h('div', { class: 'chat-sub' });
    this.connEl = h('span', { class: 'conn', role: 'status', hidden: true });
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
      h(
        'div',
        { class: 'composer-inner' },
        h('label', { class: 'visually-hidden', for: 'composer-input', text: 'Message' }),
        this.input,
        this.sendBtn,
      ),
      h('div', {
        class: 'composer-hint',
        id: 'composer-hint',
        text: 'Enter to send · Shift+Enter for a new line',
      }),
    );
    this.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.send();
    });

    // The todo panel is attached to bodyEl (next to chat-main) when there are todos.
    this.bodyEl = h(
      'div',
      { class: 'chat-body' },
      h('div', { class: 'chat-main' }, this.scroller, this.form),
    );
    this.el = h(
      'section',
      { class: 'chat', 'aria-labelledby': 'chat-title' },
      h(
        'header',
        { class: 'chat-header' },
        h('div', { class: 'chat-titles' }, this.titleEl, this.subEl),
        this.connEl,
      ),
      this.bodyEl,
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

    const runs = Array.isArray(session.runs) ? [...session.runs] : [];
    // Oldest first (stable sort keeps server order for equal timestamps).
    runs.sort((a, b) => String(a.created_at || '').localeCompare(String(b.created_at || '')));
    for (const raw of runs) {
      const run = this.ensureRun(raw.id);
      if (raw.input) run.input = raw.input;
      if (raw.created_at) run.createdAt = raw.created_at;
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
      this.dirty.add(run.id);
    }
    // Canonical order: the server's runs, then any only seen live so far.
    const serverIds = runs.map((r) => String(r.id));
    const liveOnly = this.order.filter((id) => !serverIds.includes(id));
    this.order = [...serverIds, ...liveOnly];
    this.orderChanged = true;

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
    if (frame.run_id === null || frame.run_id === undefined) return;
    // A skill's sub-run: shown as its parent's tool call, not as a run of the conversation.
    if (data.parent_run_id !== undefined && data.parent_run_id !== null) return;
    const known = this.runs.has(String(frame.run_id));
    const handlers = {
      run_queued: (run) => {
        if (!run.input && typeof data.input === 'string') run.input = data.input;
        if (!run.createdAt) run.createdAt = toIso(frame.ts);
      },
      run_running: (run) => {
        if (rank(run.status) < 2) run.status = 'running';
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
        // Re-fetch for the canonical view (not for replays of finished runs).
        if (wasActive) this.refetchSoon();
      },
      run_failed: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'failed';
        run.error = data.error || run.error || 'The run failed.';
        run.reason = data.reason || run.reason || '';
        if (wasActive) this.refetchSoon();
      },
      run_cancelled: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'cancelled';
        if (data.error) run.error = data.error;
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
    for (const id of this.dirty) {
      const run = this.runs.get(id);
      if (!run) continue;
      let view = this.views.get(id);
      if (!view) {
        view = new RunView(this.agentName);
        this.views.set(id, view);
        this.orderChanged = true;
      }
      view.agentName = this.agentName;
      view.update(run);
    }
    this.dirty.clear();
    if (this.orderChanged) {
      const wanted = this.order.map((id) => this.views.get(id)?.el).filter(Boolean);
      const current = [...this.runsEl.children];
      if (wanted.length !== current.length || wanted.some((el, i) => el !== current[i])) {
        // append() moves existing nodes: this re-sorts without re-creating them.
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
    const locked = !this.loaded || this.sending || running;
    const name = this.agentName || 'the agent';
    this.input.placeholder = running ? `${name} is working…` : `Message ${name}…`;
    const wasDisabled = this.input.disabled;
    this.input.disabled = locked;
    this.sendBtn.disabled = locked || !this.input.value.trim();
    this.form.classList.toggle('is-locked', locked);
    this.sendBtn.textContent = this.sending ? 'Sending…' : 'Send';
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
    const content = this.input.value.trim();
    if (!content || this.input.disabled || this.sending) return;
    this.sending = true;
    this.updateComposer();
    try {
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
}
