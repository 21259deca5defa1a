// Agent Platform single-page app: bootstrap, hash router and glue between the
// API and the views.
//
// Routes:
//   #/login          login form
//   #/               start page (logged in)
//   #/sessions/<id>  a chat
// Any logged-in route first makes sure GET auth/me/ succeeds; a 401/403 sends
// the user to #/login and brings them back to where they were afterwards.

import { api, ApiError, configureApi } from './api.js';
import { ChatView } from './chat.js';
import { replaceChildren, h } from './dom.js';
import { HomeView, LoginView, MessageView, Shell, toast } from './views.js';
import { mountBrowserDevices } from './browser.js'; // --- browser capability (browser.js) ---

const APP_NAME = 'Agent Platform';

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
};

// --------------------------------------------------------------- routing --

function parseRoute() {
  const path = window.location.hash.replace(/^#/, '') || '/';
  if (path === '/login' || path === '/login/') return { name: 'login' };
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
  else openHome();
}

// ----------------------------------------------------------------- login --

/** Remember the current route to come back to after logging in. */
function rememberTarget() {
  const hash = window.location.hash;
  if (hash && hash !== '#/' && hash !== '#/login') state.afterLogin = hash;
}

function showLogin() {
  teardown();
  document.title = `Sign in · ${APP_NAME}`;
  replaceChildren(
    root,
    LoginView({
      onLogin: async (username, password) => {
        await api.login(username, password); // throws ApiError with the server message
        state.me = await api.me();
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
  if (state.chat) state.chat.destroy();
  state.chat = null;
  state.shell = null;
}

async function logout() {
  try {
    await api.logout();
  } catch (err) {
    if (!(err instanceof ApiError && err.isAuth)) {
      toast(err.message || 'Could not log out.');
      return;
    }
  }
  state.me = null;
  state.afterLogin = null;
  teardown();
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
  });
  state.shell = shell;
  mountBrowserDevices(shell); // --- browser capability: "Browser devices" panel (browser.js) ---
  replaceChildren(root, shell.el);
  loadAgents();
  loadSessions();
  return shell;
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
    const page = await api.listSessions(append ? state.sessionsNext : null);
    if (shell !== state.shell) return;
    state.sessionsNext = page.next;
    shell.setSessions(page.results, { next: page.next, append });
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
  };
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

function openHome() {
  if (state.chat) state.chat.destroy();
  state.chat = null;
  document.title = APP_NAME;
  state.shell.setActiveSession(null);
  state.shell.setMain(HomeView({ me: state.me }));
}

function openChat(id) {
  if (state.chat && state.chat.sessionId === String(id)) return;
  if (state.chat) state.chat.destroy();
  const shell = state.shell;
  const chat = new ChatView({
    sessionId: id,
    wsBase: config.ws_base,
    toast,
    onSession: (session) => {
      if (shell !== state.shell) return;
      shell.upsertSession(summary(session));
      document.title = `${session.title || 'New chat'} · ${APP_NAME}`;
    },
    onAuthLost: handleAuthLost,
  });
  state.chat = chat;
  shell.setActiveSession(id);
  shell.setMain(chat.el);
  chat.load();
}

// ------------------------------------------------------------------ boot --

window.addEventListener('hashchange', () => route());
window.addEventListener('unhandledrejection', (event) => {
  // Last line of defence: surface API errors nobody handled.
  if (event.reason instanceof ApiError) {
    event.preventDefault();
    toast(event.reason.message);
  }
});
route();
