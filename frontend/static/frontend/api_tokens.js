// "API tokens" on the Settings page (#/settings; views.js's SettingsView places the panel):
// - the signed-in member's own API tokens in the current tenant (GET /api/v1/tokens/, newest
//   first as the API gives them; a plain list, or a page {results} should it ever be paginated),
//   each with its name, prefix, created / last used dates and status;
// - "Create token" (POST /api/v1/tokens/ {name}): the raw token of the 201 answer is shown once,
//   with a Copy button (the clipboard, else the text is selected for Ctrl+C);
// - "Revoke" after an inline confirmation (POST /api/v1/tokens/<id>/revoke/);
// - how to connect an MCP client to the knowledge MCP server (<origin>/mcp/knowledge/, Streamable
//   HTTP, `Authorization: Bearer <token>`): its URL and a JSON configuration to paste;
// - the same for the agents' MCP server (<origin>/mcp/agents/: one tool per agent, named by its
//   slug), and the A2A URLs of an agent (<origin>/a2a/<slug>/, its card under
//   .well-known/agent-card.json).
// API errors (e.g. 429 when too many tokens were issued) show their `message` in an alert region.

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

const enc = encodeURIComponent;
const PLACEHOLDER = '<your token>';
const dateFmt = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium' });

/** The REST calls the panel makes (a stand-in with the same methods can be passed for tests). */
export const tokensApi = {
  /** The caller's tokens: [{id, name, prefix, created_at, last_used_at, revoked_at}]. */
  list: async () => {
    const data = await request('GET', 'tokens/');
    if (Array.isArray(data)) return data;
    return Array.isArray(data?.results) ? data.results : [];
  },
  /** Issue a token: {id, name, prefix, created_at, last_used_at, revoked_at, token (raw, once)}. */
  create: (name) => request('POST', 'tokens/', { name }),
  /** Revoke one: the token with `revoked_at` set. */
  revoke: (id) => request('POST', `tokens/${enc(id)}/revoke/`, {}),
};

/** "Mar 3, 2025" (the full time in the tooltip); '' for a missing or invalid date. */
function day(iso) {
  const d = iso ? new Date(iso) : null;
  return d && !Number.isNaN(d.getTime()) ? dateFmt.format(d) : '';
}

/** The knowledge MCP server's URL on this origin. */
export function mcpServerUrl() {
  return `${window.location.origin}/mcp/knowledge/`;
}

/** The agents' MCP server's URL on this origin (one tool per active agent, named by its slug). */
export function agentsMcpUrl() {
  return `${window.location.origin}/mcp/agents/`;
}

/** The A2A URLs of the agent `slug` on this origin: {card, jsonrpc} (JSON-RPC at the agent's root). */
export function a2aUrls(slug = '<agent slug>') {
  const jsonrpc = `${window.location.origin}/a2a/${slug}/`;
  return { card: `${jsonrpc}.well-known/agent-card.json`, jsonrpc };
}

/** The base URL of the OpenAI-compatible API on this origin (agents are its models). */
export function openaiBaseUrl() {
  return `${window.location.origin}/api/openai/v1`;
}

/** A Python snippet that calls an agent through the OpenAI-compatible API with `token`. */
export function openaiSnippet(baseUrl, token = PLACEHOLDER) {
  return [
    'from openai import OpenAI',
    '',
    `client = OpenAI(base_url="${baseUrl}", api_key="${token}")`,
    'print([m.id for m in client.models.list()])  # your agents, by slug',
    'answer = client.chat.completions.create(model="<agent slug>", messages=[{"role": "user", "content": "Hello"}])',
    'print(answer.choices[0].message.content)',
  ].join('\n');
}

/** The `mcpServers` JSON most MCP clients that connect by URL accept (`name`: the server's key). */
export function mcpConfig(url, token = PLACEHOLDER, name = 'agent-platform-knowledge') {
  const config = {
    mcpServers: {
      [name]: { url, headers: { Authorization: `Bearer ${token}` } },
    },
  };
  return JSON.stringify(config, null, 2);
}

/** Select the text of `el` (so Ctrl+C copies it). */
function selectText(el) {
  const range = document.createRange();
  range.selectNodeContents(el);
  const selection = window.getSelection();
  selection.removeAllRanges();
  selection.addRange(range);
}

/**
 * Copy the text of `source` to the clipboard; if the browser refuses, select it instead.
 * Reports the outcome in `status` (a polite live region).
 */
async function copyFrom(source, status) {
  try {
    if (!navigator.clipboard) throw new Error('no clipboard');
    await navigator.clipboard.writeText(source.textContent);
    status.textContent = 'Copied to the clipboard.';
  } catch {
    selectText(source);
    status.textContent = 'Could not copy automatically: the text is selected, press Ctrl+C (⌘C on a Mac).';
  }
}

/**
 * The "API tokens" section of the Settings page. It loads its own data when created.
 * @param {object} [opts] {api: an object with list/create/revoke like `tokensApi`}
 * @returns {HTMLElement} the section
 */
export function TokensPanel({ api = tokensApi } = {}) {
  let tokens = [];
  let created = null; // the 201 answer whose raw token is on screen

  const error = h('div', { class: 'form-error', role: 'alert', testid: 'tokens-error', hidden: true });
  const status = h('p', { class: 'tokens-status muted', role: 'status', 'aria-live': 'polite', testid: 'tokens-status' });
  const list = h('ul', { class: 'tokens-list', testid: 'tokens-list', 'aria-labelledby': 'tokens-list-title' });

  const showError = (err, fallback) => {
    error.textContent = (err && err.message) || fallback;
    error.hidden = false;
  };
  const clearError = () => {
    error.textContent = '';
    error.hidden = true;
  };

  // ---- create
  const nameInput = h('input', {
    id: 'token-name',
    name: 'name',
    type: 'text',
    maxlength: '100',
    autocomplete: 'off',
    placeholder: 'e.g. Claude Desktop',
    testid: 'token-name',
  });
  const createBtn = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'token-create', text: 'Create token' });
  const form = h(
    'form',
    { class: 'tokens-form', testid: 'token-form' },
    h('div', { class: 'field' }, h('label', { for: 'token-name', text: 'Token name' }), nameInput),
    createBtn,
  );

  // ---- the new token, shown once
  const secret = h('code', { class: 'token-secret', id: 'token-secret', testid: 'token-secret' });
  const copyStatus = h('p', { class: 'muted token-copy-status', role: 'status', 'aria-live': 'polite', testid: 'token-copy-status' });
  const copyBtn = h('button', {
    type: 'button',
    class: 'btn',
    testid: 'token-copy',
    text: 'Copy',
    'aria-describedby': 'token-once',
  });
  copyBtn.addEventListener('click', () => copyFrom(secret, copyStatus));
  const doneBtn = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'token-done', text: 'Done' });
  const newTitle = h('p', { class: 'token-new-title', testid: 'token-new-title' });
  const newBox = h(
    'div',
    { class: 'token-new', testid: 'token-new', hidden: true },
    newTitle,
    h('p', { id: 'token-once', class: 'token-once', text: 'Copy it now: it will not be shown again.' }),
    h('div', { class: 'token-secret-row' }, secret, copyBtn, doneBtn),
    copyStatus,
  );

  // ---- connecting an MCP client
  const url = mcpServerUrl();
  const configPre = h('pre', { class: 'tokens-config', testid: 'mcp-config' });
  const configCopyStatus = h('p', { class: 'muted', role: 'status', 'aria-live': 'polite' });
  const configCopy = h('button', { type: 'button', class: 'btn', testid: 'mcp-config-copy', text: 'Copy configuration' });
  configCopy.addEventListener('click', () => copyFrom(configPre, configCopyStatus));
  // ---- calling agents over MCP
  const agentsUrl = agentsMcpUrl();
  const agentsPre = h('pre', { class: 'tokens-config', testid: 'agents-mcp-config' });
  const agentsCopyStatus = h('p', { class: 'muted', role: 'status', 'aria-live': 'polite' });
  const agentsCopy = h('button', { type: 'button', class: 'btn', testid: 'agents-mcp-config-copy', text: 'Copy configuration' });
  agentsCopy.addEventListener('click', () => copyFrom(agentsPre, agentsCopyStatus));
  // ---- calling agents with an OpenAI client
  const openaiUrl = openaiBaseUrl();
  const openaiPre = h('pre', { class: 'tokens-config', testid: 'openai-snippet' });
  const openaiCopyStatus = h('p', { class: 'muted', role: 'status', 'aria-live': 'polite' });
  const openaiCopy = h('button', { type: 'button', class: 'btn', testid: 'openai-snippet-copy', text: 'Copy snippet' });
  openaiCopy.addEventListener('click', () => copyFrom(openaiPre, openaiCopyStatus));
  const showConfig = () => {
    configPre.textContent = mcpConfig(url, created ? created.token : PLACEHOLDER);
    openaiPre.textContent = openaiSnippet(openaiUrl, created ? created.token : PLACEHOLDER);
    agentsPre.textContent = mcpConfig(agentsUrl, created ? created.token : PLACEHOLDER, 'agent-platform-agents');
  };
  showConfig();
  const mcpBlock = h(
    'div',
    { class: 'tokens-mcp', testid: 'mcp-connect' },
    h('h3', { text: 'Connect an MCP client' }),
    h(
      'p',
      {},
      'MCP clients (an IDE assistant, a desktop AI app) can search this tenant’s knowledge bases you can use, with the tools ',
      h('code', { class: 'inline-code', text: 'knowledge_bases' }),
      ' and ',
      h('code', { class: 'inline-code', text: 'knowledge_search' }),
      '. Server URL (Streamable HTTP):',
    ),
    h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'mcp-url', text: url })),
    h(
      'p',
      {},
      'Send a token in the header ',
      h('code', { class: 'inline-code', text: 'Authorization: Bearer <token>' }),
      '.',
    ),
    h('p', { text: 'For clients configured with JSON:' }),
    configPre,
    h('div', { class: 'tokens-actions' }, configCopy),
    configCopyStatus,
  );

  const openaiBlock = h(
    'div',
    { class: 'tokens-mcp', testid: 'openai-connect' },
    h('h3', { text: 'Call your agents with an OpenAI client' }),
    h(
      'p',
      {},
      'Apps written for the OpenAI API reach this tenant’s agents with a token: the model is the agent’s slug. Base URL:',
    ),
    h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'openai-url', text: openaiUrl })),
    openaiPre,
    h('div', { class: 'tokens-actions' }, openaiCopy),
    openaiCopyStatus,
  );

  const a2a = a2aUrls();
  const agentsBlock = h(
    'div',
    { class: 'tokens-mcp', testid: 'agents-connect' },
    h('h3', { text: 'Call your agents over MCP or A2A' }),
    h(
      'p',
      {},
      'MCP clients see one tool per agent, named by the agent’s slug, with the argument ',
      h('code', { class: 'inline-code', text: 'message' }),
      '. Server URL (Streamable HTTP, the same token header):',
    ),
    h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'agents-mcp-url', text: agentsUrl })),
    agentsPre,
    h('div', { class: 'tokens-actions' }, agentsCopy),
    agentsCopyStatus,
    h(
      'p',
      {},
      'Each agent is also an A2A 1.0 server (send the header ',
      h('code', { class: 'inline-code', text: 'A2A-Version: 1.0' }),
      ' and the token). Its agent card:',
    ),
    h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'a2a-card-url', text: a2a.card })),
    h('p', {}, 'JSON-RPC (', h('code', { class: 'inline-code', text: 'SendMessage' }), ', …):'),
    h('p', {}, h('code', { class: 'inline-code tokens-url', testid: 'a2a-jsonrpc-url', text: a2a.jsonrpc })),
  );

  const section = h(
    'section',
    { class: 'settings-group tokens-panel', 'aria-labelledby': 'tokens-title', testid: 'tokens-panel' },
    h('h2', { id: 'tokens-title', text: 'API tokens' }),
    h('p', {
      class: 'muted',
      text: 'A token lets another program act as you in this tenant: the REST API (/api/v1/), the OpenAI-compatible API (/api/openai/v1/), your agents over MCP and A2A, and the knowledge MCP server. Keep it secret like a password; revoke it when it is no longer used.',
    }),
    error,
    form,
    newBox,
    h('h3', { id: 'tokens-list-title', text: 'Your tokens' }),
    list,
    status,
    openaiBlock,
    agentsBlock,
    mcpBlock,
  );

  const hideNew = () => {
    created = null;
    secret.textContent = '';
    copyStatus.textContent = '';
    newBox.hidden = true;
    showConfig();
  };
  doneBtn.addEventListener('click', () => {
    hideNew();
    nameInput.focus();
  });

  // ---- the list
  function row(token) {
    const revoked = Boolean(token.revoked_at);
    const name = token.name || 'Unnamed';
    const meta = [
      h('span', { title: fullTime(token.created_at), text: `Created ${day(token.created_at)}` }),
      ' · ',
      h('span', {
        title: fullTime(token.last_used_at),
        text: `Last used ${token.last_used_at ? day(token.last_used_at) : 'never'}`,
      }),
      ' · ',
      revoked
        ? h('span', { class: 'token-state is-revoked', testid: 'token-state', title: fullTime(token.revoked_at), text: `Revoked ${day(token.revoked_at)}` })
        : h('span', { class: 'token-state is-active', testid: 'token-state', text: 'Active' }),
    ];
    const actions = h('div', { class: 'token-actions' });
    const item = h(
      'li',
      { class: `token-item${revoked ? ' is-revoked' : ''}`, testid: 'token-item', dataset: { id: String(token.id), status: revoked ? 'revoked' : 'active' } },
      h(
        'div',
        { class: 'token-main' },
        h('span', { class: 'token-name', testid: 'token-item-name', text: name }),
        ' ',
        h('code', { class: 'inline-code', testid: 'token-prefix', text: `${token.prefix}…` }),
      ),
      h('div', { class: 'token-meta muted' }, meta),
      actions,
    );
    if (!revoked) {
      const revokeBtn = h('button', {
        type: 'button',
        class: 'btn',
        testid: 'token-revoke',
        text: 'Revoke',
        'aria-label': `Revoke ${name} (${token.prefix}…)`,
      });
      revokeBtn.addEventListener('click', () => confirmRevoke(token, name, actions, revokeBtn));
      actions.append(revokeBtn);
    }
    return item;
  }

  function confirmRevoke(token, name, actions, revokeBtn) {
    const yes = h('button', { type: 'button', class: 'btn btn-danger', testid: 'token-revoke-confirm', text: 'Revoke' });
    const no = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'token-revoke-cancel', text: 'Cancel' });
    const question = h('span', { class: 'token-confirm-text', text: `Revoke “${name}”? Programs using it stop working at once.` });
    const box = h('div', { class: 'token-confirm', role: 'group', 'aria-label': `Confirm revoking ${name}`, testid: 'token-confirm' }, question, yes, no);
    no.addEventListener('click', () => {
      replaceChildren(actions, revokeBtn);
      revokeBtn.focus();
    });
    yes.addEventListener('click', () => revoke(token, name, yes));
    replaceChildren(actions, box);
    yes.focus();
  }

  async function revoke(token, name, button) {
    clearError();
    button.disabled = true;
    try {
      await api.revoke(token.id);
    } catch (err) {
      button.disabled = false;
      showError(err, 'Could not revoke the token.');
      return;
    }
    status.textContent = `Revoked “${name}”.`;
    await refresh();
    // Focus stays in the panel (the row's buttons are gone).
    const again = list.querySelector(`[data-id="${CSS.escape(String(token.id))}"]`);
    if (again) {
      again.tabIndex = -1;
      again.focus();
    }
  }

  async function refresh() {
    try {
      tokens = await api.list();
    } catch (err) {
      showError(err, 'Could not load your tokens.');
      if (!tokens.length) replaceChildren(list, h('li', { class: 'muted', text: 'Your tokens could not be loaded.' }));
      return;
    }
    if (!tokens.length) {
      replaceChildren(list, h('li', { class: 'muted', testid: 'tokens-empty', text: 'No tokens yet.' }));
      return;
    }
    replaceChildren(list, tokens.map(row));
  }

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError();
    const name = nameInput.value.trim();
    createBtn.disabled = true;
    let answer;
    try {
      answer = await api.create(name);
    } catch (err) {
      showError(err, 'Could not create the token.');
      return;
    } finally {
      createBtn.disabled = false;
    }
    if (!answer || typeof answer.token !== 'string') {
      showError(null, 'The server did not return the new token.');
      refresh();
      return;
    }
    created = answer;
    nameInput.value = '';
    newTitle.textContent = `New token “${answer.name || 'Unnamed'}”:`;
    secret.textContent = answer.token;
    copyStatus.textContent = '';
    newBox.hidden = false;
    showConfig();
    copyBtn.focus(); // its description says to copy the token now
    status.textContent = '';
    await refresh();
  });

  replaceChildren(list, h('li', { class: 'muted', text: 'Loading…' }));
  refresh();
  return section;
}
