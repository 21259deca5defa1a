// An approval card in a run: a pending tool call to Approve / Deny (with an optional reason),
// an ask_user question with an answer box, or an MCP server's request for input (a form built
// from its schema, or a URL to open) with Accept / Decline / Cancel, then its outcome. A tool
// call whose approval rule names other approvers (a role, named members) says who decides
// instead of offering the buttons (their inbox: approvals_inbox.js). An MCP server's request to
// use the agent's model (kind sampling) shows what it would send the model, with Approve / Deny.
// An MCP server whose account nobody has connected (kind connection) offers Connect (the
// service's sign-in, then back to this chat; connecting resumes the run) and Continue without.

import { api, ApiError } from './api.js';
import { h, replaceChildren } from './dom.js';
import { elicitationForm, elicitationLink } from './elicitation_form.js';
import { pretty } from './tool_card.js';
import { approversText, mayDecide } from './approvals_inbox.js';
import { connectionsApi } from './mcp_connections.js';

/** A pending approval (Approve / Deny) or an ask_user question (answer box), then its outcome. */
export class ApprovalView {
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
    this.acceptBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'elicit-accept', text: 'Accept' });
    this.declineBtn = h('button', { type: 'button', class: 'btn', testid: 'elicit-decline', text: 'Decline' });
    this.cancelBtn = h('button', { type: 'button', class: 'btn', testid: 'elicit-cancel', text: 'Cancel' });
    this.acceptBtn.addEventListener('click', () => {
      const form = this.form;
      this.decide(form ? { action: 'accept', content: form.values() } : { action: 'accept' });
    });
    this.declineBtn.addEventListener('click', () => this.decide({ action: 'decline' }));
    this.cancelBtn.addEventListener('click', () => this.decide({ action: 'cancel' }));
    this.connectBtn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'connection-card-connect', text: 'Connect' });
    this.withoutBtn = h('button', { type: 'button', class: 'btn', testid: 'connection-card-without', text: 'Continue without' });
    this.connectBtn.addEventListener('click', () => this.connect());
    this.withoutBtn.addEventListener('click', () => this.decide({ decision: 'deny' }));
    this.form = null;
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
    const buttons = [this.approveBtn, this.denyBtn, this.sendBtn, this.acceptBtn, this.declineBtn, this.cancelBtn,
      this.connectBtn, this.withoutBtn];
    for (const b of buttons) b.disabled = true;
    try {
      const decided = await api.decideApproval(this.id, body);
      this.update({ ...this.approval, status: decided.status, answer: decided.answer || '' });
    } catch (err) {
      this.showError(err instanceof ApiError ? err.message : 'Could not send the decision.');
    } finally {
      this.busy = false;
      for (const b of buttons) b.disabled = false;
    }
  }

  /** Connect the server's account: its sign-in in this tab, back to this chat afterwards (the
   *  run resumes on its own once the account is connected). */
  async connect(navigate = (url) => window.location.assign(url)) {
    if (this.busy) return;
    const connection = (this.approval && this.approval.connection) || {};
    this.busy = true;
    this.showError('');
    this.connectBtn.disabled = true;
    try {
      const answer = await connectionsApi.connect(connection.server_id, `/${window.location.hash}`);
      navigate(answer.authorization_url);
    } catch (err) {
      this.showError(err instanceof ApiError ? err.message : 'Could not start connecting.');
      this.connectBtn.disabled = false;
    } finally {
      this.busy = false;
    }
  }

  showError(text) {
    this.error.textContent = text;
    this.error.hidden = !text;
  }

  update(approval) {
    this.approval = approval;
    const key = JSON.stringify([approval.status, approval.kind, approval.tool_name, approval.question, approval.skill, approval.answer,
      approval.elicitation, approval.sampling, approval.connection, approval.approvers, approval.can_decide]);
    if (key === this.key) return;
    this.key = key;
    this.el.dataset.kind = approval.kind;
    if (approval.kind === 'elicitation') {
      this.updateElicitation(approval);
      return;
    }
    if (approval.kind === 'sampling') {
      this.updateSampling(approval);
      return;
    }
    if (approval.kind === 'connection') {
      this.updateConnection(approval);
      return;
    }
    const question = approval.kind === 'question';
    // A tool the API client offered (OpenAI-compatible API): that client runs it and answers,
    // not a person here, so the card only says what the run waits for.
    const clientTool = approval.kind === 'client_tool';
    const pending = approval.status === 'pending';
    this.el.dataset.status = approval.status;
    this.el.classList.toggle('is-pending', pending);
    // A skill's sub-run asks through its user's run: say which skill.
    const inSkill = approval.skill ? ` (in the skill ${approval.skill})` : '';
    this.title.textContent = question
      ? `${approval.question}`
      : clientTool
        ? `Waiting for the API client to run ${approval.tool_name}`
        : `Allow ${approval.tool_name || 'this tool'}${inSkill}?`;
    this.reason.textContent = question ? `The agent asks${inSkill}:` : approval.reason;
    this.reason.hidden = !this.reason.textContent;
    this.detail.textContent = question ? '' : pretty(approval.arguments) || '{}';
    this.detail.hidden = question;
    // The rule names other approvers: say who decides; the run goes on once they have.
    const reviewer = pending && !question && !clientTool && !mayDecide(approval);
    replaceChildren(
      this.actions,
      reviewer
        ? [h('span', { class: 'approval-waiting', testid: 'approval-waiting-reviewer',
          text: `Waiting for a reviewer (${approversText(approval.approvers) || 'the approvers'}).` })]
        : pending && !clientTool
          ? (question ? [this.answer, this.sendBtn] : [this.approveBtn, this.denyReason, this.denyBtn])
          : [],
    );
    const labels = { approved: 'Approved', denied: 'Denied', answered: 'Answered', expired: 'Expired' };
    const why = approval.status === 'denied' && approval.answer ? ` — ${approval.answer}` : '';
    this.outcome.textContent = pending ? '' : `${labels[approval.status] || approval.status}${why}`;
    this.outcome.hidden = pending;
  }

  /** An MCP server asks to use the agent's model: what it would send (messages, system prompt,
   *  token cap, tools offered), then Approve / Deny (with an optional reason the server hears). */
  updateSampling(approval) {
    const sampling = approval.sampling || {};
    const pending = approval.status === 'pending';
    this.el.dataset.status = approval.status;
    this.el.classList.toggle('is-pending', pending);
    const server = sampling.server || approval.server || '';
    this.reason.textContent = `The MCP server ${server} asks, during ${approval.tool_name}:`;
    this.reason.hidden = false;
    this.title.textContent = `Allow ${server} to use the agent's model?`;
    this.detail.textContent = samplingText(sampling.requests || []);
    this.detail.hidden = false;
    this.detail.dataset.testid = 'sampling-request';
    const reviewer = pending && !mayDecide(approval);
    replaceChildren(
      this.actions,
      reviewer
        ? [h('span', { class: 'approval-waiting', testid: 'approval-waiting-reviewer',
          text: `Waiting for a reviewer (${approversText(approval.approvers) || 'the approvers'}).` })]
        : pending ? [this.approveBtn, this.denyReason, this.denyBtn] : [],
    );
    const labels = { approved: 'Approved', denied: 'Denied', expired: 'Nobody decided in time: declined' };
    const why = approval.status === 'denied' && approval.answer ? ` — ${approval.answer}` : '';
    this.outcome.textContent = pending ? '' : `${labels[approval.status] || approval.status}${why}`;
    this.outcome.hidden = pending;
  }

  /** An MCP server the run needs has no connected account: Connect, or Continue without. */
  updateConnection(approval) {
    const connection = approval.connection || {};
    const pending = approval.status === 'pending';
    this.el.dataset.status = approval.status;
    this.el.classList.toggle('is-pending', pending);
    const name = connection.server_name || connection.server || 'this service';
    const tenant = connection.auth_mode === 'oauth_tenant';
    this.title.textContent = connection.retry ? `Connect ${name} again?` : `Connect ${name}?`;
    this.reason.textContent = tenant
      ? `The agent needs the organisation’s account for ${name} (a tenant admin connects it).`
      : connection.retry
        ? `${name} refused your account during ${connection.tool || 'a call'}; connect it again and the call is made again.`
        : `The agent needs your ${name} account for this. Connect it and the agent goes on with it.`;
    this.reason.hidden = false;
    // A refused call says what the service answered; a first connection needs no more words.
    this.detail.textContent = connection.retry ? connection.message || '' : '';
    this.detail.hidden = !this.detail.textContent;
    this.connectBtn.textContent = connection.retry ? 'Connect again' : 'Connect';
    this.connectBtn.setAttribute('aria-label', `${this.connectBtn.textContent}: ${name}`);
    replaceChildren(this.actions, pending ? [this.connectBtn, this.withoutBtn] : []);
    const labels = { answered: 'Connected', denied: 'Continued without it', expired: 'Nobody connected it in time' };
    this.outcome.textContent = pending ? '' : labels[approval.status] || approval.status;
    this.outcome.hidden = pending;
  }

  /** An MCP server asks for input: its message, then a form (or a URL) and Accept / Decline / Cancel. */
  updateElicitation(approval) {
    const request = approval.elicitation || {};
    const pending = approval.status === 'pending';
    this.el.dataset.status = approval.status;
    this.el.classList.toggle('is-pending', pending);
    this.el.dataset.kind = 'elicitation';
    this.reason.textContent = `The MCP server ${request.server || ''} asks (${approval.tool_name}):`;
    this.reason.hidden = false;
    this.title.textContent = request.message || '';
    this.detail.hidden = true;
    const url = request.mode === 'url';
    // A new question of the same call (the server asks again) gets a new form.
    const formKey = JSON.stringify([request.message, request.schema]);
    if (!url && pending && (!this.form || this.formKey !== formKey)) {
      this.form = elicitationForm(request.schema);
      this.formKey = formKey;
    }
    this.acceptBtn.textContent = url ? 'I opened it' : 'Accept';
    replaceChildren(
      this.actions,
      pending
        ? [url ? elicitationLink(request.url || '') : this.form.el, this.acceptBtn, this.declineBtn, this.cancelBtn]
        : [],
    );
    const labels = { accept: 'Accepted', decline: 'Declined', cancel: 'Cancelled' };
    const expired = approval.status === 'expired' ? 'Nobody answered in time: declined' : '';
    this.outcome.textContent = pending ? '' : expired || labels[approval.answer] || 'Answered';
    this.outcome.hidden = pending;
  }
}

/** The text of a server's sampling request(s), as the card shows it (plain text, never HTML). */
function samplingText(requests) {
  return requests.map((request) => {
    const lines = [];
    if (request.system_prompt) lines.push(`System prompt: ${request.system_prompt}`, '');
    for (const message of request.messages || []) lines.push(`${message.role}: ${message.text}`);
    const tools = request.offers_tools ? `offers tools: ${(request.tools || []).join(', ')}` : 'no tools';
    lines.push('', `Up to ${request.max_tokens} tokens; ${tools}`);
    return lines.join('\n');
  }).join('\n\n---\n\n');
}
