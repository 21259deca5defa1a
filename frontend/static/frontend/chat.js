// The chat screen: a session's runs (user message, tool call cards, assistant reply, error), a
// todo panel, the Files panel and the composer, kept live by the session's event stream.
//
// ChatView puts the parts together; each concern is its own module:
//   - chat_state.js: the conversation's state (runs merged from REST and from frames);
//   - chat_connection.js: the event stream, its connection label and the stall watchdog;
//   - run_view.js (with tool_card.js and approval_card.js): one run on screen;
//   - composer.js: the message box and the attachments; files_panel.js; todo_panel.js.
// Views are updated in place (so open/closed <details> survive updates) and batched per
// animation frame (token streams can be fast): a run marked dirty is rendered at the next frame.

import { mountMemoryButton } from './memory.js'; // long-term memory: the header's "Memory" dialog
import { mountSchedulesButton } from './schedules.js'; // the header's "Scheduled" dialog (schedules.js)
import { api, ApiError } from './api.js';
import { ChatConnection } from './chat_connection.js';
import { Conversation } from './chat_state.js';
import { Composer } from './composer.js';
import { CommandsPicker } from './commands_picker.js';
import { h, replaceChildren, spinner } from './dom.js';
import { FilesPanel } from './files_panel.js';
import { copyText, flashCopied, wireCopyButtons } from './richtext.js';
import { FAILURE_HELP, RunView } from './run_view.js';
import { settings } from './settings.js';
import { TodoPanel } from './todo_panel.js';

export { toolLabel } from './tool_card.js'; // the chat's tool labels, for tests and other views

export class ChatView {
  /**
   * @param {object} opts
   * @param {string} opts.sessionId
   * @param {string} opts.wsBase
   * @param {(message: string, kind?: string) => void} opts.toast
   * @param {(session: object) => void} [opts.onSession] called with each fetched session
   * @param {(opts?: {quiet?: boolean, message?: string}) => void} [opts.onAuthLost]
   *   the API answered 401/403 (the app checks whether the login expired)
   * @param {(session: object, draft: string) => void} [opts.onNewChat] a new chat was started
   *   with a summary of this one
   * @param {boolean} [opts.isAdmin] show routing notices to admins (settings.js decides)
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
    this.conversation = new Conversation({
      todos: (todos) => this.setTodos(todos),
      artifactsChanged: () => {
        if (this.filesOpen) this.loadFiles();
      },
      titled: (title) => this.applyTitle(title),
      handedOff: (agentName) => this.applyHandoff(agentName),
      runEnded: (run, status, { steered }) => this.runEnded(run, status, steered),
    });
    this.views = new Map(); // run id -> RunView
    this.todos = null;
    this.loaded = false;
    this.sending = false;
    this.destroyed = false;
    this.stick = true;
    this.frameRequested = false;
    this.lastFetchAt = 0;
    this.lastRunId = null; // the run that may be regenerated / retried
    this.actions = {
      copy: (text, button) => copyText(text).then((ok) => flashCopied(button, ok)),
      edit: (run, content) => this.editRun(run, content),
      retry: (run) => this.retryRun(run),
      continueWithSummary: (run) => this.continueWithSummary(run),
      openDocument: (id) => this.files.show({ documentId: id }),
    };
    this.onKeydown = (event) => {
      if (event.key !== 'Escape' || event.defaultPrevented || this.destroyed) return;
      if (document.querySelector('dialog[open]')) return;
      if (this.conversation.hasActiveRun()) {
        event.preventDefault();
        this.stop();
      }
    };
    document.addEventListener('keydown', this.onKeydown);
    this.offSettings = settings.onChange(() => {
      for (const id of this.conversation.order) this.conversation.dirty.add(id);
      this.schedule();
    });

    this.build();
  }

  build() {
    this.titleEl = h('h1', { class: 'chat-title', id: 'chat-title', text: 'Loading…' });
    this.subEl = h('div', { class: 'chat-sub' });
    this.usageEl = h('span', { class: 'chat-usage', testid: 'chat-usage', hidden: true });
    this.connection = new ChatConnection({
      sessionId: this.sessionId,
      wsBase: this.wsBase,
      onFrame: (frame) => {
        if (this.conversation.applyFrame(frame)) this.schedule();
      },
      onReconnect: () => this.refetchSoon(0),
      onAuthLost: () => this.onAuthLost({ quiet: true }),
      activity: () => ({
        active: !this.destroyed && this.conversation.hasActiveRun(),
        lastFrameAt: this.conversation.lastFrameAt,
        lastFetchAt: this.lastFetchAt,
      }),
      onStalled: () => this.refetchSoon(0),
    });
    this.files = new FilesPanel(this);
    this.live = h('div', { class: 'visually-hidden', 'aria-live': 'polite', role: 'status', testid: 'reply-announcer' });
    this.runsEl = h('div', { class: 'runs' });
    this.stateEl = h('div', { class: 'chat-state' }, spinner(), ' Loading conversation…');
    this.column = h('div', { class: 'chat-column' }, this.stateEl, this.runsEl);
    this.scroller = h('div', { class: 'chat-scroll', tabindex: '0', 'aria-label': 'Conversation' }, this.column);
    this.scroller.addEventListener('scroll', () => {
      const gap = this.scroller.scrollHeight - this.scroller.scrollTop - this.scroller.clientHeight;
      this.stick = gap < 80;
    });
    this.todoPanel = new TodoPanel();
    this.composer = new Composer({ onSend: () => this.send(), onStop: () => this.stop(), toast: this.toast });
    this.commands = new CommandsPicker({ composer: this.composer, toast: this.toast }); // `/` commands
    // The todo panel is attached to bodyEl (next to chat-main) when there are todos.
    this.mainEl = h('div', { class: 'chat-main' }, this.scroller, this.composer.el);
    this.bodyEl = h('div', { class: 'chat-body' }, this.mainEl, this.files.el);
    this.composer.acceptDrops(this.mainEl); // drop files anywhere on the conversation or the composer
    wireCopyButtons(this.scroller);
    wireCopyButtons(this.files.el);
    this.el = h(
      'section',
      { class: 'chat', 'aria-labelledby': 'chat-title' },
      h(
        'header',
        { class: 'chat-header' },
        h('div', { class: 'chat-titles' }, this.titleEl, this.subEl),
        this.usageEl,
        this.connection.el,
        this.files.toggle,
      ),
      this.bodyEl,
      this.live,
    );
  }

  // --- what other modules use (knowledge_uploads.js: the Files panel and the event stream) ---

  get filesPanel() {
    return this.files.el;
  }

  get filesOpen() {
    return this.files.open;
  }

  loadFiles() {
    return this.files.load();
  }

  /** The session's event stream (SessionSocket: `status`, `lastSeq`), once started. */
  get socket() {
    return this.connection.socket;
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
      if (!this.composer.disabled) this.composer.focus();
    } catch (err) {
      if (this.destroyed) return;
      this.showLoadError(err);
      return;
    }
    // Start after the REST snapshot; a full replay restores the todo panel and the streamed
    // text of a run in progress.
    this.connection.start();
  }

  destroy() {
    this.destroyed = true;
    document.removeEventListener('keydown', this.onKeydown);
    this.offSettings();
    this.connection.stop();
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

  /** A title the server gave the chat (`session_titled`): the header, the sidebar and the tab follow. */
  applyTitle(title) {
    if (typeof title !== 'string' || !title || !this.session) return;
    this.session = { ...this.session, title };
    this.titleEl.textContent = title;
    this.onSession(this.session);
  }

  /** Another agent took the chat over (`agent_handoff`): say so, and show it in the header. */
  applyHandoff(agentName) {
    if (typeof agentName !== 'string' || !agentName) return;
    this.toast(`${agentName} has taken over this chat and answers from now on.`, 'info');
    this.refetchSoon();
  }

  mergeSession(session) {
    this.session = session;
    const agent = session.agent || {};
    this.agentName = agent.name || 'Assistant';
    this.commands.setAgent(agent.id);
    this.titleEl.textContent = session.title || 'New chat';
    replaceChildren(
      this.subEl,
      h('span', { class: 'chat-agent', text: this.agentName }),
      agent.description ? h('span', { class: 'chat-desc', text: ` · ${agent.description}` }) : null,
    );
    mountMemoryButton(this, session); // --- memory (memory.js): the "Memory" button in the header ---
    mountSchedulesButton(this, session); // --- schedules (schedules.js): the "Scheduled" button ---
    // Runs the server no longer lists (edited or regenerated away) leave the chat.
    this.dropViews(this.conversation.mergeRuns(session.runs));
    this.messageMode = agent.message_mode || 'queue';
    this.showUsage(session.usage);
    if (Array.isArray(session.todos)) this.setTodos(session.todos);
    this.schedule();
    this.onSession(session);
  }

  dropViews(ids) {
    for (const id of ids) {
      this.views.get(id)?.el.remove();
      this.views.delete(id);
    }
  }

  /** A run that was active ended: re-fetch the canonical view, and say so to screen readers. */
  runEnded(run, status, steered) {
    this.refetchSoon();
    if (status === 'completed' && !steered) {
      this.announce(`${this.agentName} replied: ${String(run.reply || '').slice(0, 300)}`);
    } else if (status === 'failed') {
      this.announce(`The answer failed: ${(FAILURE_HELP[run.reason] || ['The agent could not answer.'])[0]}`);
    }
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
    const conversation = this.conversation;
    conversation.markWaiting();
    const { order } = conversation;
    const lastId = order.length ? order[order.length - 1] : null;
    if (lastId !== this.lastRunId) {
      if (this.lastRunId) conversation.dirty.add(this.lastRunId);
      if (lastId) conversation.dirty.add(lastId);
      this.lastRunId = lastId;
    }
    this.renderDirty(lastId);
    if (conversation.orderChanged) this.renderOrder();
    this.renderEmptyState();
    this.updateComposer();
    if (stick) this.scrollToBottom();
  }

  /** Render the runs marked dirty (a new run gets its view). */
  renderDirty(lastId) {
    const conversation = this.conversation;
    const showNotices = settings.showModelNotices(this.isAdmin);
    for (const id of conversation.dirty) {
      const run = conversation.runs.get(id);
      if (!run) continue;
      let view = this.views.get(id);
      if (!view) {
        view = new RunView(this.agentName, this.actions);
        this.views.set(id, view);
        conversation.orderChanged = true;
      }
      view.agentName = this.agentName;
      view.update(run, { isLast: id === lastId, showNotices });
    }
    conversation.dirty.clear();
  }

  /** Put the run views in the conversation's order (append() moves nodes without re-creating them). */
  renderOrder() {
    const wanted = this.conversation.order.map((id) => this.views.get(id)?.el).filter(Boolean);
    const current = [...this.runsEl.children];
    if (wanted.length !== current.length || wanted.some((el, i) => el !== current[i])) {
      for (const el of current) if (!wanted.includes(el)) el.remove();
      this.runsEl.append(...wanted);
    }
    this.conversation.orderChanged = false;
  }

  renderEmptyState() {
    if (!this.loaded) return;
    if (this.conversation.order.length) {
      this.stateEl.hidden = true;
      return;
    }
    this.stateEl.hidden = false;
    replaceChildren(
      this.stateEl,
      h(
        'div',
        { class: 'empty' },
        h('p', { class: 'empty-title', text: `Start chatting with ${this.agentName}` }),
        this.session?.agent?.description ? h('p', { text: this.session.agent.description }) : null,
      ),
    );
  }

  scrollToBottom() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.stick = true;
  }

  updateComposer() {
    this.composer.update({
      loaded: this.loaded,
      sending: this.sending,
      running: this.conversation.hasActiveRun(),
      agentName: this.agentName,
      agentId: this.session?.agent?.id,
      sessionId: this.sessionId,
      steer: this.messageMode === 'steer',
    });
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

  // ---------------------------------------------------------- actions --

  async send() {
    const typed = this.composer.text;
    if (!typed || this.composer.disabled || this.sending) return;
    this.sending = true;
    const wasRunning = this.conversation.hasActiveRun();
    this.updateComposer();
    try {
      const content = await this.withAttachments(typed);
      const answer = await api.sendMessage(this.sessionId, content, this.composer.resourcePicker.refs());
      if (this.destroyed) return;
      this.composer.setText('');
      this.composer.resourcePicker.clear();
      const created = answer && (answer.run || answer);
      if (created && created.id !== undefined && created.id !== null) {
        this.conversation.addSent(created, { content, steered: wasRunning && this.messageMode === 'steer' });
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

  /** Upload the composer's attachments (if any) and put their references before `typed`. */
  async withAttachments(typed) {
    const files = this.composer.files;
    if (!files.length) return typed;
    const uploaded = await api.uploadAttachments(this.sessionId, files);
    this.composer.clearFiles();
    if (this.filesOpen) this.loadFiles();
    return `${uploaded.map((a) => a.reference).join('\n\n')}\n\n${typed}`;
  }

  /** Stop the answer in progress (the latest active run of the chat). */
  async stop() {
    const active = this.conversation.stoppableRuns();
    if (!active.length || this.stopping) return;
    this.stopping = true;
    this.composer.setStopping(true);
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
      this.composer.setStopping(false);
    }
  }

  /** Edit or regenerate: the server replaces `run` and what follows with a new run. */
  async resend(run, request) {
    try {
      const answer = await request();
      if (this.destroyed) return false;
      this.dropViews(this.conversation.dropRunsFrom(run));
      const created = answer.run;
      const fresh = this.conversation.ensureRun(created.id);
      fresh.input = created.input;
      fresh.createdAt = created.created_at;
      this.conversation.dirty.add(fresh.id);
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
    this.composer.setText(text);
  }
}

/** "1.2k", "3.4M". */
function formatTokens(n) {
  if (n < 1000) return String(n);
  if (n < 1e6) return `${(n / 1000).toFixed(n < 10000 ? 1 : 0)}k`;
  return `${(n / 1e6).toFixed(1)}M`;
}
