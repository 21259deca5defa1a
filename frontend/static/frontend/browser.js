// Browser capability in the SPA (kept out of app.js/chat.js, which only hook in):
// - DevicesPanel: approve an extension's pairing code, list and revoke paired browsers
//   (/api/v1/browser/pairings/approve/, /api/v1/browser/devices/).
// - browser_operation events: a small card under the tool call showing what the agent
//   does in the browser (op, target, status, URL).

import { request } from './api.js';
import { h, replaceChildren } from './dom.js';

const OP_LABELS = {
  tabs: 'Tabs', navigate: 'Open', snapshot: 'Read page', click: 'Click', type: 'Type', select: 'Select',
  press: 'Press', scroll: 'Scroll', wait_for: 'Wait for', get_text: 'Read text', screenshot: 'Screenshot',
};

/** Record a browser_operation frame on its tool call (chat.js calls this from its frame handler). */
export function applyBrowserOperation(run, data) {
  const tool = run.tools.get(data.tool_call_id) || run.tools.get(String(data.tool_call_id));
  if (tool) tool.browser = data;
}

function target(op) {
  const p = op.params || {};
  if (op.op === 'navigate') return p.url || '';
  if (op.op === 'type') return `${p.ref || ''} (${p.text_chars ?? 0} characters${p.submit ? ', submit' : ''})`;
  if (op.op === 'select') return `${p.ref || ''} → ${(p.values || []).join(', ')}`;
  if (op.op === 'press') return p.keys || '';
  if (op.op === 'wait_for') return p.text || p.text_gone || `${p.seconds ?? ''} s`;
  if (op.op === 'tabs') return p.action || '';
  return p.ref || '';
}

/** Fill `el` with the card of `op` (a browser_operation payload), or hide it. */
export function renderBrowserOperation(el, op) {
  el.hidden = !op;
  if (!op) return;
  el.dataset.status = op.status;
  el.dataset.op = op.op;
  replaceChildren(
    el,
    h('span', { class: 'browser-op-glyph', 'aria-hidden': 'true', text: '◎' }),
    h('span', { class: 'browser-op-name', text: OP_LABELS[op.op] || op.op }),
    h('span', { class: 'browser-op-target', text: target(op) }),
    h('span', { class: `browser-op-status status-${op.status}`, text: String(op.status).replace(/_/g, ' ') }),
    op.url ? h('span', { class: 'browser-op-url', text: op.url }) : null,
    op.backend === 'server' ? h('span', { class: 'browser-op-backend', text: 'server browser' }) : null,
    op.error_code ? h('span', { class: 'browser-op-error', text: op.error_code }) : null,
  );
}

/** The "Browser devices" dialog: pairing approval and the user's paired browsers. */
export class DevicesPanel {
  constructor() {
    this.codeInput = h('input', {
      type: 'text', class: 'input', testid: 'pairing-code-input', placeholder: 'ABCD-EFGH', maxlength: 12,
      autocomplete: 'off', 'aria-label': 'Pairing code',
    });
    this.message = h('p', { class: 'devices-message', testid: 'devices-message', role: 'status' });
    this.list = h('ul', { class: 'devices-list', testid: 'device-list' });
    const approve = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'pairing-approve', text: 'Approve' });
    const form = h('form', { class: 'devices-approve' }, this.codeInput, approve);
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.approve();
    });
    const close = h('button', { type: 'button', class: 'btn btn-ghost', text: 'Close', testid: 'devices-close' });
    close.addEventListener('click', () => this.el.close());
    this.el = h(
      'dialog',
      { class: 'devices-dialog', testid: 'devices-panel' },
      h('h2', { text: 'Browser devices' }),
      h('p', { class: 'muted', text: 'Pair the Agent Platform extension: it shows a code; enter it here.' }),
      form,
      this.message,
      this.list,
      h('div', { class: 'devices-foot' }, close),
    );
  }

  open() {
    if (!this.el.isConnected) document.body.append(this.el);
    this.el.showModal();
    this.refresh();
  }

  async approve() {
    const code = this.codeInput.value.trim();
    if (!code) return;
    try {
      await request('POST', 'browser/pairings/approve/', { code });
      this.message.textContent = 'Approved: the extension connects in a few seconds.';
      this.codeInput.value = '';
      setTimeout(() => this.refresh(), 2500);
    } catch (err) {
      this.message.textContent = err.message || 'Could not approve this code.';
    }
  }

  async refresh() {
    let devices = [];
    try {
      devices = (await request('GET', 'browser/devices/')).results || [];
    } catch (err) {
      this.message.textContent = err.message || 'Could not load devices.';
      return;
    }
    if (!devices.length) {
      replaceChildren(this.list, h('li', { class: 'muted', text: 'No paired browsers yet.' }));
      return;
    }
    replaceChildren(this.list, devices.map((d) => {
      const revoke = h('button', { type: 'button', class: 'link-btn', testid: 'device-revoke', text: 'Revoke' });
      revoke.hidden = Boolean(d.revoked_at);
      revoke.addEventListener('click', async () => {
        await request('DELETE', `browser/devices/${d.id}/`);
        this.refresh();
      });
      const state = d.revoked_at ? 'revoked' : d.connected ? 'connected' : 'offline';
      return h('li', { class: `device device-${state}`, testid: 'device', dataset: { state } },
        h('b', { text: d.name || 'Browser' }),
        h('span', { class: 'muted', text: ` ${d.token_prefix}… · ${state}` }),
        revoke);
    }));
  }
}

/** Add the "Browser devices" button to the shell's header (app.js calls this once). */
export function mountBrowserDevices(shell) {
  const panel = new DevicesPanel();
  const button = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'open-devices', text: 'Browser devices' });
  button.addEventListener('click', () => panel.open());
  const box = shell.header.querySelector('.user-box') || shell.header;
  box.prepend(button);
  return panel;
}
