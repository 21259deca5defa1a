// The approvals inbox (#/approvals): the tool calls waiting for the signed-in user's decision,
// across the tenant's runs (GET /api/v1/approvals/?mine=approver): the approval rule names the
// user, the user's role, or the run's user when it is their own run. Each shows what a reviewer
// needs (agent, tool, arguments, the rule's message, who asked, waiting since, when it expires
// and what the expiry does) with Approve / Deny and an optional reason. Kept out of app.js,
// which only hooks in: mountApprovalsNav(shell) adds the "Approvals" link with the number
// waiting, and ApprovalsInboxView is the page.
//
// Notification: there is no per-user event stream, so the link's count polls the inbox
// (every POLL_MS while the tab is visible) and the open page refreshes on the same tick.

import { request, ApiError } from './api.js';
import { h, replaceChildren } from './dom.js';
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

/** One waiting approval with Approve / Deny (+ reason); `onDecided(approval)` after a decision. */
function InboxItem(approval, { onDecided }) {
  const error = h('div', { class: 'approval-error', role: 'alert', hidden: true });
  const reason = h('input', {
    type: 'text', class: 'approval-deny-reason', testid: 'inbox-reason', maxlength: '2000',
    placeholder: 'Reason (optional)', 'aria-label': `Reason for your decision on ${approval.tool_name}`,
  });
  const approve = h('button', { type: 'button', class: 'btn btn-primary', testid: 'inbox-approve', text: 'Approve' });
  const deny = h('button', { type: 'button', class: 'btn', testid: 'inbox-deny', text: 'Deny' });
  const actions = h('div', { class: 'approval-actions' }, approve, reason, deny);
  const outcome = h('div', { class: 'approval-outcome', testid: 'inbox-outcome', hidden: true });
  const decide = async (decision) => {
    approve.disabled = deny.disabled = true;
    error.hidden = true;
    const text = reason.value.trim();
    try {
      const decided = await request('POST', `approvals/${encodeURIComponent(approval.id)}/`,
        text ? { decision, reason: text } : { decision });
      replaceChildren(actions);
      outcome.textContent = `${decided.status === 'approved' ? 'Approved' : 'Denied'}${text ? ` — ${text}` : ''}`;
      outcome.hidden = false;
      onDecided(decided);
    } catch (err) {
      error.textContent = err instanceof ApiError ? err.message : 'Could not send the decision.';
      error.hidden = false;
      approve.disabled = deny.disabled = false;
    }
  };
  approve.addEventListener('click', () => decide('approve'));
  deny.addEventListener('click', () => decide('deny'));
  return h(
    'li',
    { class: 'approval-card inbox-item is-pending', testid: 'inbox-item', 'data-approval-id': String(approval.id) },
    h('div', { class: 'approval-title', text: `${approval.agent?.name || 'An agent'} wants to run ${approval.tool_name}` }),
    approval.reason ? h('div', { class: 'approval-reason', testid: 'inbox-message', text: approval.reason }) : null,
    h('pre', { class: 'tool-pre approval-args', text: pretty(approval.arguments) || '{}' }),
    h(
      'p',
      { class: 'inbox-meta', testid: 'inbox-meta' },
      `Asked by ${approval.requester?.username || 'someone'} · waiting since ${ago(approval.created_at)}`,
      ` · expires ${whenText(approval.expires_at)}, ${ON_TIMEOUT[approval.on_timeout || ''] || ''}`,
    ),
    actions,
    error,
    outcome,
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
      h('p', { class: 'help', text: 'Tool calls of agents waiting for your decision. The run goes on once decided.' }),
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
    return this.list.querySelectorAll('.inbox-item [data-testid="inbox-approve"]').length;
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
