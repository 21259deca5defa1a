// Service worker: the one WebSocket to the platform, and the commands it carries.
//
// Lifetime (MV3): an open WebSocket alone does not keep this worker alive. We ping every 20 s
// (traffic resets the 30-s idle timer), a chrome.alarms alarm every 30 s revives a killed
// worker, and the worker reconnects at start with backoff 250 ms -> 10 s.
//
// Commands are executed at most once per idempotency key: before acting we write a "started"
// marker to chrome.storage.session, after acting the result. A replay (the server resends
// pending commands after a reconnect) gets the stored result; a command whose worker died
// mid-action gets `interrupted` instead of running again.

import {
  OPS, SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX, ProtocolError, errorResult, hello, okResult, originAllowed, originOf,
  parseServerFrame,
} from './protocol.js';

const VERSION = chrome.runtime.getManifest().version;
const PING_MS = 20_000;
const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 10_000;
const RESULT_TTL_MS = 10 * 60_000;
const LOG_SIZE = 50;

const state = {
  ws: null,
  status: 'unpaired', // unpaired | connecting | connected | disconnected
  lastError: '',
  account: null, // {user, tenant, device}
  lastSessionId: null, // the chat that used the browser last (hand-over target)
  backoffMs: BACKOFF_MIN_MS,
  reconnectTimer: null,
  pingTimer: null,
  inflight: new Map(), // command id -> {idempotency_key, op, cancelled}
  log: [],
};

// ------------------------------------------------------------------ config --

async function config() {
  const { platformUrl = '', deviceToken = '' } = await chrome.storage.local.get(['platformUrl', 'deviceToken']);
  return { platformUrl, deviceToken };
}

function wsUrl(platformUrl) {
  const u = new URL(platformUrl);
  u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
  u.pathname = '/ws/browser/';
  u.search = '';
  return u.toString();
}

function notify() {
  chrome.runtime.sendMessage({ type: 'state', state: publicState() }).catch(() => {});
}

function publicState() {
  return {
    status: state.status, lastError: state.lastError, account: state.account, log: state.log,
    pending: Array.from(state.inflight.values()).map((c) => ({ op: c.op })),
  };
}

function logOp(entry) {
  state.log.unshift({ ts: Date.now(), ...entry });
  state.log.length = Math.min(state.log.length, LOG_SIZE);
  chrome.storage.session.set({ opLog: state.log }).catch(() => {});
  notify();
}

// -------------------------------------------------------------- connection --

let connecting = null;
let connectAgain = false;

/**
 * Open the socket unless one is open or opening. Calls during an attempt share it and ask for
 * one more pass afterwards (the configuration may have changed meanwhile, e.g. just paired).
 */
function connect() {
  if (connecting) {
    connectAgain = true;
    return connecting;
  }
  connecting = (async () => {
    do {
      connectAgain = false;
      await openSocket();
    } while (connectAgain);
  })().finally(() => { connecting = null; });
  return connecting;
}

async function openSocket() {
  if (state.ws && (state.ws.readyState === WebSocket.OPEN || state.ws.readyState === WebSocket.CONNECTING)) return;
  clearTimeout(state.reconnectTimer);
  const { platformUrl, deviceToken } = await config();
  if (!platformUrl || !deviceToken) {
    state.status = 'unpaired';
    notify();
    return;
  }
  state.status = 'connecting';
  notify();
  let ws;
  try {
    ws = new WebSocket(wsUrl(platformUrl), [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + deviceToken]);
  } catch (err) {
    state.lastError = String(err);
    scheduleReconnect();
    return;
  }
  state.ws = ws;
  ws.onopen = () => {
    ws.send(JSON.stringify(hello(VERSION)));
  };
  ws.onmessage = (event) => onFrame(ws, event.data);
  ws.onclose = (event) => {
    if (state.ws !== ws) return;
    state.ws = null;
    clearInterval(state.pingTimer);
    if (event.code === 4401) {
      // The token is unknown or revoked: forget it; the user pairs again.
      chrome.storage.local.remove('deviceToken');
      state.status = 'unpaired';
      state.account = null;
      state.lastError = 'This browser was unpaired (token revoked or unknown). Pair it again in the options.';
      notify();
      return;
    }
    state.status = 'disconnected';
    notify();
    scheduleReconnect();
  };
  ws.onerror = () => {
    state.lastError = 'WebSocket error';
  };
}

function scheduleReconnect() {
  clearTimeout(state.reconnectTimer);
  const delay = state.backoffMs;
  state.backoffMs = Math.min(state.backoffMs * 2, BACKOFF_MAX_MS);
  state.reconnectTimer = setTimeout(connect, delay);
}

function send(ws, frame) {
  if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(frame));
}

async function onFrame(ws, text) {
  let frame;
  try {
    frame = parseServerFrame(text);
  } catch (err) {
    if (err instanceof ProtocolError) {
      // A command we cannot read: answer it if it has an id, so the server does not wait.
      try {
        const raw = JSON.parse(text);
        if (raw && typeof raw.id === 'string') send(ws, errorResult(raw.id, 'protocol_error', err.message));
      } catch { /* not JSON at all */ }
      return;
    }
    throw err;
  }
  switch (frame.type) {
    case 'welcome':
      state.status = 'connected';
      state.backoffMs = BACKOFF_MIN_MS;
      state.lastError = '';
      state.account = { user: frame.user, tenant: frame.tenant, device: frame.device };
      chrome.storage.local.set({ account: state.account });
      clearInterval(state.pingTimer);
      state.pingTimer = setInterval(() => send(ws, { type: 'ping', ts: Date.now() }), PING_MS);
      notify();
      break;
    case 'ping':
      send(ws, { type: 'pong', ts: frame.ts });
      break;
    case 'command':
      await onCommand(ws, frame);
      break;
    case 'error':
      state.lastError = `${frame.code}: ${frame.message}`;
      notify();
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------- commands --

async function onCommand(ws, command) {
  const key = `cmd:${command.idempotency_key}`;
  const stored = (await chrome.storage.session.get(key))[key];
  if (stored && stored.result) {
    send(ws, { ...stored.result, id: command.id }); // a replay: the stored answer, not a second action
    logOp({ op: command.op, status: 'replayed' });
    return;
  }
  if (stored && stored.started) {
    send(ws, errorResult(command.id, 'interrupted',
      `The browser was interrupted while running ${command.op} (the extension restarted). It may or may not have ` +
      'happened: take a browser_snapshot to check before retrying.'));
    logOp({ op: command.op, status: 'interrupted' });
    return;
  }
  const entry = { idempotency_key: command.idempotency_key, op: command.op, cancelled: false };
  state.inflight.set(command.id, entry);
  await chrome.storage.session.set({ [key]: { started: Date.now() } });
  notify();
  let result;
  try {
    const value = await withDeadline(execute(command.op, command.params), command.deadline_ms);
    result = okResult(command.id, value);
  } catch (err) {
    result = errorResult(command.id, err.code || 'browser_error', err.message || String(err));
  }
  state.inflight.delete(command.id);
  if (entry.cancelled) return; // Stop already answered it
  await chrome.storage.session.set({ [key]: { result, at: Date.now() } });
  send(state.ws || ws, result);
  logOp({ op: command.op, status: result.ok ? 'ok' : `error: ${result.error.code}`, url: result.result?.url || '' });
  pruneResults();
}

class OpError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

function withDeadline(promise, ms) {
  return Promise.race([
    promise,
    new Promise((_, reject) => setTimeout(() => reject(new OpError('timeout', `Did not finish within ${ms} ms.`)), ms)),
  ]);
}

async function pruneResults() {
  const all = await chrome.storage.session.get(null);
  const old = Object.entries(all)
    .filter(([k, v]) => k.startsWith('cmd:') && v.at && Date.now() - v.at > RESULT_TTL_MS)
    .map(([k]) => k);
  if (old.length) await chrome.storage.session.remove(old);
}

/** Stop button: answer every pending command as cancelled (its page work cannot be undone). */
function cancelPending() {
  for (const [id, entry] of state.inflight) {
    entry.cancelled = true;
    const result = errorResult(id, 'cancelled_by_user', 'The user pressed Stop in the browser extension.');
    chrome.storage.session.set({ [`cmd:${entry.idempotency_key}`]: { result, at: Date.now() } });
    if (state.ws) send(state.ws, result);
    logOp({ op: entry.op, status: 'cancelled' });
  }
  state.inflight.clear();
  notify();
}

// -------------------------------------------------------- tabs per session --
// The agent acts only in tabs it opened for a chat session (one tab group per session).

async function sessions() {
  return (await chrome.storage.session.get('agentSessions')).agentSessions || {};
}

async function saveSessions(all) {
  await chrome.storage.session.set({ agentSessions: all });
}

const NEXT_SESSION = '__next__'; // tabs handed over before any chat used the browser

async function sessionState(sessionId) {
  const all = await sessions();
  let s = all[sessionId];
  if (!s && all[NEXT_SESSION]) {
    s = all[NEXT_SESSION]; // the first chat adopts the tabs the user handed over
    delete all[NEXT_SESSION];
  }
  s = s || { tabs: [], current: null, groupId: null, nextRef: {} };
  const live = [];
  for (const id of s.tabs) {
    try {
      await chrome.tabs.get(id);
      live.push(id);
    } catch { /* closed by the user */ }
  }
  s.tabs = live;
  if (!live.includes(s.current)) s.current = live.length ? live[live.length - 1] : null;
  return { all, s };
}

async function openTab(sessionId, url) {
  const { all, s } = await sessionState(sessionId);
  const tab = await chrome.tabs.create({ url: url || 'about:blank', active: true });
  s.tabs.push(tab.id);
  s.current = tab.id;
  try {
    const groupId = await withDeadline(
      chrome.tabs.group(s.groupId !== null ? { tabIds: [tab.id], groupId: s.groupId } : { tabIds: [tab.id] }), 2000);
    if (s.groupId === null) {
      await withDeadline(chrome.tabGroups.update(groupId, { title: `Agent · chat ${sessionId}`, color: 'blue' }), 2000);
    }
    s.groupId = groupId;
  } catch {
    s.groupId = null; // the group was closed, or tab groups are unavailable: tabs still work
  }
  all[sessionId] = s;
  await saveSessions(all);
  return tab;
}

async function currentTab(sessionId, { create = false } = {}) {
  const { all, s } = await sessionState(sessionId);
  all[sessionId] = s;
  await saveSessions(all);
  if (s.current !== null) return chrome.tabs.get(s.current);
  if (!create) throw new OpError('no_tab', 'No tab is open for this chat: call browser_navigate or browser_tabs action=new.');
  return openTab(sessionId, 'about:blank');
}

function checkOrigin(url, policy, redirected = false) {
  if (!originAllowed(url, policy)) {
    throw new OpError('origin_blocked',
      `The tab ${redirected ? 'was redirected to' : 'is on'} ${originOf(url)}, which this agent may not use ` +
      '(blocked by the browser capability\'s origin rules).');
  }
}

/**
 * Resolves (true) when `tabId` finished a load that started after this call, false after
 * `timeoutMs`. Events drive it; a 100-ms poll of the tab backs them up (an onUpdated
 * "loading" can be coalesced away). With `target`, the load must also have left
 * about:blank (a fresh tab's own about:blank load must not count).
 */
function loadWatcher(tabId, timeoutMs, { target = '', before = '' } = {}) {
  let sawLoading = false;
  let listener;
  let timer;
  let poll;
  const finished = (tab) => tab.status === 'complete' && !tab.pendingUrl
    && (!target || target === 'about:blank' || (tab.url && tab.url !== 'about:blank'));
  const done = new Promise((resolve) => {
    listener = (id, info, tab) => {
      if (id !== tabId) return;
      if (info.status === 'loading') sawLoading = true;
      if (info.status === 'complete' && (sawLoading || (target && tab.url !== before)) && finished(tab)) resolve(true);
    };
    chrome.tabs.onUpdated.addListener(listener);
    timer = setTimeout(() => resolve(false), timeoutMs);
    poll = setInterval(async () => {
      try {
        const tab = await chrome.tabs.get(tabId);
        if (tab.status === 'loading') sawLoading = true;
        else if ((sawLoading || (target && tab.url !== before)) && finished(tab)) resolve(true);
      } catch {
        resolve(false); // the tab was closed
      }
    }, 100);
  });
  const stop = () => {
    chrome.tabs.onUpdated.removeListener(listener);
    clearTimeout(timer);
    clearInterval(poll);
  };
  return { wait: () => done.finally(stop), cancel: stop };
}

async function runInPage(tabId, op, params) {
  const call = () => chrome.scripting.executeScript({
    target: { tabId },
    func: (o, p) => (globalThis.__apBrowser ? globalThis.__apBrowser.run(o, p) : { missing: true }),
    args: [op, params],
  });
  let [{ result } = {}] = await call();
  if (result && result.missing) {
    await chrome.scripting.executeScript({ target: { tabId }, files: ['snapshot.js'] });
    [{ result } = {}] = await call();
  }
  if (!result) throw new OpError('page_error', 'The page did not answer (it may be a browser page scripts cannot access).');
  if (!result.ok) throw new OpError(result.error.code, result.error.message);
  return result.result;
}

/**
 * The user hands a tab to the agent: the most recently used web tab (not an extension page)
 * joins the tabs of the chat that used the browser last (or of the next one) and becomes
 * the tab its commands act in.
 */
async function handTab() {
  const tabs = (await chrome.tabs.query({})).filter((t) => /^https?:/.test(t.url || ''));
  if (!tabs.length) return { ok: false, message: 'Open the web page you want to hand over first.' };
  const tab = tabs.sort((a, b) => (b.lastAccessed || 0) - (a.lastAccessed || 0))[0];
  const sessionId = state.lastSessionId || NEXT_SESSION;
  const { all, s } = await sessionState(sessionId);
  if (!s.tabs.includes(tab.id)) s.tabs.push(tab.id);
  s.current = tab.id;
  all[sessionId] = s;
  await saveSessions(all);
  logOp({ op: 'handover', status: 'ok', url: tab.url });
  return { ok: true, message: `Handed over: ${tab.title || tab.url}` };
}

async function execute(op, params) {
  if (!OPS.includes(op)) throw new OpError('unknown_op', `Unknown op ${op}`);
  const sessionId = String(params.session_id ?? 'default');
  state.lastSessionId = sessionId;
  const policy = params.policy || {};
  if (op === 'tabs') return tabsOp(sessionId, params, policy);
  if (op === 'navigate') {
    checkOrigin(params.url, policy);
    let tab;
    try {
      tab = await currentTab(sessionId);
    } catch (err) {
      if (err.code !== 'no_tab') throw err;
      tab = null;
    }
    let watcher;
    if (tab) {
      watcher = loadWatcher(tab.id, 30_000, { target: params.url, before: tab.url });
      await chrome.tabs.update(tab.id, { url: params.url });
    } else {
      // A new tab opens straight at the URL (no about:blank step to race with).
      tab = await openTab(sessionId, params.url);
      watcher = loadWatcher(tab.id, 30_000, { target: params.url });
    }
    await watcher.wait();
    const loaded = await chrome.tabs.get(tab.id);
    if (!originAllowed(loaded.url, policy)) {
      await chrome.tabs.update(tab.id, { url: 'about:blank' });
      checkOrigin(loaded.url, policy, true);
    }
    return { url: loaded.url, title: loaded.title, navigated: true };
  }
  const tab = await currentTab(sessionId);
  checkOrigin(tab.url, policy); // the committed URL, at action time
  if (op === 'screenshot') {
    await chrome.tabs.update(tab.id, { active: true });
    const dataUrl = await chrome.tabs.captureVisibleTab(tab.windowId, { format: 'png' });
    return { url: tab.url, title: tab.title, png_base64: dataUrl.slice(dataUrl.indexOf(',') + 1) };
  }
  const pageParams = { ...params };
  if (op === 'snapshot') {
    const { all, s } = await sessionState(sessionId);
    pageParams.ref_start = s.nextRef?.[tab.id] || 1;
    const result = await runInPage(tab.id, op, pageParams);
    s.nextRef = { ...(s.nextRef || {}), [tab.id]: result.next_ref };
    all[sessionId] = s;
    await saveSessions(all);
    return result;
  }
  const watcher = loadWatcher(tab.id, 30_000);
  let result;
  try {
    result = await runInPage(tab.id, op, pageParams);
  } catch (err) {
    // An action that submits a form or follows a link can tear the page down before its
    // script answers: if the tab is now loading another document, that is the navigation
    // the action caused, not a failure.
    const now = err instanceof OpError && err.code !== 'page_error'
      ? null : await chrome.tabs.get(tab.id).catch(() => null);
    if (!now || !(now.status === 'loading' || now.pendingUrl || now.url !== tab.url)) {
      watcher.cancel();
      throw err;
    }
    result = { navigating: true };
  }
  if (!result.navigating) {
    watcher.cancel();
    return result;
  }
  await watcher.wait();
  const loaded = await chrome.tabs.get(tab.id);
  if (!originAllowed(loaded.url, policy)) {
    await chrome.tabs.update(tab.id, { url: 'about:blank' });
    checkOrigin(loaded.url, policy, true);
  }
  return { url: loaded.url, title: loaded.title, navigated: true };
}

async function tabsOp(sessionId, params, policy) {
  const action = params.action || 'list';
  if (action === 'new') {
    checkOrigin(params.url || 'about:blank', policy);
    const tab = await openTab(sessionId, params.url || 'about:blank');
    if (params.url && params.url !== 'about:blank') await loadWatcher(tab.id, 30_000, { target: params.url }).wait();
  } else if (action === 'select' || action === 'close') {
    const { all, s } = await sessionState(sessionId);
    if (!s.tabs.includes(params.tab_id)) {
      throw new OpError('no_such_tab', `Tab ${params.tab_id} is not one of this chat's tabs; call browser_tabs action=list.`);
    }
    if (action === 'select') {
      s.current = params.tab_id;
      await chrome.tabs.update(params.tab_id, { active: true });
    } else {
      await chrome.tabs.remove(params.tab_id);
      s.tabs = s.tabs.filter((t) => t !== params.tab_id);
      if (s.current === params.tab_id) s.current = s.tabs.length ? s.tabs[s.tabs.length - 1] : null;
    }
    all[sessionId] = s;
    await saveSessions(all);
  }
  const { s } = await sessionState(sessionId);
  const tabs = [];
  for (const id of s.tabs) {
    const t = await chrome.tabs.get(id);
    tabs.push({ id, url: t.url, title: t.title, selected: id === s.current });
  }
  const cur = tabs.find((t) => t.selected);
  return { tabs, url: cur?.url || '', title: cur?.title || '' };
}

// ------------------------------------------------------------ wiring ------

chrome.alarms.create('keepalive', { periodInMinutes: 0.5 });
chrome.alarms.onAlarm.addListener((alarm) => {
  if (alarm.name === 'keepalive') connect();
});

chrome.runtime.onMessage.addListener((message, _sender, sendResponse) => {
  // Messages from the popup and the options page. Async replies must `return true`
  // (https://crbug.com/1304272 for promise-returning listeners).
  (async () => {
    switch (message?.type) {
      case 'getState':
        await connect();
        return publicState();
      case 'stop':
        cancelPending();
        return publicState();
      case 'handTab':
        return { ...publicState(), handover: await handTab() };
      case 'reconnect':
        if (state.ws) state.ws.close();
        state.backoffMs = BACKOFF_MIN_MS;
        await connect();
        return publicState();
      case 'paired':
        state.backoffMs = BACKOFF_MIN_MS;
        await connect();
        return publicState();
      case 'unpair':
        await chrome.storage.local.remove(['deviceToken', 'account']);
        if (state.ws) state.ws.close();
        state.status = 'unpaired';
        state.account = null;
        notify();
        return publicState();
      default:
        return { error: 'unknown message' };
    }
  })().then(sendResponse, (err) => sendResponse({ error: String(err) }));
  return true;
});

chrome.runtime.onStartup.addListener(connect);
chrome.runtime.onInstalled.addListener(connect);

(async () => {
  const saved = await chrome.storage.session.get('opLog');
  state.log = saved.opLog || [];
  const { account } = await chrome.storage.local.get('account');
  state.account = account || null;
  await connect();
})();

// For tests and debugging from the service worker console.
globalThis.__apBridge = { state, connect, cancelPending, publicState };
