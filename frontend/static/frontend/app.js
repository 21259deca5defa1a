// Agent Platform single-page app: bootstrap, hash router and glue between the
// API and the views.
//
// Routes:
//   #/login          login form
//   #/               start page (logged in)
//   #/sessions/<id>  a chat
//   #/settings       theme, model notices, the member's usage, their API tokens, their connected (OAuth) apps
//   #/approvals      the approvals inbox: tool calls waiting for the user's decision (approvals_inbox.js)
// Any logged-in route first makes sure GET auth/me/ succeeds; a 401/403 sends
// the user to #/login and brings them back to where they were afterwards.

import { api, ApiError, configureApi } from './api.js';
import { ChatView } from './chat.js';
import { replaceChildren, h } from './dom.js';
import { HomeView, LoginView, MessageView, SettingsView, Shell, toast } from './views.js';
import { applyTheme } from './settings.js';
import { TokensPanel } from './api_tokens.js';
import { GrantsPanel } from './oauth_grants.js';
import { ConnectionsPanel } from './mcp_connections.js';
import { mountBrowserDevices } from './browser.js'; // --- browser capability (browser.js) ---
import { ApprovalsInboxView, mountApprovalsNav, setViewer } from './approvals_inbox.js';

const APP_NAME = 'Agent Platform';
applyTheme();

function readConfig() {
  try {
    return JSON.parse(document.getElementById('app-config')?.textContent || '{}') || {};
  } catch {
    return {};
  }
}

const config = { api_base: '/api/v1', ws_base: '/ws', ...readConfig() };
configureApi(config);

const root = document.getElementById('app');

const state = {
  me: null, // GET auth/me/ answer while logged in
  checkedAuth: false, // asked auth/me/ at least once since page load
  shell: null, // Shell while the logged-in layout is on screen
  chat: null, // ChatView of the open session
  sessionsNext: null, // pagination cursor of the session list
  afterLogin: null, // hash to return to after logging in
  routeSeq: 0, // increments per navigation, to drop stale async results
  query: '', // the chat list's search text
  pageTitle: APP_NAME, // the tab title without the active-chats count
  draft: null, // {sessionId, text}: a first message to pre-fill (new chat with a summary)
  inbox: null, // ApprovalsInboxView while #/approvals is open
  approvalsNav: null, // the top bar's "Approvals" link ({setCount})
};

/** The tab title: "(2) Title · Agent Platform" while 2 chats run or wait for an approval. */
function setTitle(title = state.pageTitle) {
  state.pageTitle = title;
  const n = state.shell ? state.shell.activeCount() : 0;
  document.title = n ? `(${n}) ${title}` : title;
}

// --------------------------------------------------------------- routing --

function parseRoute() {
  const path = window.location.hash.replace(/^#/, '') || '/';
  if (path === '/login' || path === '/login/') return { name: 'login' };
  if (path === '/settings' || path === '/settings/') return { name: 'settings' };
  if (path === '/approvals' || path === '/approvals/') return { name: 'approvals' };
  const match = /^\/sessions\/([^/?#]+)\/?$/.exec(path);
  if (match) return { name: 'chat', id: decodeURIComponent(match[1]) };
  return { name: 'home' };
}

/** Go to `hash`; re-runs the router even if the hash does not change. */
function navigate(hash, { replace = false } = {}) {
  if (window.location.hash === hash) {
    route();
  } else if (replace) {
    window.history.replaceState(null, '', hash);
    route();
  } else {
    window.location.hash = hash; // hashchange -> route()
  }
}

async function route() {
  const seq = ++state.routeSeq;
  const current = parseRoute();

  if (current.name === 'login') {
    // On first load, skip the form if the session cookie is still valid.
    if (!state.checkedAuth && !state.me && signedOutAtLoad()) state.checkedAuth = true;
    if (!state.checkedAuth && !state.me) {
      state.checkedAuth = true;
      try {
        state.me = await api.me();
      } catch {
        state.me = null;
      }
      if (seq !== state.routeSeq) return;
    }
    if (state.me) {
      const target = state.afterLogin || '#/';
      state.afterLogin = null;
      navigate(target, { replace: true });
      return;
    }
    showLogin();
    return;
  }

  if (!state.me && !state.checkedAuth && signedOutAtLoad()) {
    state.checkedAuth = true; // the page says there is no session: straight to the form, no 401
    rememberTarget();
    navigate('#/login', { replace: true });
    return;
  }
  if (!state.me) {
    try {
      state.me = await api.me();
      state.checkedAuth = true;
    } catch (err) {
      if (seq !== state.routeSeq) return;
      state.checkedAuth = true;
      if (err instanceof ApiError && err.isAuth) {
        rememberTarget();
        navigate('#/login', { replace: true });
      } else {
        showFatal(err);
      }
      return;
    }
    if (seq !== state.routeSeq) return;
  }

  ensureShell();
  if (current.name === 'chat') openChat(current.id);
  else if (current.name === 'settings') openSettings();
  else if (current.name === 'approvals') openApprovals();
  else openHome();
}

// ----------------------------------------------------------------- login --

/** The page was served to a browser without a session (index.html's config): asking auth/me/
 * first would only earn a 401, which the browser logs as a console error. */
function signedOutAtLoad() {
  return config.authenticated === false;
}

/**
 * The OAuth consent page to return to after signing in: the `next` of `/?next=/oauth/authorize/…`
 * (where the authorization endpoint sends a signed-out user), only that same-origin path; else null.
 */
function oauthReturnPath() {
  const next = new URLSearchParams(window.location.search).get('next') || '';
  return next.startsWith('/oauth/authorize/') ? next : null;
}

/** Remember the current route to come back to after logging in. */
function rememberTarget() {
  const hash = window.location.hash;
  if (hash && hash !== '#/' && hash !== '#/login') state.afterLogin = hash;
}

/** Single sign-on's link (index.html's config, while the operator has it on), back to the OAuth
 * consent page or the route the visitor wanted (the server checks `next` is a path of this site). */
function ssoLink() {
  if (!config.sso) return null;
  const next = oauthReturnPath() || `/${state.afterLogin || ''}`;
  return { name: config.sso.name, href: `${config.sso.url}?next=${encodeURIComponent(next)}` };
}

function showLogin() {
  teardown();
  document.title = `Sign in · ${APP_NAME}`;
  replaceChildren(
    root,
    LoginView({
      sso: ssoLink(),
      onLogin: async (username, password) => {
        await api.login(username, password); // throws ApiError with the server message
        state.me = await api.me();
        const back = oauthReturnPath();
        if (back) {
          window.location.assign(back); // the OAuth consent page that sent the user here
          return;
        }
        const target = state.afterLogin || '#/'; // never '#/login' (see rememberTarget)
        state.afterLogin = null;
        navigate(target);
      },
    }),
  );
}

function showFatal(err) {
  teardown();
  const retry = h('button', { type: 'button', class: 'btn btn-primary', text: 'Try again' });
  retry.addEventListener('click', () => route());
  replaceChildren(
    root,
    MessageView('Cannot load Agent Platform', err.message || 'Unexpected error.', retry),
  );
}

/** Drop everything tied to the logged-in layout. */
function teardown() {
  clearInterval(state.badgeTimer);
  if (state.chat) state.chat.destroy();
  state.chat = null;
  closeInbox();
  state.shell = null;
}

async function logout() {
  let providerLogout = null;
  try {
    const out = await api.logout();
    providerLogout = (out && out.provider_logout_url) || null;
  } catch (err) {
    if (!(err instanceof ApiError && err.isAuth)) {
      toast(err.message || 'Could not log out.');
      return;
    }
  }
  state.me = null;
  state.afterLogin = null;
  teardown();
  // A single sign-on session: sign out of the provider too; it sends the browser back here.
  if (providerLogout) {
    window.location.assign(providerLogout);
    return;
  }
  navigate('#/login');
}

/**
 * A request answered 401/403: either the session expired (-> login) or the
 * user lacks a permission (-> just say so). auth/me/ tells them apart.
 */
async function handleAuthLost({ quiet = false, message = '' } = {}) {
  try {
    await api.me();
    // Still logged in: it was a permission problem; show the server's message.
    if (!quiet) toast(message || 'You do not have access to that.');
  } catch (err) {
    // `state.me` is already null if a concurrent check got here first.
    if (err instanceof ApiError && err.isAuth && state.me) {
      state.me = null;
      rememberTarget();
      teardown();
      navigate('#/login');
      toast('Your session has ended. Please sign in again.', 'info');
    }
  }
}

function reportError(err, fallback) {
  if (err instanceof ApiError && err.isAuth) handleAuthLost({ message: err.message });
  else toast((err && err.message) || fallback);
}

// ----------------------------------------------------------------- shell --

function ensureShell() {
  if (state.shell) return state.shell;
  const shell = new Shell({
    me: state.me,
    onLogout: logout,
    onPickAgent: pickAgent,
    onLoadMoreSessions: () => loadSessions({ append: true }),
    onRetryAgents: loadAgents,
    onSearch: (q) => {
      state.query = q;
      loadSessions();
    },
    onRename: renameSession,
    onDelete: deleteSession,
    onPickTenant: pickTenant,
  });
  state.shell = shell;
  api.tenants().then((list) => shell.setTenants(list)).catch(() => {}); // a picker if more than one
  mountBrowserDevices(shell); // --- browser capability: "Browser devices" panel (browser.js) ---
  setViewer(state.me);
  state.approvalsNav = mountApprovalsNav(shell); // "Approvals" with the number waiting (approvals_inbox.js)
  replaceChildren(root, shell.el);
  loadAgents();
  loadSessions();
  loadUsage();
  clearInterval(state.badgeTimer);
  state.badgeTimer = setInterval(refreshBadges, 10000);
  return shell;
}

/** Switch tenant: the server remembers the pick (the user lands there next time); reload. */
async function pickTenant(slug) {
  try {
    await api.pickTenant(slug);
    window.location.reload();
  } catch (err) {
    reportError(err, 'Could not switch tenant.');
  }
}

async function loadUsage() {
  const shell = state.shell;
  try {
    const usage = await api.usageMe();
    if (shell === state.shell) shell.setUsage(usage);
    return usage;
  } catch {
    return null;
  }
}

/** Running / awaiting-approval badges of every chat (one small request). */
async function refreshBadges() {
  const shell = state.shell;
  if (!shell || document.hidden) return;
  try {
    const page = await api.listSessions(null, { activity: 'active' });
    if (shell !== state.shell) return;
    const active = new Map(page.results.map((s) => [String(s.id), s.activity]));
    let changed = false;
    for (const s of shell.sessions) {
      const activity = active.get(String(s.id)) || null;
      if ((s.activity || null) !== activity) {
        s.activity = activity;
        changed = true;
      }
    }
    for (const s of page.results) {
      if (!shell.sessions.some((x) => String(x.id) === String(s.id)) && !state.query) {
        shell.sessions.push(s);
        changed = true;
      }
    }
    if (changed) shell.renderSessions();
    setTitle();
  } catch {
    // the next tick tries again
  }
}

async function renameSession(session, title) {
  try {
    const saved = await api.renameSession(session.id, title);
    state.shell?.upsertSession(summary(saved));
    if (state.chat && state.chat.sessionId === String(session.id)) {
      state.chat.titleEl.textContent = saved.title;
      setTitle(`${saved.title} · ${APP_NAME}`);
    }
    return true;
  } catch (err) {
    reportError(err, 'Could not rename the chat.');
    return false;
  }
}

async function deleteSession(session) {
  const shell = state.shell;
  try {
    await api.deleteSession(session.id);
  } catch (err) {
    reportError(err, 'Could not delete the chat.');
    return;
  }
  shell.removeSession(session.id);
  setTitle();
  if (state.chat && state.chat.sessionId === String(session.id)) navigate('#/');
  toast(`Deleted “${session.title || 'New chat'}”.`, 'info', {
    action: {
      label: 'Undo',
      onClick: async () => {
        try {
          const restored = await api.restoreSession(session.id);
          if (shell === state.shell) shell.upsertSession({ ...session, ...summary(restored) });
        } catch (err) {
          reportError(err, 'Could not restore the chat.');
        }
      },
    },
  });
}

async function loadAgents() {
  const shell = state.shell;
  try {
    const agents = await api.listAgents();
    if (shell === state.shell) shell.setAgents(agents);
  } catch (err) {
    if (shell !== state.shell) return;
    shell.setAgentsError(err.message || 'Could not load agents.');
    if (err instanceof ApiError && err.isAuth) handleAuthLost();
  }
}

async function loadSessions({ append = false } = {}) {
  const shell = state.shell;
  try {
    const query = state.query;
    const page = await api.listSessions(append ? state.sessionsNext : null, { q: query });
    if (shell !== state.shell || query !== state.query) return;
    state.sessionsNext = page.next;
    shell.setSessions(page.results, { next: page.next, append, query });
    setTitle();
  } catch (err) {
    if (shell !== state.shell) return;
    if (!append) shell.setSessionsError(err.message || 'Could not load chats.');
    reportError(err, 'Could not load chats.');
  }
}

/** Session list entries only need these fields. */
function summary(session, agentFallback) {
  const agent =
    session.agent && typeof session.agent === 'object'
      ? { id: session.agent.id, name: session.agent.name }
      : agentFallback
        ? { id: agentFallback.id, name: agentFallback.name }
        : null;
  return {
    id: session.id,
    agent,
    title: session.title,
    created_at: session.created_at,
    updated_at: session.updated_at,
    activity: activityOf(session),
  };
}

/** "awaiting_approval" | "running" | null, from a list item or a session detail's runs. */
function activityOf(session) {
  if (session.activity !== undefined) return session.activity;
  const runs = Array.isArray(session.runs) ? session.runs : [];
  if (runs.some((r) => r.status === 'awaiting_approval')) return 'awaiting_approval';
  if (runs.some((r) => r.status === 'queued' || r.status === 'running')) return 'running';
  return null;
}

async function pickAgent(agent) {
  const shell = state.shell;
  shell.setAgentsBusy(true);
  try {
    const session = await api.createSession(agent.id);
    if (shell !== state.shell) return;
    shell.upsertSession(summary(session, agent));
    navigate(`#/sessions/${encodeURIComponent(session.id)}`);
  } catch (err) {
    reportError(err, 'Could not start a new chat.');
  } finally {
    shell.setAgentsBusy(false);
  }
}

function closeInbox() {
  if (state.inbox) state.inbox.destroy();
  state.inbox = null;
}

/** The approvals inbox (approvals_inbox.js). */
function openApprovals() {
  if (state.chat) state.chat.destroy();
  state.chat = null;
  closeInbox();
  setTitle(`Approvals · ${APP_NAME}`);
  const shell = state.shell;
  shell.setActiveSession(null);
  const inbox = new ApprovalsInboxView({
    onCount: (n) => state.approvalsNav?.setCount(n),
    onAuthLost: () => handleAuthLost({ quiet: true }),
  });
  state.inbox = inbox;
  shell.setMain(inbox.el);
  inbox.load();
}

function openHome() {
  if (state.chat) state.chat.destroy();
  state.chat = null;
  closeInbox();
  setTitle(APP_NAME);
  state.shell.setActiveSession(null);
  const shell = state.shell;
  shell.setMain(HomeView({ me: state.me, onNewChat: () => shell.openPicker() }));
}

async function openSettings() {
  if (state.chat) state.chat.destroy();
  state.chat = null;
  closeInbox();
  setTitle(`Settings · ${APP_NAME}`);
  const shell = state.shell;
  shell.setActiveSession(null);
  const tokensPanel = TokensPanel(); // one panel (and one load) for both renders: a token shown once stays
  const grantsPanel = GrantsPanel();
  const connectionsPanel = ConnectionsPanel();
  shell.setMain(SettingsView({ me: state.me, tokensPanel, grantsPanel, connectionsPanel }));
  const usage = await loadUsage();
  if (shell !== state.shell || parseRoute().name !== 'settings') return;
  shell.setMain(SettingsView({ me: state.me, usage, usageError: usage ? '' : 'Could not load your usage.', tokensPanel, grantsPanel, connectionsPanel }));
}

function openChat(id) {
  if (state.chat && state.chat.sessionId === String(id)) return;
  if (state.chat) state.chat.destroy();
  closeInbox();
  const shell = state.shell;
  const chat = new ChatView({
    sessionId: id,
    wsBase: config.ws_base,
    toast,
    onSession: (session) => {
      if (shell !== state.shell) return;
      shell.upsertSession(summary(session));
      setTitle(`${session.title || 'New chat'} · ${APP_NAME}`);
      if (state.draft && state.draft.sessionId === String(session.id)) {
        chat.setDraft(state.draft.text);
        state.draft = null;
      }
      if (!activityOf(session)) loadUsage();
    },
    onNewChat: (session, draft) => {
      if (shell !== state.shell) return;
      shell.upsertSession(summary(session));
      state.draft = { sessionId: String(session.id), text: draft };
      navigate(`#/sessions/${encodeURIComponent(session.id)}`);
    },
    isAdmin: state.me?.role === 'admin' || state.me?.role === 'owner',
    onAuthLost: handleAuthLost,
  });
  state.chat = chat;
  shell.setActiveSession(id);
  shell.setMain(chat.el);
  chat.load();
}

// ------------------------------------------------------------------ boot --

window.addEventListener('hashchange', () => route());
// Keyboard shortcuts (as in ChatGPT): Ctrl/Cmd+Shift+O a new chat, Ctrl/Cmd+K search chats.
document.addEventListener('keydown', (event) => {
  const shell = state.shell;
  if (!shell || !(event.ctrlKey || event.metaKey) || event.altKey) return;
  const key = event.key.toLowerCase();
  if (event.shiftKey && key === 'o') {
    event.preventDefault();
    shell.openPicker();
  } else if (!event.shiftKey && key === 'k') {
    event.preventDefault();
    shell.toggleSidebar(true);
    shell.searchInput.focus();
  }
});
window.addEventListener('unhandledrejection', (event) => {
  // Last line of defence: surface API errors nobody handled.
  if (event.reason instanceof ApiError) {
    event.preventDefault();
    toast(event.reason.message);
  }
});
route();
