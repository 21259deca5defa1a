// Screens other than the chat itself: login, the logged-in shell (header +
// sidebar with the agent picker and session list), the start page, toasts.
// Views only build DOM and report user intent through callbacks; app.js does
// the API calls and routing.

import { h, replaceChildren, spinner, shortTime, fullTime } from './dom.js';
import { settings } from './settings.js';
import { icon } from './icons.js';
import { TokensPanel } from './api_tokens.js';
import { GrantsPanel } from './oauth_grants.js';
import { ConnectionsPanel } from './mcp_connections.js';

// ---------------------------------------------------------------- toasts --

/**
 * Show a transient message in the #toasts region.
 * kind: 'error' (assertive, stays 8 s) | 'info' (polite, 4 s).
 */
export function toast(message, kind = 'error', { action = null } = {}) {
  let region = document.getElementById('toasts');
  if (!region) {
    region = h('div', { id: 'toasts', class: 'toasts' });
    document.body.append(region);
  }
  const close = h('button', {
    type: 'button',
    class: 'toast-close',
    'aria-label': 'Dismiss',
    text: '×',
  });
  let actionBtn = null;
  if (action) {
    actionBtn = h('button', { type: 'button', class: 'toast-action', testid: 'toast-action', text: action.label });
  }
  const item = h(
    'div',
    { class: `toast toast-${kind}`, role: kind === 'error' ? 'alert' : 'status', testid: 'toast' },
    h('span', { class: 'toast-text', text: message }),
    actionBtn,
    close,
  );
  const remove = () => item.remove();
  close.addEventListener('click', remove);
  if (actionBtn) {
    actionBtn.addEventListener('click', () => {
      remove();
      action.onClick();
    });
  }
  region.append(item);
  // Keep at most 4 on screen.
  while (region.children.length > 4) region.firstElementChild.remove();
  setTimeout(remove, action ? 10000 : kind === 'error' ? 8000 : 4000);
}

// ----------------------------------------------------------------- login --

/**
 * The login screen.
 * @param {(username: string, password: string) => Promise<void>} onLogin
 *   rejects with an Error whose message is shown under the form.
 * @param {{name: string, href: string} | null} sso single sign-on, while the operator has it
 *   on: a "Sign in with <name>" link to `href` (the provider's login, back to the app after).
 */
export function LoginView({ onLogin, sso = null }) {
  const username = h('input', {
    id: 'login-username',
    name: 'username',
    type: 'text',
    autocomplete: 'username',
    autocapitalize: 'none',
    spellcheck: 'false',
    required: true,
    testid: 'login-username',
  });
  const password = h('input', {
    id: 'login-password',
    name: 'password',
    type: 'password',
    autocomplete: 'current-password',
    required: true,
    testid: 'login-password',
  });
  const error = h('div', {
    class: 'form-error',
    role: 'alert',
    testid: 'login-error',
    hidden: true,
  });
  const submit = h(
    'button',
    { type: 'submit', class: 'btn btn-primary btn-block', testid: 'login-submit' },
    'Sign in',
  );

  const form = h(
    'form',
    { class: 'login-form', novalidate: true, 'aria-labelledby': 'login-title' },
    h('div', { class: 'brand-mark', 'aria-hidden': 'true', text: 'AP' }),
    h('h1', { id: 'login-title', text: 'Sign in to Agent Platform' }),
    h('div', { class: 'field' }, h('label', { for: 'login-username', text: 'Username' }), username),
    h('div', { class: 'field' }, h('label', { for: 'login-password', text: 'Password' }), password),
    error,
    submit,
    sso
      ? h('a', { class: 'btn btn-block', href: sso.href, testid: 'login-sso', text: `Sign in with ${sso.name}` })
      : null,
  );

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.hidden = true;
    if (!username.value.trim() || !password.value) {
      error.textContent = 'Enter your username and password.';
      error.hidden = false;
      (username.value.trim() ? password : username).focus();
      return;
    }
    submit.disabled = true;
    replaceChildren(submit, spinner(), ' Signing in…');
    try {
      await onLogin(username.value.trim(), password.value);
    } catch (err) {
      error.textContent = err.message || 'Sign-in failed.';
      error.hidden = false;
      password.select();
      password.focus();
    } finally {
      if (form.isConnected) {
        submit.disabled = false;
        replaceChildren(submit, 'Sign in');
      }
    }
  });

  const el = h('main', { class: 'login-screen' }, h('div', { class: 'login-card' }, form));
  // Focus once attached.
  queueMicrotask(() => username.focus());
  return el;
}

// ----------------------------------------------------------------- shell --

/** "Today" | "Yesterday" | "Previous 7 days" | "Previous 30 days" | "Older" for an ISO time. */
export function dayGroup(iso, now = new Date()) {
  const d = iso ? new Date(iso) : null;
  if (!d || Number.isNaN(d.getTime())) return 'Older';
  const startOfToday = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  const day = 86400000;
  const t = d.getTime();
  if (t >= startOfToday) return 'Today';
  if (t >= startOfToday - day) return 'Yesterday';
  if (t >= startOfToday - 7 * day) return 'Previous 7 days';
  if (t >= startOfToday - 30 * day) return 'Previous 30 days';
  return 'Older';
}

const GROUP_ORDER = ['Today', 'Yesterday', 'Previous 7 days', 'Previous 30 days', 'Older'];

/**
 * Header + sidebar + main area for a logged-in user.
 * Callbacks: onLogout(), onPickAgent(agent), onLoadMoreSessions(), onRetryAgents(),
 * onSearch(q), onRename(session, title) -> Promise<bool>, onDelete(session), onPickTenant(slug).
 */
export class Shell {
  constructor({ me, onLogout, onPickAgent, onLoadMoreSessions, onRetryAgents, onSearch, onRename, onDelete,
    onPickTenant }) {
    this.me = me;
    this.onPickTenant = onPickTenant || (() => {});
    this.onPickAgent = onPickAgent;
    this.onLoadMoreSessions = onLoadMoreSessions;
    this.onRetryAgents = onRetryAgents;
    this.onSearch = onSearch || (() => {});
    this.onRename = onRename || (async () => false);
    this.onDelete = onDelete || (() => {});
    this.activeSessionId = null;
    this.sessions = [];
    this.agents = null;
    this.agentsError = '';

    const tenant = me?.tenant?.name || me?.tenant?.slug || 'Workspace';
    const user = me?.user?.username || '';

    const logout = h('button', {
      type: 'button',
      class: 'btn btn-ghost',
      testid: 'logout',
      text: 'Log out',
    });
    logout.addEventListener('click', () => onLogout());
    this.menuBtn = h('button', {
      type: 'button',
      class: 'btn btn-ghost menu-btn',
      'aria-controls': 'sidebar',
      'aria-expanded': 'false',
      'aria-label': 'Toggle chat list',
      text: '☰',
    });
    this.menuBtn.addEventListener('click', () => this.toggleSidebar());

    const skip = h('a', { class: 'skip-link', href: '#main', testid: 'skip-link', text: 'Skip to main content' });
    skip.addEventListener('click', (event) => {
      event.preventDefault(); // the hash is the router's
      const target = this.main.querySelector('#composer-input:not([disabled])') || this.main;
      target.focus();
    });

    this.header = h(
      'header',
      { class: 'topbar' },
      skip,
      this.menuBtn,
      h(
        'div',
        { class: 'brand' },
        h('span', { class: 'brand-mark small', 'aria-hidden': 'true', text: 'AP' }),
        (this.tenantName = h('span', { class: 'tenant-name', testid: 'tenant-name', text: tenant })),
      ),
      h(
        'div',
        { class: 'user-box' },
        h('a', { class: 'btn btn-ghost', href: '#/settings', testid: 'open-settings', text: 'Settings' }),
        h('span', { class: 'user-name', testid: 'user-name', text: user }),
        me?.role ? h('span', { class: 'role-badge', text: me.role }) : null,
        logout,
      ),
    );

    // New chat: a button that opens the searchable agent picker.
    this.newChatBtn = h(
      'button',
      { type: 'button', class: 'btn btn-primary btn-block new-chat', testid: 'new-chat', 'aria-haspopup': 'dialog' },
      h('span', { 'aria-hidden': 'true', text: '+' }),
      ' New chat',
    );
    this.newChatBtn.addEventListener('click', () => this.openPicker());
    this.picker = new AgentPicker({
      onPick: (agent) => this.onPickAgent(agent),
      onRetry: () => this.onRetryAgents(),
    });

    this.searchInput = h('input', {
      type: 'search',
      class: 'chat-search',
      id: 'chat-search',
      testid: 'chat-search',
      placeholder: 'Search chats',
      'aria-label': 'Search chats (titles and messages)',
      autocomplete: 'off',
    });
    let searchTimer = null;
    this.searchInput.addEventListener('input', () => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => this.onSearch(this.searchInput.value.trim()), 250);
    });

    this.sessionList = h(
      'nav',
      { class: 'session-list', 'aria-label': 'Chats' },
      h('div', { class: 'side-note' }, spinner(), ' Loading chats…'),
    );
    this.moreBtn = h('button', {
      type: 'button',
      class: 'link-btn more-btn',
      hidden: true,
      text: 'Load older chats',
    });
    this.moreBtn.addEventListener('click', () => this.onLoadMoreSessions());
    this.usageEl = h('div', { class: 'side-usage', testid: 'usage-month', hidden: true });

    this.sidebar = h(
      'aside',
      { class: 'sidebar', id: 'sidebar' },
      h('div', { class: 'side-section' }, this.newChatBtn),
      h(
        'section',
        { class: 'side-section side-sessions', 'aria-labelledby': 'chats-title' },
        h('h2', { class: 'side-title', id: 'chats-title', text: 'Chats' }),
        this.searchInput,
        this.sessionList,
        this.moreBtn,
      ),
      this.usageEl,
    );

    this.main = h('main', { class: 'main', id: 'main', tabindex: '-1' });
    // On narrow screens the sidebar is a drawer: a click outside closes it.
    this.main.addEventListener('click', () => this.toggleSidebar(false));
    this.el = h('div', { class: 'app-shell' }, this.header, this.sidebar, this.main, this.picker.el);
  }

  toggleSidebar(force) {
    const open = force ?? !this.el.classList.contains('sidebar-open');
    this.el.classList.toggle('sidebar-open', open);
    this.menuBtn.setAttribute('aria-expanded', String(open));
  }

  setMain(node) {
    replaceChildren(this.main, node);
    this.toggleSidebar(false);
  }

  // ------------------------------------------------------------ agents --

  openPicker() {
    this.picker.open(this.agents, this.agentsError, this.recentAgentIds());
  }

  /** Agent ids of the most recent chats, newest first. */
  recentAgentIds() {
    const ids = [];
    for (const s of this.sortedSessions()) {
      const id = s.agent?.id !== undefined ? String(s.agent.id) : null;
      if (id && !ids.includes(id)) ids.push(id);
      if (ids.length >= 5) break;
    }
    return ids;
  }

  setAgents(agents) {
    this.agents = agents;
    this.agentsError = '';
    this.picker.refresh(agents, '', this.recentAgentIds());
  }

  setAgentsError(message) {
    this.agentsError = message;
    this.picker.refresh(null, message, []);
  }

  /** Disable the agent buttons while a session is being created. */
  setAgentsBusy(busy) {
    this.picker.setBusy(busy);
    if (!busy) this.picker.close();
  }

  // ---------------------------------------------------------- sessions --

  /** Replace (append=false) or extend the session list. */
  setSessions(sessions, { next = null, append = false, query = '' } = {}) {
    const byId = new Map((append ? this.sessions : []).map((s) => [String(s.id), s]));
    for (const s of sessions) byId.set(String(s.id), s);
    this.sessions = [...byId.values()];
    this.query = query;
    this.moreBtn.hidden = !next;
    this.renderSessions();
  }

  setSessionsError(message) {
    replaceChildren(this.sessionList, h('div', { class: 'side-note side-error', text: message }));
  }

  /** Insert or update one session (after creating it or refreshing it). */
  upsertSession(session) {
    const id = String(session.id);
    const index = this.sessions.findIndex((s) => String(s.id) === id);
    if (index >= 0) this.sessions[index] = { ...this.sessions[index], ...session };
    else this.sessions.unshift(session);
    this.renderSessions();
  }

  removeSession(id) {
    this.sessions = this.sessions.filter((s) => String(s.id) !== String(id));
    this.renderSessions();
  }

  /** Chats running or waiting for an approval (for the tab title). */
  activeCount() {
    return this.sessions.filter((s) => s.activity).length;
  }

  setActiveSession(id) {
    this.activeSessionId = id === null || id === undefined ? null : String(id);
    for (const item of this.sessionList.querySelectorAll('[data-session-id]')) {
      if (item.dataset.sessionId === this.activeSessionId)
        item.setAttribute('aria-current', 'page');
      else item.removeAttribute('aria-current');
    }
  }

  /**
   * The caller's tenants ([{name, slug, default}]): with more than one, the tenant name in the
   * header becomes a picker; picking calls onPickTenant(slug).
   */
  setTenants(list) {
    if (!Array.isArray(list) || list.length < 2 || !this.tenantName?.isConnected) return;
    const current = this.me?.tenant?.slug;
    const select = h(
      'select',
      { class: 'tenant-name tenant-picker', testid: 'tenant-picker', 'aria-label': 'Tenant' },
      ...list.map((t) => h('option', { value: t.slug, text: t.name || t.slug })),
    );
    select.value = current || list[0].slug;
    select.addEventListener('change', () => {
      if (select.value !== current) this.onPickTenant(select.value);
    });
    this.tenantName.replaceWith(select);
    this.tenantName = select;
  }

  setUsage(usage) {
    if (!usage) return;
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    this.usageEl.hidden = false;
    this.usageEl.textContent = `This month: ${tokens.toLocaleString()} tokens · $${Number(usage.cost_usd || 0).toFixed(2)}`;
  }

  sortedSessions() {
    // Most recent activity first.
    return [...this.sessions].sort((a, b) =>
      String(b.updated_at || b.created_at || '').localeCompare(String(a.updated_at || a.created_at || '')),
    );
  }

  renderSessions() {
    const sorted = this.sortedSessions();
    if (!sorted.length) {
      replaceChildren(
        this.sessionList,
        h('div', {
          class: 'side-note',
          text: this.query ? `No chats match “${this.query}”.` : 'No chats yet. Start one with “New chat”.',
        }),
      );
      return;
    }
    const groups = new Map();
    for (const s of sorted) {
      const g = dayGroup(s.updated_at || s.created_at);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(s);
    }
    replaceChildren(
      this.sessionList,
      GROUP_ORDER.filter((g) => groups.has(g)).map((g, i) =>
        h(
          'div',
          { class: 'session-group', testid: 'session-group', dataset: { group: g } },
          h('h3', { class: 'session-group-title', id: `session-group-${i}`, text: g }),
          h('ul', { class: 'sessions', 'aria-labelledby': `session-group-${i}` }, groups.get(g).map((s) => this.sessionItem(s))),
        ),
      ),
    );
  }

  sessionItem(s) {
    const badge = s.activity
      ? h('span', {
          class: `session-badge badge-${s.activity}`,
          testid: 'session-badge',
          dataset: { activity: s.activity },
          text: s.activity === 'awaiting_approval' ? 'Needs you' : 'Running',
        })
      : null;
    const link = h(
      'a',
      {
        class: 'session-item',
        href: `#/sessions/${encodeURIComponent(s.id)}`,
        testid: 'session-item',
        dataset: { sessionId: String(s.id) },
        'aria-current': String(s.id) === this.activeSessionId ? 'page' : null,
      },
      h('span', { class: 'session-title', text: s.title || 'New chat' }),
      h(
        'span',
        { class: 'session-meta' },
        h('span', { class: 'session-agent', text: s.agent?.name || '' }),
        badge,
        h('time', {
          datetime: s.updated_at || s.created_at || null,
          title: fullTime(s.updated_at || s.created_at),
          text: shortTime(s.updated_at || s.created_at),
        }),
      ),
    );
    const title = s.title || 'New chat';
    const rename = h('button', { type: 'button', class: 'icon-btn', testid: 'session-rename', 'aria-label': `Rename “${title}”`, title: 'Rename', text: '✎' });
    const remove = h('button', { type: 'button', class: 'icon-btn', testid: 'session-delete', 'aria-label': `Delete “${title}”`, title: 'Delete' }, icon('trash'));
    const li = h('li', { class: 'session-row' }, link, h('span', { class: 'session-actions' }, rename, remove));
    rename.addEventListener('click', () => this.startRename(li, s));
    remove.addEventListener('click', () => this.onDelete(s));
    return li;
  }

  startRename(li, s) {
    const input = h('input', {
      type: 'text',
      class: 'rename-input',
      testid: 'rename-input',
      maxlength: '200',
      'aria-label': 'Chat title',
      value: s.title || '',
    });
    const form = h('form', { class: 'rename-form' }, input);
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      if (save && title && title !== s.title) await this.onRename(s, title);
      this.renderSessions();
      this.sessionList.querySelector(`[data-session-id="${CSS.escape(String(s.id))}"]`)?.focus();
    };
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      finish(true);
    });
    input.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') {
        event.preventDefault();
        event.stopPropagation();
        finish(false);
      }
    });
    input.addEventListener('blur', () => finish(true));
    replaceChildren(li, form);
    input.focus();
    input.select();
  }
}

/** The New chat dialog: a searchable list of agents, pinned and recent ones first. */
class AgentPicker {
  constructor({ onPick, onRetry }) {
    this.onPick = onPick;
    this.onRetry = onRetry;
    this.search = h('input', {
      type: 'search',
      class: 'agent-search',
      id: 'agent-search',
      testid: 'agent-search',
      placeholder: 'Search agents',
      autocomplete: 'off',
      'aria-label': 'Search agents',
      'aria-controls': 'agent-results',
    });
    this.search.addEventListener('input', () => this.render());
    this.search.addEventListener('keydown', (event) => {
      if (event.key === 'ArrowDown') {
        event.preventDefault();
        this.results.querySelector('button.agent-option')?.focus();
      } else if (event.key === 'Enter') {
        event.preventDefault();
        this.results.querySelector('button.agent-option:not([disabled])')?.click();
      }
    });
    this.results = h('div', { class: 'agent-results', id: 'agent-results' });
    this.results.addEventListener('keydown', (event) => {
      if (event.key !== 'ArrowDown' && event.key !== 'ArrowUp') return;
      const buttons = [...this.results.querySelectorAll('button.agent-option')];
      const i = buttons.indexOf(document.activeElement);
      if (i < 0) return;
      event.preventDefault();
      const next = event.key === 'ArrowDown' ? buttons[i + 1] : buttons[i - 1];
      (next || (event.key === 'ArrowUp' ? this.search : null))?.focus();
    });
    this.count = h('p', { class: 'agent-count', role: 'status' });
    const close = h('button', { type: 'button', class: 'btn btn-ghost', 'aria-label': 'Close', text: '×' });
    close.addEventListener('click', () => this.close());
    this.el = h(
      'dialog',
      { class: 'agent-picker', testid: 'agent-picker', 'aria-labelledby': 'agent-picker-title' },
      h('div', { class: 'picker-head' }, h('h2', { id: 'agent-picker-title', text: 'New chat' }), close),
      this.search,
      this.count,
      this.results,
    );
    this.el.addEventListener('click', (event) => {
      if (event.target === this.el) this.close(); // a click on the backdrop
    });
    this.agents = null;
    this.error = '';
    this.recent = [];
    this.busy = false;
  }

  open(agents, error, recent) {
    this.search.value = '';
    this.refresh(agents, error, recent);
    if (!this.el.open) this.el.showModal();
    this.search.focus();
  }

  close() {
    if (this.el.open) this.el.close();
  }

  refresh(agents, error, recent) {
    this.agents = agents;
    this.error = error;
    this.recent = recent || [];
    if (this.el.open || this.el.isConnected) this.render();
  }

  setBusy(busy) {
    this.busy = busy;
    for (const b of this.results.querySelectorAll('button.agent-option')) b.disabled = busy;
    this.results.setAttribute('aria-busy', String(busy));
  }

  option(agent, pinned) {
    const btn = h(
      'button',
      {
        type: 'button',
        class: 'agent-option',
        testid: 'agent-option',
        dataset: { agentName: agent.name, agentId: String(agent.id) },
        title: agent.description || agent.name,
        disabled: this.busy,
      },
      h('span', { class: 'agent-avatar', 'aria-hidden': 'true', text: initials(agent.name) }),
      h(
        'span',
        { class: 'agent-text' },
        h('span', { class: 'agent-name', text: agent.name }),
        agent.description ? h('span', { class: 'agent-desc', text: agent.description }) : null,
      ),
    );
    btn.addEventListener('click', () => this.onPick(agent));
    const pin = h('button', {
      type: 'button',
      class: 'icon-btn agent-pin',
      testid: 'agent-pin',
      'aria-pressed': pinned ? 'true' : 'false',
      'aria-label': `${pinned ? 'Unpin' : 'Pin'} ${agent.name}`,
      title: pinned ? 'Unpin' : 'Pin to the top',
      text: pinned ? '★' : '☆',
    });
    pin.addEventListener('click', () => {
      settings.togglePinnedAgent(agent.id);
      this.render();
      this.results.querySelector(`[data-testid="agent-pin"][aria-label$="${CSS.escape(agent.name)}"]`)?.focus();
    });
    return h('li', { class: 'agent-row' }, btn, pin);
  }

  section(title, agents, pins) {
    if (!agents.length) return null;
    const id = `agent-group-${title.toLowerCase().replace(/\W+/g, '-')}`;
    return h(
      'section',
      { class: 'agent-group', 'aria-labelledby': id },
      h('h3', { class: 'agent-group-title', id, text: title }),
      h('ul', { class: 'agents' }, agents.map((a) => this.option(a, pins.has(String(a.id))))),
    );
  }

  render() {
    if (this.error) {
      const retry = h('button', { type: 'button', class: 'link-btn', text: 'Retry' });
      retry.addEventListener('click', () => this.onRetry());
      replaceChildren(this.results, h('div', { class: 'side-note side-error' }, this.error, ' ', retry));
      this.count.textContent = '';
      return;
    }
    if (!this.agents) {
      replaceChildren(this.results, h('div', { class: 'side-note' }, spinner(), ' Loading agents…'));
      return;
    }
    if (!this.agents.length) {
      replaceChildren(this.results, h('div', { class: 'side-note', text: 'No agents are available yet.' }));
      return;
    }
    const q = this.search.value.trim().toLowerCase();
    const pins = new Set(settings.pinnedAgents());
    const matches = this.agents.filter(
      (a) => !q || a.name.toLowerCase().includes(q) || (a.description || '').toLowerCase().includes(q),
    );
    this.count.textContent = q
      ? `${matches.length} of ${this.agents.length} agents match`
      : `${this.agents.length} agent${this.agents.length === 1 ? '' : 's'}`;
    if (q) {
      replaceChildren(
        this.results,
        matches.length
          ? this.section('Results', matches, pins)
          : h('p', { class: 'side-note', text: `No agent matches “${this.search.value.trim()}”.` }),
      );
      return;
    }
    const byId = new Map(this.agents.map((a) => [String(a.id), a]));
    const pinned = [...pins].map((id) => byId.get(id)).filter(Boolean);
    const recent = this.recent.filter((id) => !pins.has(id)).map((id) => byId.get(id)).filter(Boolean);
    const shown = new Set([...pinned, ...recent].map((a) => String(a.id)));
    const rest = this.agents.filter((a) => !shown.has(String(a.id)));
    replaceChildren(
      this.results,
      this.section('Pinned', pinned, pins),
      this.section('Recent', recent, pins),
      this.section(pinned.length || recent.length ? 'All agents' : 'Agents', rest, pins),
    );
  }
}

function initials(name) {
  const parts = String(name || '?')
    .trim()
    .split(/\s+/)
    .filter(Boolean);
  const letters = parts.length > 1 ? parts[0][0] + parts[1][0] : (parts[0] || '?').slice(0, 2);
  return letters.toUpperCase();
}

// ------------------------------------------------------------ start page --

export function HomeView({ me, onNewChat = null }) {
  const name = me?.user?.username;
  let start = null;
  if (onNewChat) {
    start = h('button', { type: 'button', class: 'btn btn-primary home-new-chat', testid: 'home-new-chat', text: 'Start a new chat' });
    start.addEventListener('click', () => onNewChat());
  }
  return h(
    'section',
    { class: 'home', 'aria-labelledby': 'home-title' },
    h(
      'div',
      { class: 'empty' },
      h('h1', {
        id: 'home-title',
        class: 'empty-title',
        text: name ? `Hello, ${name}` : 'Welcome',
      }),
      h('p', {
        text: 'Press “New chat” to pick an agent and start a conversation, or open one of your chats.',
      }),
      start ? h('p', {}, start) : null,
    ),
  );
}

/** Full-page message (boot failure etc.). */
export function MessageView(title, text, action) {
  return h(
    'main',
    { class: 'login-screen' },
    h('div', { class: 'login-card' }, h('h1', { text: title }), h('p', { text }), action || null),
  );
}

// -------------------------------------------------------------- settings --

/** What each `purpose` of `GET usage/me/`'s `by_purpose` rows was spent on, in words. */
const USAGE_PURPOSES = {
  turn: 'Answers in chats',
  compaction: 'Summarizing long chats so they fit the model (compaction)',
  title: 'Chat titles',
  memory: 'Remembering things from chats',
  query_rewrite: 'Knowledge search: rewording the question',
  rerank: 'Knowledge search: ranking the passages found',
};

/**
 * A usage table: one row per breakdown row (its label, tokens in + out, cost in USD).
 * @param {object} opts {caption (for screen readers), heading (first column), rows, label: row → text, testid}
 */
function usageTable({ caption, heading, rows, label, testid }) {
  return h(
    'table',
    { class: 'usage-table', testid },
    h('caption', { class: 'visually-hidden', text: caption }),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: heading }), h('th', { scope: 'col', text: 'Tokens' }), h('th', { scope: 'col', text: 'Cost' }))),
    h(
      'tbody',
      {},
      rows.map((row) =>
        h(
          'tr',
          {},
          h('td', { text: label(row) }),
          h('td', { text: ((row.prompt_tokens || 0) + (row.completion_tokens || 0)).toLocaleString() }),
          h('td', { text: `$${Number(row.cost_usd || 0).toFixed(4)}` }),
        ),
      ),
    ),
  );
}

/**
 * The settings page: theme (system / light / dark), whether model retries and fallbacks
 * show in chats, the member's usage this month, their API tokens (api_tokens.js) and the apps
 * they connected with OAuth (oauth_grants.js).
 * @param {object} opts {me, usage: GET usage/me/ answer or null, usageError: string,
 *   tokensPanel: a TokensPanel() to show (kept across re-renders), else a new one;
 *   grantsPanel: a GrantsPanel() likewise; connectionsPanel: a ConnectionsPanel() (mcp_connections.js) likewise}
 */
export function SettingsView({ me, usage = null, usageError = '', tokensPanel = null, grantsPanel = null, connectionsPanel = null }) {
  const isAdmin = me?.role === 'admin' || me?.role === 'owner';
  const themes = [
    ['system', 'Same as the system'],
    ['light', 'Light'],
    ['dark', 'Dark'],
  ];
  const current = settings.theme();
  const themeGroup = h(
    'fieldset',
    { class: 'settings-group', testid: 'theme-setting' },
    h('legend', { text: 'Appearance' }),
    themes.map(([value, label]) => {
      const input = h('input', {
        type: 'radio',
        name: 'theme',
        id: `theme-${value}`,
        value,
        checked: value === current,
        testid: `theme-${value}`,
      });
      input.addEventListener('change', () => settings.setTheme(value));
      return h('div', { class: 'radio' }, input, h('label', { for: `theme-${value}`, text: label }));
    }),
  );
  const notices = h('input', {
    type: 'checkbox',
    id: 'show-model-notices',
    testid: 'show-model-notices',
    checked: settings.showModelNotices(isAdmin),
  });
  notices.addEventListener('change', () => settings.setShowModelNotices(notices.checked));
  const chatGroup = h(
    'fieldset',
    { class: 'settings-group' },
    h('legend', { text: 'Chats' }),
    h(
      'div',
      { class: 'radio' },
      notices,
      h('label', { for: 'show-model-notices', text: 'Show model retries and fallbacks above answers' }),
    ),
  );
  let usageBody;
  if (usage) {
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    const byPurpose = usage.by_purpose || [];
    usageBody = [
      h(
        'p',
        { class: 'usage-total', testid: 'usage-total' },
        `${tokens.toLocaleString()} tokens (${(usage.prompt_tokens || 0).toLocaleString()} in, `,
        `${(usage.completion_tokens || 0).toLocaleString()} out) · $${Number(usage.cost_usd || 0).toFixed(4)}`,
      ),
      usage.by_agent && usage.by_agent.length
        ? usageTable({ caption: 'Usage per agent', heading: 'Agent', rows: usage.by_agent, label: (row) => row.agent || '—', testid: 'usage-by-agent' })
        : h('p', { class: 'muted', text: 'No model use this month yet.' }),
      byPurpose.length
        ? usageTable({ caption: 'Usage per kind of work', heading: 'Used for', rows: byPurpose, label: (row) => USAGE_PURPOSES[row.purpose] || row.purpose, testid: 'usage-by-purpose' })
        : null,
    ];
  } else {
    usageBody = h('p', { class: 'muted', text: usageError || 'Loading…' });
  }
  return h(
    'section',
    { class: 'settings', 'aria-labelledby': 'settings-title' },
    h('h1', { id: 'settings-title', text: 'Settings' }),
    themeGroup,
    chatGroup,
    h(
      'section',
      { class: 'settings-group', 'aria-labelledby': 'usage-title', testid: 'usage-panel' },
      h('h2', { id: 'usage-title', text: `Your usage${usage?.month ? ` in ${usage.month}` : ' this month'}` }),
      usageBody,
    ),
    tokensPanel || TokensPanel(),
    grantsPanel || GrantsPanel(),
    connectionsPanel || ConnectionsPanel(),
    h('p', {}, h('a', { href: '#/', text: 'Back to chats' })),
  );
}
