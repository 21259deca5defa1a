// One run of the conversation: the user's message (Copy, Edit), the tool call cards, the
// approval cards, the routing notices, the reply (streamed, then final; Copy, Regenerate), the
// sources under it (citations.js), and a stopped line or an error box with what to do next.

import { ApprovalView } from './approval_card.js';
import { renderCitations } from './citations.js'; // knowledge-base citations under the answer
import { isActive } from './chat_state.js';
import { h, replaceChildren, shortTime, fullTime, attach } from './dom.js';
import { jsonAsMarkdown, renderRichText } from './richtext.js';
import { ToolCardView } from './tool_card.js';
import { renderUserInput } from './resources_picker.js'; // sent messages' attached resources as chips

/** What happened and what to do next, for a run's failure reason. */
export const FAILURE_HELP = {
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
  guardrail_tripped: ['A guardrail of this agent stopped this request.', 'Rephrase your message, or ask your workspace admin about the rule.'],
  internal_error: ['Something went wrong on the server.', 'Try again. If it keeps happening, tell your workspace admin.'],
};

export class RunView {
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
    this.retraction = h('div', { class: 'run-retracted', testid: 'run-retracted', role: 'status' });
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
    this.renderedDisplay = null;
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

    renderUserInput(this.userText, run.input); // resources_picker.js: "[resource: …]" lines as chips
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
    // A final answer that is one JSON object or array (an agent's output schema, an API caller's
    // response_format) shows as a highlighted, indented code block (once it is final: the streamed
    // text of the same answer is rendered again then).
    const display = run.reply ? jsonAsMarkdown(shown) : shown;
    if (shown !== this.renderedReply || display !== this.renderedDisplay) {
      this.renderedReply = shown;
      this.renderedDisplay = display;
      replaceChildren(this.replyBody, renderRichText(display));
    }
    attach(this.el, this.reply, !!shown, this.pending);
    // An output guardrail withdrew the streamed answer: a notice in its place (guardrail_tripped).
    attach(this.el, this.retraction, !!run.retracted && !shown, this.pending);
    if (run.retracted) this.retraction.textContent = `Answer withdrawn. ${run.retracted}`;
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
      // A guardrail's own plain-language message (it names the guardrail) is the title.
      this.errorTitle.textContent = run.reason === 'guardrail_tripped' && run.error ? run.error : what;
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
