// The approvals inbox (#/approvals): what waits for the signed-in user's decision, across the
// tenant's runs (GET /api/v1/approvals/?mine=approver): the approval rule names the user, the
// user's role, or the run's user when it is their own run. Each item is built by its kind (KINDS):
// - tool_call: what a reviewer needs (agent, tool, arguments, the rule's message, who asked,
//   waiting since, when it expires and what the expiry does) with Approve / Deny and a reason;
// - sampling (an MCP server asks to use the agent's model): what it would send, Approve / Deny;
// - connection (an MCP server needs the user's own account; only the run's user gets it):
//   Connect (POST mcp-connections/<id>/connect/, then the service's sign-in and back to
//   #/approvals; connecting answers it and the run resumes) and Continue without (a deny, as
//   the chat's card sends), never Approve (the server answers it 409);
// - elicitation and question (a form, a page to open, a typed answer): "Open the chat", where
//   the chat's card answers them.
// Kept out of app.js, which only hooks in: mountApprovalsNav(shell) adds the "Approvals" link
// with the number waiting, and ApprovalsInboxView is the page.
//
// Notification: there is no per-user event stream, so the link's count polls the inbox
// (every POLL_MS while the tab is visible) and the open page refreshes on the same tick.

import { request, ApiError } from './api.js';
import { append, h, replaceChildren } from './dom.js';
import { connectionsApi } from './mcp_connections.js';
import { pretty } from './tool_card.js';

const POLL_MS = 15000;

/** Who is signed in ({id, role}), for deciding whether the chat's own cards offer buttons. */
const viewer = { id: null, role: null };

/** Remember the signed-in user (app.js, from GET auth/me/). */
export function setViewer(me) {
  viewer.id = me?.user?.id ?? null;
  viewer.role = me?.role ?? null;
}

/**
 * Whether the signed-in user may decide `approval`: the server's `can_decide` when given (REST),
 * else from its `approvers` (an event's item): none named means the run's user, who is the
 * viewer of their own chat.
 */
export function mayDecide(approval) {
  if (typeof approval.can_decide === 'boolean') return approval.can_decide;
  const approvers = approval.approvers || {};
  if (!Object.keys(approvers).length || approvers.requester) return true;
  return (approvers.user_ids || []).includes(viewer.id) || (approvers.roles || []).includes(viewer.role);
}

/** Who may decide, in words ("a reviewer: role admin, member #3"). */
export function approversText(approvers) {
  const parts = [];
  if (approvers?.requester) parts.push('you');
  for (const role of approvers?.roles || []) parts.push(`role ${role}`);
  for (const id of approvers?.user_ids || []) parts.push(`member #${id}`);
  return parts.join(', ');
}

function inbox() {
  return request('GET', 'approvals/?mine=approver');
}

function ago(iso) {
  const seconds = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (seconds < 90) return 'just now';
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

function whenText(iso) {
  return new Date(iso).toLocaleString();
}

const ON_TIMEOUT = { deny: 'then it is denied', approve: 'then it is approved', '': 'then the run fails' };

/** Where Connect brings the browser back to, after the service's sign-in (as the chat card does
 *  with its chat's address). */
const RETURN_TO = '/#/approvals';

function agentName(approval) {
  return approval.agent?.name || 'An agent';
}

function button(text, testid, primary = false) {
  return h('button', { type: 'button', class: primary ? 'btn btn-primary' : 'btn', testid, text });
}

function reasonInput(label) {
  return h('input', {
    type: 'text', class: 'approval-deny-reason', testid: 'inbox-reason', maxlength: '2000',
    placeholder: 'Reason (optional)', 'aria-label': label,
  });
}

function message(text) {
  return text ? h('div', { class: 'approval-reason', testid: 'inbox-message', text }) : null;
}

/** `body` with the reason typed in `input`, when there is one. */
function withReason(body, input) {
  const text = input.value.trim();
  return text ? { ...body, reason: text } : body;
}

/**
 * What an item of each kind says and offers. Each takes the item's `ctx` ({approval, decide,
 * showError}) and returns {title, body: [nodes], actions: [nodes], onExpiry?: text}.
 * `ctx.decide(body, buttons, label)` POSTs the decision (the buttons disabled meanwhile) and
 * shows `label(decided)` (plus the reason given) as the outcome.
 */
const KINDS = {
  tool_call: toolCallItem,
  sampling: samplingItem,
  connection: connectionItem,
  elicitation: inChatItem,
  question: inChatItem,
};

/** A tool call to approve: the agent, the tool and its arguments, Approve / Deny (+ reason). */
function toolCallItem(ctx) {
  const { approval } = ctx;
  return {
    title: `${agentName(approval)} wants to run ${approval.tool_name}`,
    body: [message(approval.reason), h('pre', { class: 'tool-pre approval-args', text: pretty(approval.arguments) || '{}' })],
    actions: approveDeny(ctx, `Reason for your decision on ${approval.tool_name}`),
  };
}

/** An MCP server asks to use the agent's model: what it would send, Approve / Deny (+ reason),
 *  decided like a tool call (the server, or the model, hears a denial's reason). */
function samplingItem(ctx) {
  const { approval } = ctx;
  const sampling = approval.sampling || {};
  const server = sampling.server || approval.server || 'An MCP server';
  return {
    title: `${server} asks to use ${agentName(approval)}’s model (during ${approval.tool_name})`,
    body: [message(sampling.message || approval.message),
      h('pre', { class: 'tool-pre approval-args', testid: 'inbox-sampling', text: pretty(sampling.requests || []) })],
    actions: approveDeny(ctx, `Reason for your decision on ${server}’s request`),
    onExpiry: 'then it is declined',
  };
}

function approveDeny(ctx, label) {
  const reason = reasonInput(label);
  const approve = button('Approve', 'inbox-approve', true);
  const deny = button('Deny', 'inbox-deny');
  const decide = (decision) => ctx.decide(withReason({ decision }, reason), [approve, deny],
    (decided) => (decided.status === 'approved' ? 'Approved' : 'Denied'));
  approve.addEventListener('click', () => decide('approve'));
  deny.addEventListener('click', () => decide('deny'));
  return [approve, reason, deny];
}

/**
 * An MCP server the run needs has no connected account (the run's user sees it; the tenant's
 * account, `oauth_tenant`, is in the owners' and admins' inbox too, since only they connect it): Connect
 * (the service's sign-in, then back to the inbox; connecting answers it and the run resumes),
 * or Continue without (+ reason): `{"decision": "deny"}`, as the chat's card sends. No Approve:
 * the server answers it 409 until the account is connected.
 */
function connectionItem(ctx, { navigate = (url) => window.location.assign(url) } = {}) {
  const { approval } = ctx;
  const connection = approval.connection || {};
  const name = connection.server_name || connection.server || 'a service';
  const tenant = connection.auth_mode === 'oauth_tenant';
  const connect = button(connection.retry ? 'Connect again' : 'Connect', 'inbox-connect', true);
  connect.setAttribute('aria-label', `${connect.textContent}: ${name}`);
  const reason = reasonInput(`Reason for continuing without ${name} (optional)`);
  const without = button('Continue without', 'inbox-without');
  connect.addEventListener('click', async () => {
    connect.disabled = true;
    ctx.showError('');
    try {
      const answer = await connectionsApi.connect(connection.server_id, RETURN_TO);
      navigate(answer.authorization_url);
    } catch (err) {
      ctx.showError(err instanceof ApiError ? err.message : 'Could not start connecting.');
      connect.disabled = false;
    }
  });
  without.addEventListener('click', () => ctx.decide(withReason({ decision: 'deny' }, reason), [connect, without],
    () => 'Continued without it'));
  const why = tenant
    ? `The agent needs the organisation’s account for ${name} (a tenant admin connects it).`
    : connection.retry
      ? `${name} refused your account during ${connection.tool || 'a call'}; connect it again and the call is made again.`
      : `Connect it and the agent goes on with it (during ${connection.tool || approval.tool_name}).`;
  return {
    title: `${agentName(approval)} needs ${tenant ? 'the organisation’s' : 'your'} account on ${name}`,
    body: [message(why), connection.retry && connection.message
      ? h('pre', { class: 'tool-pre approval-args', text: connection.message }) : null],
    actions: [connect, reason, without],
    onExpiry: 'then the agent goes on without it',
  };
}

/** A question of the agent's (ask_user) or an MCP server's request for input (a form or a
 *  page to open): answered in the chat, where its form is; the item links there. */
function inChatItem(ctx) {
  const { approval } = ctx;
  const link = h('a', { class: 'btn btn-primary', testid: 'inbox-open-chat', text: 'Open the chat', hidden: true });
  const elsewhere = h('span', { class: 'approval-waiting', hidden: true,
    text: `It is answered in ${approval.requester?.username || 'its user'}’s chat.` });
  request('GET', `runs/${encodeURIComponent(approval.run)}/`).then((run) => {
    link.href = `#/sessions/${encodeURIComponent(run.session)}`;
    link.hidden = false;
  }, () => {
    elsewhere.hidden = false; // not the viewer's chat (a reviewer's): nothing to open
  });
  const elicitation = approval.kind === 'elicitation';
  const title = elicitation
    ? `${approval.server || 'An MCP server'} asks for your input (${agentName(approval)}, during ${approval.tool_name})`
    : approval.kind === 'question'
      ? `${agentName(approval)} asks you a question`
      : `${agentName(approval)} waits for you (${approval.kind})`;
  return {
    title,
    body: [message(elicitation ? approval.message : approval.question)],
    actions: [link, elsewhere],
    onExpiry: elicitation ? 'then it is declined' : undefined,
  };
}

/** One waiting approval, as its kind needs it (KINDS); `onDecided(approval)` after a decision. */
function InboxItem(approval, { onDecided }) {
  const error = h('div', { class: 'approval-error', role: 'alert', hidden: true });
  const outcome = h('div', { class: 'approval-outcome', testid: 'inbox-outcome', hidden: true });
  const actions = h('div', { class: 'approval-actions' });
  const item = h('li', {
    class: 'approval-card inbox-item is-pending', testid: 'inbox-item',
    'data-approval-id': String(approval.id), 'data-kind': approval.kind,
  });
  const showError = (text) => {
    error.textContent = text;
    error.hidden = !text;
  };
  const decide = async (body, buttons, label) => {
    for (const b of buttons) b.disabled = true;
    showError('');
    try {
      const decided = await request('POST', `approvals/${encodeURIComponent(approval.id)}/`, body);
      replaceChildren(actions);
      outcome.textContent = `${label(decided)}${body.reason ? ` — ${body.reason}` : ''}`;
      outcome.hidden = false;
      item.classList.remove('is-pending');
      onDecided(decided);
    } catch (err) {
      showError(err instanceof ApiError ? err.message : 'Could not send the decision.');
      for (const b of buttons) b.disabled = false;
    }
  };
  const view = (KINDS[approval.kind] || inChatItem)({ approval, decide, showError });
  replaceChildren(actions, view.actions);
  const onExpiry = view.onExpiry ?? ON_TIMEOUT[approval.on_timeout || ''] ?? '';
  return append(
    item,
    [
      h('div', { class: 'approval-title', testid: 'inbox-title', text: view.title }),
      view.body,
      h(
        'p',
        { class: 'inbox-meta', testid: 'inbox-meta' },
        `Asked by ${approval.requester?.username || 'someone'} · waiting since ${ago(approval.created_at)}`,
        ` · expires ${whenText(approval.expires_at)}, ${onExpiry}`,
      ),
      actions,
      error,
      outcome,
    ],
  );
}

/** The inbox page; `onCount(n)` is told how many wait after each load. */
export class ApprovalsInboxView {
  constructor({ onCount = () => {}, onAuthLost = () => {} } = {}) {
    this.onCount = onCount;
    this.onAuthLost = onAuthLost;
    this.list = h('ul', { class: 'inbox-list', testid: 'inbox-list' });
    this.status = h('p', { class: 'inbox-status', testid: 'inbox-status', role: 'status' });
    const refresh = h('button', { type: 'button', class: 'btn', testid: 'inbox-refresh', text: 'Refresh' });
    refresh.addEventListener('click', () => this.load());
    this.el = h(
      'section',
      { class: 'settings approvals-inbox', 'aria-labelledby': 'inbox-title', testid: 'approvals-inbox' },
      h('h1', { id: 'inbox-title', text: 'Approvals' }),
      h('p', { class: 'help', text: 'What agents wait for from you: tool calls to decide, accounts to connect, questions. The run goes on once answered.' }),
      refresh,
      this.status,
      this.list,
    );
    this.shown = new Set();
    this.timer = setInterval(() => {
      if (!document.hidden) this.load({ quiet: true });
    }, POLL_MS);
  }

  destroy() {
    clearInterval(this.timer);
  }

  async load({ quiet = false } = {}) {
    if (!quiet) this.status.textContent = 'Loading…';
    let items;
    try {
      items = await inbox();
    } catch (err) {
      if (err instanceof ApiError && err.isAuth) this.onAuthLost();
      this.status.textContent = err.message || 'Could not load the approvals.';
      return;
    }
    this.onCount(items.length);
    // Keep decided items on screen (their outcome); add the new ones; drop those gone elsewhere.
    const waiting = new Set(items.map((a) => String(a.id)));
    for (const li of [...this.list.children]) {
      const id = li.dataset.approvalId;
      if (!waiting.has(id) && !li.querySelector('[data-testid="inbox-outcome"]:not([hidden])')) {
        li.remove();
        this.shown.delete(id);
      }
    }
    for (const approval of items) {
      if (this.shown.has(String(approval.id))) continue;
      this.shown.add(String(approval.id));
      this.list.append(InboxItem(approval, { onDecided: () => this.onCount(this.count()) }));
    }
    this.status.textContent = items.length ? '' : 'Nothing waits for your decision.';
  }

  count() {
    return this.list.querySelectorAll('.inbox-item.is-pending').length;
  }
}

/**
 * The "Approvals" link in the top bar with the number waiting for the user (polled); returns
 * {setCount(n)} for the page to update it at once.
 */
export function mountApprovalsNav(shell) {
  const count = h('span', { class: 'inbox-count', testid: 'approvals-count', hidden: true });
  const link = h('a', { class: 'btn btn-ghost', href: '#/approvals', testid: 'open-approvals' }, 'Approvals ', count);
  const box = shell.header.querySelector('.user-box') || shell.header;
  box.prepend(link);
  const setCount = (n) => {
    count.textContent = String(n);
    count.hidden = !n;
    link.setAttribute('aria-label', n ? `Approvals, ${n} waiting` : 'Approvals');
  };
  const poll = async () => {
    if (document.hidden || !link.isConnected) return;
    try {
      setCount((await inbox()).length);
    } catch {
      // the next tick tries again
    }
  };
  setTimeout(poll, 0); // once the shell is on the page
  const timer = setInterval(() => (link.isConnected ? poll() : clearInterval(timer)), POLL_MS);
  return { setCount };
}
