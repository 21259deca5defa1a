// Slash commands in the composer (issue 37): `/` at the start of the message box opens the list of
// the agent's commands (GET /agents/<id>/commands/: the tenant's commands bound to the agent and
// the prompts of its MCP servers), filtered as you type. Choosing one (click, Enter or Tab) with
// arguments opens a small form (an MCP server's completions offered as a datalist while you type);
// the filled-in command (POST …/commands/<name>/render/) is then put into the message box, with
// its images and files attached, for the person to read and send (Enter) or edit.
//
// Keyboard: ↑/↓ move in the list, Enter or Tab chooses, Esc closes; in the form Enter inserts, Esc
// cancels. The message box keeps the focus while the list is open (aria-activedescendant).
// `/name text` + Enter chooses `name` directly, `text` filling its first argument.

import { h, replaceChildren } from './dom.js';
import { request } from './api.js';

const LIST_MAX_AGE_MS = 60_000;
const COMPLETE_DELAY_MS = 200;
const enc = encodeURIComponent;

let uid = 0;

/** The command's name typed so far: `/rev` → `rev`, or null when the text is not a command. */
function typedName(value) {
  const match = /^\/([^\s/]*)$/.exec(value);
  return match ? match[1].toLowerCase() : null;
}

/** `/name rest…` → {name, rest} (null when the text does not start with a command name and a space). */
function typedCommand(value) {
  const match = /^\/(\S+)\s+([\s\S]*)$/.exec(value);
  return match ? { name: match[1], rest: match[2].trim() } : /^\/(\S+)$/.test(value) ? { name: value.slice(1), rest: '' } : null;
}

/** Commands matching `query`: names starting with it first, then names or descriptions containing it. */
function matching(commands, query) {
  if (!query) return commands;
  const starts = [];
  const contains = [];
  for (const c of commands) {
    const name = c.name.toLowerCase();
    const prompt = (c.prompt || '').toLowerCase();
    if (name.startsWith(query) || prompt.startsWith(query)) starts.push(c);
    else if (`${name} ${c.title} ${c.description}`.toLowerCase().includes(query)) contains.push(c);
  }
  return [...starts, ...contains];
}

/** A File from base64 `data` (a rendered MCP prompt's image or resource). */
function fileOf({ filename, mime_type: type, data }) {
  const bytes = Uint8Array.from(atob(data), (ch) => ch.charCodeAt(0));
  return new File([bytes], filename, { type });
}

export class CommandsPicker {
  /**
   * @param {object} opts
   * @param {import('./composer.js').Composer} opts.composer the message box it works in
   * @param {(message: string, kind?: string) => void} opts.toast
   */
  constructor({ composer, toast }) {
    this.composer = composer;
    this.toast = toast;
    this.agentId = null;
    this.commands = null; // the agent's list once loaded: {commands, unavailable, at}
    this.loading = null;
    this.shown = []; // the commands in the open list
    this.active = -1;
    this.form = null; // the open arguments form: {command, fields, el}
    this.id = `cmd-picker-${(uid += 1)}`;
    // The list scrolls; it is focusable too (Shift+Tab from the box) and then takes the same keys.
    this.listEl = h('ul', { class: 'cmd-list', id: `${this.id}-list`, role: 'listbox', tabindex: '0', 'aria-label': 'Commands', testid: 'command-list' });
    this.listEl.addEventListener('keydown', (event) => {
      if (!this.listOpen) return;
      const escape = event.key === 'Escape';
      if (this.onListKey(event) && escape) this.composer.focus();
    });
    this.noteEl = h('div', { class: 'cmd-note', testid: 'command-note' });
    this.el = h('div', { class: 'cmd-picker', hidden: true, testid: 'command-picker' }, this.listEl, this.noteEl);
    this.live = h('div', { class: 'visually-hidden', role: 'status', 'aria-live': 'polite' });
    const input = composer.input;
    input.setAttribute('aria-autocomplete', 'list');
    input.setAttribute('aria-controls', this.listEl.id);
    composer.el.prepend(this.el, this.live);
    input.addEventListener('input', () => this.onInput());
    // Focus leaving both the box and the list closes the list.
    const closeUnlessInside = () => setTimeout(() => {
      const active = document.activeElement;
      if (active !== input && !this.el.contains(active)) this.closeList();
    }, 150);
    input.addEventListener('blur', closeUnlessInside);
    this.el.addEventListener('focusout', closeUnlessInside);
    composer.keyHandlers.push((event) => this.onKey(event));
  }

  /** The chat's agent (again after a handoff): its commands are loaded when `/` is typed. */
  setAgent(agentId) {
    if (agentId === this.agentId) return;
    this.agentId = agentId;
    this.commands = null;
    this.closeForm();
    this.closeList();
  }

  // ------------------------------------------------------------------ the list --

  async load() {
    const fresh = this.commands && Date.now() - this.commands.at < LIST_MAX_AGE_MS;
    if (fresh || this.agentId === null || this.agentId === undefined) return this.commands;
    if (!this.loading) {
      const agentId = this.agentId;
      this.loading = request('GET', `agents/${enc(agentId)}/commands/`)
        .then((answer) => {
          if (agentId === this.agentId) this.commands = { ...answer, at: Date.now() };
          return this.commands;
        })
        .catch((err) => {
          this.toast(err.message || 'Could not load the commands.', 'error');
          return null;
        })
        .finally(() => {
          this.loading = null;
        });
    }
    return this.loading;
  }

  async onInput() {
    const value = this.composer.input.value;
    const query = typedName(value);
    if (query === null || this.form) {
      this.closeList();
      if (value.startsWith('/') && !this.form) this.load(); // `/name text` pasted: Enter looks the name up
      return;
    }
    if (!this.commands) this.showNote('Loading commands…');
    await this.load();
    if (typedName(this.composer.input.value) !== query) return; // typed on meanwhile
    this.showList(query);
  }

  showNote(text) {
    replaceChildren(this.listEl);
    this.noteEl.textContent = text;
    this.el.hidden = false;
  }

  showList(query) {
    const all = this.commands ? this.commands.commands : [];
    this.shown = matching(all, query);
    if (!this.shown.length) {
      this.closeList();
      return;
    }
    this.active = 0;
    replaceChildren(this.listEl, this.shown.map((c, i) => this.option(c, i)));
    const unavailable = this.commands.unavailable || [];
    this.noteEl.textContent = unavailable.length
      ? `Unavailable: ${unavailable.map((u) => `${u.server} (${u.error})`).join('; ')}`
      : '';
    this.el.hidden = false;
    this.highlight();
    this.live.textContent = `${this.shown.length} command${this.shown.length === 1 ? '' : 's'}; up and down to choose, Enter to pick.`;
  }

  option(command, index) {
    const badge = command.source === 'mcp' ? `MCP · ${command.server}` : 'Command';
    const el = h(
      'li',
      { id: `${this.id}-opt-${index}`, class: 'cmd-option', role: 'option', 'aria-selected': 'false', testid: 'command-option', dataset: { name: command.name } },
      h('span', { class: 'cmd-name', text: `/${command.name}` }),
      h('span', { class: 'cmd-desc', text: command.title || command.description || '' }),
      h('span', { class: 'cmd-badge', text: badge }),
    );
    el.addEventListener('mousedown', (event) => event.preventDefault()); // keep the focus in the box
    el.addEventListener('click', () => this.choose(command, ''));
    return el;
  }

  highlight() {
    [...this.listEl.children].forEach((el, i) => {
      el.setAttribute('aria-selected', String(i === this.active));
      el.classList.toggle('is-active', i === this.active);
      if (i === this.active) el.scrollIntoView({ block: 'nearest' });
    });
    const active = this.listEl.children[this.active];
    if (!active) return;
    for (const el of [this.composer.input, this.listEl]) el.setAttribute('aria-activedescendant', active.id);
  }

  get listOpen() {
    return !this.el.hidden && this.shown.length > 0;
  }

  closeList() {
    this.el.hidden = true;
    this.shown = [];
    this.active = -1;
    replaceChildren(this.listEl);
    this.noteEl.textContent = '';
    // Only ours: the @ picker (resources_picker.js) names its own options on the same box.
    const input = this.composer.input;
    if ((input.getAttribute('aria-activedescendant') || '').startsWith(`${this.id}-opt-`)) {
      input.removeAttribute('aria-activedescendant');
    }
    this.listEl.removeAttribute('aria-activedescendant');
  }

  /** The composer's keydown, before its own (Enter sends): true when the key was ours. */
  onKey(event) {
    if (event.isComposing) return false;
    if (this.listOpen) return this.onListKey(event);
    if (event.key === 'Enter' && !event.shiftKey && this.commands) {
      const typed = typedCommand(this.composer.input.value);
      const command = typed && this.commands.commands.find((c) => c.name === typed.name);
      if (command) {
        event.preventDefault();
        this.choose(command, typed.rest);
        return true;
      }
    }
    return false;
  }

  onListKey(event) {
    const n = this.shown.length;
    if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      this.active = (this.active + (event.key === 'ArrowDown' ? 1 : n - 1)) % n;
      this.highlight();
    } else if ((event.key === 'Enter' || event.key === 'Tab') && !event.shiftKey) {
      this.choose(this.shown[this.active], '');
    } else if (event.key === 'Escape') {
      this.closeList();
    } else {
      return false;
    }
    event.preventDefault();
    event.stopPropagation();
    return true;
  }

  // ------------------------------------------------------------------ choosing --

  /**
   * Pick `command`. `rest` (typed after its name) fills its free text (ARGUMENTS), else its first
   * argument. Filled in at once when nothing required is left empty (and something was typed, or
   * it has no arguments); else the form opens.
   */
  choose(command, rest) {
    this.closeList();
    const args = command.arguments || [];
    const target = args.find((a) => a.name === 'ARGUMENTS') || args[0];
    const values = rest && target ? { [target.name]: rest } : {};
    const missing = args.some((a) => a.required && !values[a.name]);
    if (!args.length || (rest && !missing)) this.render(command, values);
    else this.openForm(command, values);
  }

  openForm(command, values) {
    this.closeForm();
    const fields = (command.arguments || []).map((arg) => this.field(command, arg, values[arg.name] || ''));
    const error = h('div', { class: 'cmd-error', role: 'alert', testid: 'command-error' });
    const cancel = h('button', { type: 'button', class: 'btn', testid: 'command-cancel', text: 'Cancel' });
    const submit = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'command-insert', text: 'Insert' });
    const titleId = `${this.id}-form-title`;
    const el = h(
      'form',
      { class: 'cmd-form', testid: 'command-form', 'aria-labelledby': titleId },
      h('div', { class: 'cmd-form-title', id: titleId }, h('strong', { text: `/${command.name}` }),
        command.description ? h('span', { class: 'cmd-desc', text: ` ${command.description}` }) : null),
      fields.map((f) => f.el),
      error,
      h('div', { class: 'cmd-form-actions' }, cancel, submit),
    );
    el.addEventListener('submit', (event) => {
      event.preventDefault();
      event.stopPropagation(); // not the composer's form
      const values = {};
      for (const f of fields) if (f.input.value !== '') values[f.arg.name] = f.input.value;
      this.render(command, values, error);
    });
    el.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') {
        event.preventDefault();
        event.stopPropagation();
        this.closeForm();
        this.composer.focus();
      }
    });
    cancel.addEventListener('click', () => {
      this.closeForm();
      this.composer.focus();
    });
    this.form = { command, fields, el };
    // Not inside the composer's <form>: forms do not nest.
    this.composer.el.before(el);
    const empty = fields.find((f) => f.arg.required && !f.input.value) || fields.find((f) => !f.input.value);
    (empty || fields[0]).input.focus();
  }

  field(command, arg, value) {
    const id = `${this.id}-arg-${arg.name}`;
    const list = h('datalist', { id: `${id}-list`, testid: `command-arg-${arg.name}-options` });
    const input = h('input', {
      id, name: arg.name, type: 'text', class: 'cmd-input', list: list.id, autocomplete: 'off',
      required: arg.required || null, testid: `command-arg-${arg.name}`, 'aria-describedby': arg.description ? `${id}-hint` : null,
    });
    input.value = value || '';
    const label = arg.name === 'ARGUMENTS' ? 'Text' : arg.name;
    const el = h(
      'div',
      { class: 'cmd-field' },
      h('label', { for: id, text: `${label}${arg.required ? ' *' : ''}` }),
      input,
      list,
      arg.description ? h('div', { class: 'cmd-hint', id: `${id}-hint`, text: arg.description }) : null,
    );
    if (command.source === 'mcp') {
      let timer = null;
      const complete = () => this.complete(command, arg, input, list);
      input.addEventListener('input', () => {
        clearTimeout(timer);
        timer = setTimeout(complete, COMPLETE_DELAY_MS);
      });
      input.addEventListener('focus', complete, { once: true });
    }
    return { arg, input, el };
  }

  /** Ask the server for completions of `arg` (best effort: a failure leaves the list as it was). */
  async complete(command, arg, input, list) {
    const context = {};
    for (const f of this.form ? this.form.fields : []) {
      if (f.arg.name !== arg.name && f.input.value) context[f.arg.name] = f.input.value;
    }
    const params = new URLSearchParams({ argument: arg.name, value: input.value, context: JSON.stringify(context) });
    try {
      const answer = await request('GET', `agents/${enc(this.agentId)}/commands/${enc(command.name)}/complete/?${params}`);
      replaceChildren(list, (answer.values || []).map((v) => h('option', { value: v })));
    } catch {
      // no completions
    }
  }

  closeForm() {
    if (this.form) this.form.el.remove();
    this.form = null;
  }

  /** Fill `command` in and put it into the message box (with its files); errors go to `errorEl` or a toast. */
  async render(command, values, errorEl) {
    try {
      const answer = await request('POST', `agents/${enc(this.agentId)}/commands/${enc(command.name)}/render/`, { arguments: values });
      this.closeForm();
      this.composer.setText(answer.text);
      const files = (answer.attachments || []).map(fileOf);
      if (files.length) this.composer.addFiles(files);
      this.composer.focus();
      const end = this.composer.input.value.length;
      this.composer.input.setSelectionRange(end, end);
      this.live.textContent = `/${command.name} is in the message box: read it, then press Enter to send.`;
    } catch (err) {
      const message = err.message || 'The command could not be filled in.';
      if (errorEl) {
        errorEl.textContent = message;
      } else if (err.status === 400) {
        this.openForm(command, values); // say what is missing where it can be filled in
        this.form.el.querySelector('.cmd-error').textContent = message;
      } else {
        this.toast(message, 'error');
      }
    }
  }
}
