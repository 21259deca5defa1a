// Screens other than the chat itself: login, the logged-in shell (header +
// sidebar with the agent picker and session list), the start page, toasts.
// Views only build DOM and report user intent through callbacks; app.js does
// the API calls and routing.

import { h, replaceChildren, spinner, shortTime, fullTime } from './dom.js';

// ---------------------------------------------------------------- toasts --

/**
 * Show a transient message in the #toasts region.
 * kind: 'error' (assertive, stays 8 s) | 'info' (polite, 4 s).
 */
export function toast(message, kind = 'error') {
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
  const item = h(
    'div',
    { class: `toast toast-${kind}`, role: kind === 'error' ? 'alert' : 'status', testid: 'toast' },
    h('span', { class: 'toast-text', text: message }),
    close,
  );
  const remove = () => item.remove();
  close.addEventListener('click', remove);
  region.append(item);
  // Keep at most 4 on screen.
  while (region.children.length > 4) region.firstElementChild.remove();
  setTimeout(remove, kind === 'error' ? 8000 : 4000);
}

// ----------------------------------------------------------------- login --

/**
 * The login screen.
 * @param {(username: string, password: string) => Promise<void>} onLogin
 *   rejects with an Error whose message is shown under the form.
 */
export function LoginView({ onLogin }) {
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

/**
 * Header + sidebar + main area for a logged-in user.
 * Callbacks: onLogout(), onPickAgent(agent), onLoadMoreSessions(), onRetryAgents().
 */
export class Shell {
  constructor({ me, onLogout, onPickAgent, onLoadMoreSessions, onRetryAgents }) {
    this.onPickAgent = onPickAgent;
    this.onLoadMoreSessions = onLoadMoreSessions;
    this.onRetryAgents = onRetryAgents;
    this.activeSessionId = null;
    this.sessions = [];

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

    this.header = h(
      'header',
      { class: 'topbar' },
      this.menuBtn,
      h(
        'div',
        { class: 'brand' },
        h('span', { class: 'brand-mark small', 'aria-hidden': 'true', text: 'AP' }),
        h('span', { class: 'tenant-name', testid: 'tenant-name', text: tenant }),
      ),
      h(
        'div',
        { class: 'user-box' },
        h('span', { class: 'user-name', testid: 'user-name', text: user }),
        me?.role ? h('span', { class: 'role-badge', text: me.role }) : null,
        logout,
      ),
    );

    this.agentList = h(
      'div',
      { class: 'agent-list' },
      h('div', { class: 'side-note' }, spinner(), ' Loading agents…'),
    );
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

    this.sidebar = h(
      'aside',
      { class: 'sidebar', id: 'sidebar' },
      h(
        'section',
        { class: 'side-section', 'aria-labelledby': 'new-chat-title' },
        h('h2', { class: 'side-title', id: 'new-chat-title', text: 'New chat' }),
        this.agentList,
      ),
      h(
        'section',
        { class: 'side-section side-sessions', 'aria-labelledby': 'chats-title' },
        h('h2', { class: 'side-title', id: 'chats-title', text: 'Chats' }),
        this.sessionList,
        this.moreBtn,
      ),
    );

    this.main = h('main', { class: 'main', id: 'main' });
    // On narrow screens the sidebar is a drawer: a click outside closes it.
    this.main.addEventListener('click', () => this.toggleSidebar(false));
    this.el = h('div', { class: 'app-shell' }, this.header, this.sidebar, this.main);
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

  setAgents(agents) {
    if (!agents.length) {
      replaceChildren(
        this.agentList,
        h('div', { class: 'side-note', text: 'No agents are available yet.' }),
      );
      return;
    }
    const items = agents.map((agent) => {
      const btn = h(
        'button',
        {
          type: 'button',
          class: 'agent-option',
          testid: 'agent-option',
          dataset: { agentName: agent.name, agentId: String(agent.id) },
          title: agent.description || agent.name,
        },
        h('span', { class: 'agent-avatar', 'aria-hidden': 'true', text: initials(agent.name) }),
        h(
          'span',
          { class: 'agent-text' },
          h('span', { class: 'agent-name', text: agent.name }),
          agent.description ? h('span', { class: 'agent-desc', text: agent.description }) : null,
        ),
      );
      btn.addEventListener('click', () => this.onPickAgent(agent));
      return h('li', {}, btn);
    });
    replaceChildren(this.agentList, h('ul', { class: 'agents' }, items));
  }

  setAgentsError(message) {
    const retry = h('button', { type: 'button', class: 'link-btn', text: 'Retry' });
    retry.addEventListener('click', () => this.onRetryAgents());
    replaceChildren(
      this.agentList,
      h('div', { class: 'side-note side-error' }, message, ' ', retry),
    );
  }

  /** Disable the agent buttons while a session is being created. */
  setAgentsBusy(busy) {
    for (const btn of this.agentList.querySelectorAll('button.agent-option')) btn.disabled = busy;
    this.agentList.setAttribute('aria-busy', String(busy));
  }

  // ---------------------------------------------------------- sessions --

  /** Replace (append=false) or extend the session list. */
  setSessions(sessions, { next = null, append = false } = {}) {
    const byId = new Map((append ? this.sessions : []).map((s) => [String(s.id), s]));
    for (const s of sessions) byId.set(String(s.id), s);
    this.sessions = [...byId.values()];
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

  setActiveSession(id) {
    this.activeSessionId = id === null || id === undefined ? null : String(id);
    for (const item of this.sessionList.querySelectorAll('[data-session-id]')) {
      if (item.dataset.sessionId === this.activeSessionId)
        item.setAttribute('aria-current', 'page');
      else item.removeAttribute('aria-current');
    }
  }

  renderSessions() {
    // Newest first.
    const sorted = [...this.sessions].sort((a, b) =>
      String(b.created_at || '').localeCompare(String(a.created_at || '')),
    );
    if (!sorted.length) {
      replaceChildren(
        this.sessionList,
        h('div', { class: 'side-note', text: 'No chats yet. Pick an agent above.' }),
      );
      return;
    }
    replaceChildren(
      this.sessionList,
      h(
        'ul',
        { class: 'sessions' },
        sorted.map((s) =>
          h(
            'li',
            {},
            h(
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
                h('time', {
                  datetime: s.updated_at || s.created_at || null,
                  title: fullTime(s.updated_at || s.created_at),
                  text: shortTime(s.updated_at || s.created_at),
                }),
              ),
            ),
          ),
        ),
      ),
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

export function HomeView({ me }) {
  const name = me?.user?.username;
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
        text: 'Pick an agent under “New chat” to start a conversation, or open one of your chats.',
      }),
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
