// "Connected apps" on the Settings page (#/settings; views.js's SettingsView places the panel
// after "API tokens"): the OAuth clients (an IDE, a desktop assistant) the signed-in member let
// use an MCP endpoint of this tenant, from the consent page (/oauth/authorize/):
// - GET /api/v1/oauth-grants/: [{id, client_name, client_id, resource, scope, tenant, created_at,
//   last_used_at}], newest first;
// - "Revoke" after an inline confirmation (DELETE /api/v1/oauth-grants/<id>/, 204): the client's
//   tokens stop working at once, and it must ask again;
// - how to connect such a client: the MCP endpoint's URL is all it needs (it discovers the
//   rest and opens the consent page).
// API errors show their `message` in an alert region.

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

const enc = encodeURIComponent;
const dateFmt = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium' });

/** The REST calls the panel makes (a stand-in with the same methods can be passed for tests). */
export const grantsApi = {
  /** The caller's grants in this tenant. */
  list: async () => {
    const data = await request('GET', 'oauth-grants/');
    if (Array.isArray(data)) return data;
    return Array.isArray(data?.results) ? data.results : [];
  },
  /** Revoke one (204, no body). */
  revoke: (id) => request('DELETE', `oauth-grants/${enc(id)}/`),
};

/** What an MCP endpoint is, from its URL. */
function endpointName(resource) {
  if (resource.endsWith('/mcp/agents/')) return 'Agents (MCP)';
  if (resource.endsWith('/mcp/knowledge/')) return 'Knowledge bases (MCP)';
  return resource;
}

/** "Mar 3, 2025"; '' for a missing or invalid date. */
function day(iso) {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? dateFmt.format(d) : '';
}

/**
 * The "Connected apps" section of the Settings page. It loads its own data when created.
 * @param {object} [opts] {api: an object with list/revoke like `grantsApi`}
 * @returns {HTMLElement} the section
 */
export function GrantsPanel({ api = grantsApi } = {}) {
  const error = h('div', { class: 'form-error', role: 'alert', testid: 'grants-error', hidden: true });
  const status = h('p', { class: 'tokens-status muted', role: 'status', 'aria-live': 'polite', testid: 'grants-status' });
  const list = h('ul', { class: 'tokens-list', testid: 'grants-list', 'aria-labelledby': 'grants-title' });
  const origin = window.location.origin;

  function row(grant) {
    const name = grant.client_name || grant.client_id;
    const actions = h('div', { class: 'token-actions' });
    const revokeBtn = h('button', { type: 'button', class: 'btn', testid: 'grant-revoke', text: 'Revoke', 'aria-label': `Revoke ${name}` });
    revokeBtn.addEventListener('click', () => confirmRevoke(grant, name, actions, revokeBtn));
    actions.append(revokeBtn);
    return h(
      'li',
      { class: 'token-item', testid: 'grant-item', dataset: { id: String(grant.id) } },
      h(
        'div',
        { class: 'token-main' },
        h('span', { class: 'token-name', testid: 'grant-client', text: name }),
        ' · ',
        h('span', { testid: 'grant-resource', title: grant.resource, text: endpointName(grant.resource) }),
      ),
      h(
        'div',
        { class: 'token-meta muted' },
        h('span', { title: fullTime(grant.created_at), text: `Allowed ${day(grant.created_at)}` }),
        ' · ',
        h('span', { title: fullTime(grant.last_used_at), text: `Last used ${grant.last_used_at ? day(grant.last_used_at) : 'never'}` }),
      ),
      actions,
    );
  }

  function confirmRevoke(grant, name, actions, revokeBtn) {
    const yes = h('button', { type: 'button', class: 'btn btn-danger', testid: 'grant-revoke-confirm', text: 'Revoke' });
    const no = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'grant-revoke-cancel', text: 'Cancel' });
    const question = h('span', { class: 'token-confirm-text', text: `Revoke “${name}”? It stops working at once.` });
    no.addEventListener('click', () => {
      replaceChildren(actions, revokeBtn);
      revokeBtn.focus();
    });
    yes.addEventListener('click', () => revoke(grant, name, yes));
    replaceChildren(actions, h('div', { class: 'token-confirm', role: 'group', 'aria-label': `Confirm revoking ${name}` }, question, yes, no));
    yes.focus();
  }

  async function revoke(grant, name, button) {
    error.hidden = true;
    button.disabled = true;
    try {
      await api.revoke(grant.id);
    } catch (err) {
      button.disabled = false;
      error.textContent = (err && err.message) || 'Could not revoke the app.';
      error.hidden = false;
      return;
    }
    status.textContent = `Revoked “${name}”.`;
    await refresh();
    section.focus();
  }

  async function refresh() {
    let grants;
    try {
      grants = await api.list();
    } catch (err) {
      error.textContent = (err && err.message) || 'Could not load your connected apps.';
      error.hidden = false;
      replaceChildren(list, h('li', { class: 'muted', text: 'Your connected apps could not be loaded.' }));
      return;
    }
    replaceChildren(list, grants.length ? grants.map(row) : h('li', { class: 'muted', testid: 'grants-empty', text: 'No connected apps.' }));
  }

  const section = h(
    'section',
    { class: 'settings-group tokens-panel', 'aria-labelledby': 'grants-title', testid: 'grants-panel', tabindex: '-1' },
    h('h2', { id: 'grants-title', text: 'Connected apps' }),
    h('p', {
      class: 'muted',
      text: 'Apps you allowed to act as you in this tenant through an MCP server (they asked on a consent page). Revoke one to stop it.',
    }),
    error,
    list,
    status,
    h(
      'div',
      { class: 'tokens-mcp', testid: 'oauth-connect' },
      h('h3', { text: 'Connect an app with OAuth' }),
      h('p', { text: 'Apps that sign in with OAuth (Claude Desktop, IDE assistants) need only the server URL; they open a page here to ask you.' }),
      h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'oauth-agents-url', text: `${origin}/mcp/agents/` }), ' your agents'),
      h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'oauth-knowledge-url', text: `${origin}/mcp/knowledge/` }), ' your knowledge bases'),
    ),
  );
  replaceChildren(list, h('li', { class: 'muted', text: 'Loading…' }));
  refresh();
  return section;
}
