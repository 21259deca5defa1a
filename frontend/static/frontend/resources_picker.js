// MCP resources in the chat (issue 37): typing "@" in the message box opens a picker over the
// agent's MCP servers' resources (GET /api/v1/agents/<id>/resources/?q=, searched as you type);
// the chosen resource shows as a chip above the box and is posted with the message
// (resources: [{binding, uri}]); a template's URI is filled in first, in a small form above the box. Keyboard: ↑/↓ move,
// Enter or Tab choose, Esc closes. The box keeps the focus: while the list is open it controls
// it (aria-controls) and names the active option (aria-activedescendant), as the / picker does.
// renderUserInput() shows a sent message's "[resource: <server> <uri>]" lines as chips.
// Pins: an attached resource's pin button pins it to the chat (POST /api/v1/sessions/<id>/pinned-resources/):
// every later run of the chat reads it, not only the next message's. The chat's pins are a row
// of chips above the box (loaded when the chat is, and again when an answer ends), each with × to
// unpin (DELETE); "updated" on a chip: the last answer read it again because its server said it changed.

import { api } from './api.js';
import { h, replaceChildren } from './dom.js';
import { icon } from './icons.js';

const TOKEN = /(^|\s)@([^\s@]*)$/; // "@query" just before the caret
const RESOURCE_LINE = /^\[resource: (\S+) (\S+)\]$/;
const MAX_SHOWN = 8;
let nextId = 0;

/** Attach the picker to a Composer (composer.js calls this once). Returns the picker. */
export function mountResourcePicker(composer) {
  return new ResourcePicker(composer);
}

class ResourcePicker {
  constructor(composer) {
    this.composer = composer;
    this.input = composer.input;
    this.chosen = []; // {binding, server, uri, label}
    this.items = [];
    this.active = -1;
    this.open = false;
    this.seq = 0;
    this.timer = null;
    this.id = `resource-picker-${nextId++}`;
    this.list = h('ul', { id: this.id, class: 'resource-picker', role: 'listbox', testid: 'resource-picker',
      'aria-label': 'Resources to attach', hidden: true });
    this.status = h('div', { class: 'resource-picker-status', testid: 'resource-picker-status', role: 'status' });
    this.popup = h('div', { class: 'resource-popup', hidden: true }, this.status, this.list);
    this.chips = h('ul', { class: 'attach-chips resource-chips', testid: 'resource-chips', 'aria-label': 'Attached resources', hidden: true });
    this.pins = new PinnedRow(composer);
    this.input.setAttribute('aria-autocomplete', 'list');
    this.controlled = null; // the box's aria-controls before the list opened (the / picker's)
    composer.el.insertBefore(this.chips, composer.el.firstChild);
    composer.el.insertBefore(this.pins.el, composer.el.firstChild);
    composer.el.append(this.popup);
    this.input.addEventListener('input', () => this.onInput());
    this.input.addEventListener('blur', () => setTimeout(() => this.close(), 150));
    composer.keyHandlers.push((event) => this.onKeydown(event)); // before the box's Enter-to-send
  }

  /** The chosen resources as posted: [{binding, uri}]. */
  refs() {
    return this.chosen.map(({ binding, uri }) => ({ binding, uri }));
  }

  clear() {
    this.chosen = [];
    this.renderChips();
  }

  query() {
    const before = this.input.value.slice(0, this.input.selectionStart ?? this.input.value.length);
    const match = TOKEN.exec(before);
    return match ? match[2] : null;
  }

  onInput() {
    const q = this.query();
    if (q === null || !this.composer.state.agentId) {
      this.close();
      return;
    }
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.search(q), 150);
  }

  async search(q) {
    const seq = ++this.seq;
    this.show();
    this.status.textContent = 'Searching…';
    let answer;
    try {
      answer = await api.listResources(this.composer.state.agentId, q);
    } catch (err) {
      if (seq === this.seq) this.status.textContent = err.message || 'Could not list the resources.';
      return;
    }
    if (seq !== this.seq || !this.open) return;
    this.items = (answer.results || []).slice(0, MAX_SHOWN);
    const failed = (answer.errors || []).map((e) => `${e.server}: ${e.error}`).join(' · ');
    this.status.textContent = this.items.length
      ? `${this.items.length} resource${this.items.length === 1 ? '' : 's'}${failed ? ` · ${failed}` : ''}`
      : failed || (q ? `No resource matches “${q}”.` : 'This agent has no resources.');
    this.active = this.items.length ? 0 : -1;
    this.renderList();
  }

  show() {
    if (!this.open) this.controlled = this.input.getAttribute('aria-controls');
    this.open = true;
    this.popup.hidden = false;
    this.input.setAttribute('aria-controls', this.id);
  }

  close() {
    this.open = false;
    this.seq += 1;
    this.popup.hidden = true;
    this.list.hidden = true;
    this.items = [];
    if (this.input.getAttribute('aria-controls') === this.id) {
      if (this.controlled) this.input.setAttribute('aria-controls', this.controlled);
      else this.input.removeAttribute('aria-controls');
      this.input.removeAttribute('aria-activedescendant');
    }
  }

  renderList() {
    this.list.hidden = !this.items.length;
    replaceChildren(this.list, this.items.map((item, i) => {
      const option = h('li', {
        id: `${this.id}-${i}`, role: 'option', class: 'resource-option', testid: 'resource-option',
        'aria-selected': String(i === this.active), dataset: { uri: item.uri },
      },
      h('span', { class: 'resource-name', text: item.title || item.name }),
      h('span', { class: 'resource-uri', text: `${item.server} · ${item.uri}${item.template ? ' (template)' : ''}` }),
      item.description ? h('span', { class: 'resource-desc', text: item.description }) : null);
      option.addEventListener('mousedown', (event) => {
        event.preventDefault(); // keep the focus in the box
        this.choose(i);
      });
      return option;
    }));
    if (this.active >= 0) this.input.setAttribute('aria-activedescendant', `${this.id}-${this.active}`);
    else this.input.removeAttribute('aria-activedescendant');
  }

  /** A key in the box (composer.keyHandlers): true when it was the picker's (it does not send). */
  onKeydown(event) {
    if (!this.open || event.isComposing) return false;
    const count = this.items.length;
    if (event.key === 'Escape') {
      this.close();
    } else if ((event.key === 'ArrowDown' || event.key === 'ArrowUp') && count) {
      this.active = (this.active + (event.key === 'ArrowDown' ? 1 : count - 1)) % count;
      this.renderList();
    } else if ((event.key === 'Enter' || event.key === 'Tab') && this.active >= 0) {
      this.choose(this.active);
    } else {
      return false;
    }
    event.preventDefault();
    event.stopPropagation(); // Esc does not also stop the answer (chat.js listens on the document)
    return true;
  }

  /** Take item `i`: the "@query" leaves the box, the resource becomes a chip (a template asks for its URI). */
  choose(i) {
    const item = this.items[i];
    if (!item) return;
    const caret = this.input.selectionStart ?? this.input.value.length;
    const before = this.input.value.slice(0, caret).replace(/@[^\s@]*$/, '');
    this.composer.setText(before + this.input.value.slice(caret));
    this.close();
    if (item.template) {
      this.askTemplate(item);
      return;
    }
    this.attach(item, item.uri, item.title || item.name);
  }

  attach(item, uri, label) {
    if (!this.chosen.some((c) => c.binding === item.binding && c.uri === uri)) {
      this.chosen.push({ binding: item.binding, server: item.server, uri, label });
    }
    this.renderChips();
    this.input.focus();
  }

  /** A template's URI, filled in in a small form above the box (Enter attaches, Esc goes back). */
  askTemplate(item) {
    this.composer.el.querySelector('.resource-template')?.remove(); // one at a time
    const id = `${this.id}-template`;
    const field = h('input', { id, type: 'text', class: 'resource-template-input', testid: 'resource-template-input',
      value: item.uri, spellcheck: 'false', autocomplete: 'off', 'aria-describedby': `${id}-hint` });
    const error = h('div', { class: 'resource-template-error', role: 'alert', testid: 'resource-template-error' });
    // A group, not a <form>: it sits inside the composer's form (forms do not nest).
    const form = h('div', { class: 'resource-popup resource-template', role: 'group', testid: 'resource-template', 'aria-label': 'Fill in a resource template' },
      h('label', { for: id, text: `${item.title || item.name} (${item.server}): the resource's URI` }), field,
      h('div', { id: `${id}-hint`, class: 'resource-picker-status', text: 'Replace each {…} part, then Enter. Esc: back to the message.' }),
      error);
    const done = () => {
      form.remove();
      this.input.focus();
    };
    const submit = () => {
      const uri = field.value.trim();
      if (!uri || /\{[^}]*\}/.test(uri) || /\s/.test(uri)) {
        error.textContent = 'Replace every {…} part of the URI (no spaces).';
        return;
      }
      form.remove();
      this.attach(item, uri, uri);
    };
    field.addEventListener('keydown', (event) => {
      if (event.key !== 'Escape' && event.key !== 'Enter') return;
      event.preventDefault(); // Enter must not submit the composer's form (send the message)
      event.stopPropagation();
      if (event.key === 'Enter') submit();
      else done();
    });
    this.composer.el.append(form);
    field.focus();
    const start = item.uri.indexOf('{');
    if (start >= 0) field.setSelectionRange(start, item.uri.indexOf('}', start) + 1);
  }

  /** The chat's state changed (composer.update): load its pins when the chat is another one. */
  onState(state) {
    this.pins.show(state.sessionId);
    if (this.wasRunning && !state.running) this.pins.load(); // which pins the answer found updated
    this.wasRunning = !!state.running;
  }

  renderChips() {
    this.chips.hidden = !this.chosen.length;
    replaceChildren(this.chips, this.chosen.map((c) => {
      const remove = h('button', { type: 'button', class: 'chip-remove', 'aria-label': `Remove ${c.label}`, text: '×' });
      remove.addEventListener('click', () => {
        this.chosen = this.chosen.filter((x) => x !== c);
        this.renderChips();
        this.input.focus();
      });
      const pin = h('button', { type: 'button', class: 'chip-pin', testid: 'resource-chip-pin',
        'aria-label': `Pin ${c.label} to this chat`, title: 'Pin to this chat: every later answer reads it' }, icon('pin'));
      pin.addEventListener('click', async () => {
        if (await this.pins.pin(c)) {
          this.chosen = this.chosen.filter((x) => x !== c);
          this.renderChips();
        }
        this.input.focus();
      });
      return h('li', { class: 'attach-chip resource-chip', testid: 'resource-chip', title: `${c.server} · ${c.uri}` },
        h('span', { class: 'resource-at', 'aria-hidden': 'true', text: '@' }),
        h('span', { class: 'attach-name', text: c.label }), pin, remove);
    }));
  }
}

/** The chat's pinned resources: a row of chips above the box, each with × to unpin. */
class PinnedRow {
  constructor(composer) {
    this.composer = composer;
    this.sessionId = null;
    this.items = [];
    this.seq = 0;
    this.el = h('ul', { class: 'attach-chips pinned-chips', testid: 'pinned-chips',
      'aria-label': 'Resources pinned to this chat: every answer reads them', hidden: true });
  }

  show(sessionId) {
    if ((sessionId || null) === this.sessionId) return;
    this.sessionId = sessionId || null;
    this.items = [];
    this.seq += 1;
    this.render();
    if (this.sessionId) this.load();
  }

  async load() {
    if (!this.sessionId) return;
    const seq = ++this.seq;
    const sessionId = this.sessionId;
    try {
      const answer = await api.listPinnedResources(sessionId);
      if (seq !== this.seq || sessionId !== this.sessionId) return;
      this.items = answer.results || [];
      this.render();
    } catch (err) {
      // a chat without pins looks the same; the chat still works
    }
  }

  /** Pin an attached resource {binding, uri}: true when pinned. */
  async pin({ binding, uri }) {
    if (!this.sessionId) return false;
    try {
      await api.pinResource(this.sessionId, { binding, uri });
    } catch (err) {
      this.composer.toast?.(err.message || 'Could not pin the resource.', 'error');
      return false;
    }
    await this.load();
    return true;
  }

  async unpin(item) {
    try {
      await api.unpinResource(this.sessionId, item.id);
    } catch (err) {
      this.composer.toast?.(err.message || 'Could not unpin the resource.', 'error');
      return;
    }
    await this.load();
    this.composer.input.focus();
  }

  render() {
    this.el.hidden = !this.items.length;
    const heading = h('li', { class: 'pinned-heading', 'aria-hidden': 'true', text: 'Pinned to this chat:' });
    replaceChildren(this.el, heading, this.items.map((item) => {
      const label = item.uri.replace(/\/+$/, '').split('/').pop() || item.uri;
      const remove = h('button', { type: 'button', class: 'chip-remove', testid: 'pinned-chip-unpin',
        'aria-label': `Unpin ${item.uri}`, text: '×' });
      remove.addEventListener('click', () => this.unpin(item));
      return h('li', {
        class: `attach-chip resource-chip pinned-chip${item.bound ? '' : ' is-unbound'}`, testid: 'pinned-chip',
        title: `${item.server} · ${item.uri}${item.bound ? ' · pinned: every answer reads it' : ' · its server is no longer the agent\'s: left out'}`,
      },
      icon('pin'),
      h('span', { class: 'attach-name', text: label }),
      item.bound ? null : h('span', { class: 'pinned-note', text: 'not available' }),
      item.bound && item.updated ? h('span', { class: 'pinned-updated', testid: 'pinned-chip-updated', text: 'updated',
        title: 'Changed since the answer before: the last answer read the new version' }) : null,
      remove);
    }));
  }
}

/** Show a sent message in `el`: its text, with "[resource: <server> <uri>]" lines as chips. */
export function renderUserInput(el, input) {
  const text = String(input || '');
  if (el.dataset.input === text) return;
  el.dataset.input = text;
  const lines = text.split('\n');
  const chips = lines.map((line) => RESOURCE_LINE.exec(line)).filter(Boolean);
  if (!chips.length) {
    el.textContent = text;
    return;
  }
  const rest = lines.filter((line) => !RESOURCE_LINE.test(line)).join('\n');
  replaceChildren(el, h('span', { text: rest }), h('ul', { class: 'attach-chips resource-chips sent', 'aria-label': 'Attached resources' },
    chips.map(([, server, uri]) => h('li', { class: 'attach-chip resource-chip', testid: 'sent-resource-chip', title: `${server} · ${uri}` },
      h('span', { class: 'resource-at', 'aria-hidden': 'true', text: '@' }), h('span', { class: 'attach-name', text: uri })))));
}
