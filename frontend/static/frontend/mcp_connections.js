// "Connections" on the Settings page (#/settings; views.js's SettingsView places the panel after
// "Connected apps"): the tenant's MCP servers that need an OAuth account (capabilities/mcp_oauth):
// - GET /api/v1/mcp-connections/: [{server_id, server_name, alias, auth_mode (oauth_user |
//   oauth_tenant), status (not_connected | connected | reconnect | pending), scope, expires_at,
//   connected_at, last_error, can_connect}];
// - "Connect" / "Connect again": POST /api/v1/mcp-connections/<id>/connect/ {return_to} →
//   {authorization_url}, then the browser goes there (the service's sign-in and consent) and
//   comes back to /?mcp_connected=<id>#/settings (or ?mcp_connect_error=<message>);
// - "Disconnect" (DELETE /api/v1/mcp-connections/<id>/, 204): revoked at the service.
// A tenant's account (oauth_tenant) is connected by admins; members see its state only.
// API errors show their `message` in an alert region.

import { request } from './api.js';
import { h, replaceChildren } from './dom.js';

const enc = encodeURIComponent;

/** The REST calls the panel makes (a stand-in with the same methods can be passed for tests). */
export const connectionsApi = {
  list: async () => {
    const data = await request('GET', 'mcp-connections/');
    return Array.isArray(data) ? data : [];
  },
  connect: (id, returnTo = '/#/settings') => request('POST', `mcp-connections/${enc(id)}/connect/`, { return_to: returnTo }),
  disconnect: (id) => request('DELETE', `mcp-connections/${enc(id)}/`),
};

const STATES = {
  not_connected: 'Not connected',
  pending: 'Not connected',
  connected: 'Connected',
  reconnect: 'Connect again',
};

let notice; // read once per page load: the Settings page may be built more than once

/** What the callback said, from this page's query (then removed from the address bar). */
function callbackNotice() {
  if (notice === undefined) notice = readCallbackNotice();
  return notice;
}

function readCallbackNotice() {
  const params = new URLSearchParams(window.location.search);
  const connected = params.get('mcp_connected');
  const failed = params.get('mcp_connect_error');
  if (connected === null && failed === null) return null;
  params.delete('mcp_connected');
  params.delete('mcp_connect_error');
  const query = params.toString();
  window.history.replaceState(null, '', `${window.location.pathname}${query ? `?${query}` : ''}${window.location.hash}`);
  return failed !== null ? { error: failed } : { serverId: connected };
}

/**
 * The "Connections" section of the Settings page. It loads its own data when created.
 * @param {object} [opts] {api: an object with list/connect/disconnect like `connectionsApi`,
 *   navigate: (url) => void, how the browser is sent to the authorization server}
 * @returns {HTMLElement} the section
 */
export function ConnectionsPanel({ api = connectionsApi, navigate = (url) => window.location.assign(url) } = {}) {
  const error = h('div', { class: 'form-error', role: 'alert', testid: 'connections-error', hidden: true });
  const status = h('p', { class: 'tokens-status muted', role: 'status', 'aria-live': 'polite', testid: 'connections-status' });
  const list = h('ul', { class: 'tokens-list', testid: 'connections-list', 'aria-labelledby': 'connections-title' });

  function fail(message) {
    error.textContent = message;
    error.hidden = false;
  }

  async function connect(item, button) {
    error.hidden = true;
    button.disabled = true;
    try {
      const answer = await api.connect(item.server_id);
      navigate(answer.authorization_url);
    } catch (err) {
      button.disabled = false;
      fail((err && err.message) || `Could not connect ${item.server_name}.`);
    }
  }

  async function disconnect(item, button) {
    error.hidden = true;
    button.disabled = true;
    try {
      await api.disconnect(item.server_id);
    } catch (err) {
      button.disabled = false;
      fail((err && err.message) || `Could not disconnect ${item.server_name}.`);
      return;
    }
    status.textContent = `Disconnected ${item.server_name}.`;
    await refresh();
  }

  function row(item) {
    const actions = h('div', { class: 'token-actions' });
    if (item.can_connect) {
      const label = item.status === 'connected' ? null : item.status === 'reconnect' ? 'Connect again' : 'Connect';
      if (label) {
        const btn = h('button', { type: 'button', class: 'btn btn-primary', testid: 'connection-connect', text: label, 'aria-label': `${label}: ${item.server_name}` });
        btn.addEventListener('click', () => connect(item, btn));
        actions.append(btn);
      }
      if (item.status === 'connected' || item.status === 'reconnect') {
        const btn = h('button', { type: 'button', class: 'btn', testid: 'connection-disconnect', text: 'Disconnect', 'aria-label': `Disconnect ${item.server_name}` });
        btn.addEventListener('click', () => disconnect(item, btn));
        actions.append(btn);
      }
    }
    const whose = item.auth_mode === 'oauth_tenant' ? 'The tenant’s account' : 'Your account';
    return h(
      'li',
      { class: 'token-item', testid: 'connection-item', dataset: { id: String(item.server_id), status: item.status } },
      h('div', { class: 'token-main' }, h('span', { class: 'token-name', text: item.server_name }), ' · ', h('span', { testid: 'connection-state', text: STATES[item.status] || item.status })),
      h('div', { class: 'token-meta muted' }, whose, item.status === 'reconnect' && item.last_error ? ` · ${item.last_error}` : ''),
      actions,
    );
  }

  async function refresh() {
    let items;
    try {
      items = await api.list();
    } catch (err) {
      fail((err && err.message) || 'Could not load your connections.');
      replaceChildren(list, h('li', { class: 'muted', text: 'Your connections could not be loaded.' }));
      return;
    }
    replaceChildren(list, items.length ? items.map(row) : h('li', { class: 'muted', testid: 'connections-empty', text: 'No server here needs an account.' }));
  }

  const said = callbackNotice();
  if (said?.error) fail(said.error);
  else if (said) status.textContent = 'Connected.';
  const section = h(
    'section',
    { class: 'settings-group tokens-panel', 'aria-labelledby': 'connections-title', testid: 'connections-panel', tabindex: '-1' },
    h('h2', { id: 'connections-title', text: 'Connections' }),
    h('p', { class: 'muted', text: 'Services your agents’ tools use with an account (OAuth). Connect yours so a chat can use them; Disconnect revokes the access.' }),
    error,
    list,
    status,
  );
  replaceChildren(list, h('li', { class: 'muted', text: 'Loading…' }));
  refresh();
  return section;
}
