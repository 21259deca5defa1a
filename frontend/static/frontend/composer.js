// The chat's composer: the message box (Enter sends, Shift+Enter a new line), Send / Queue /
// Steer and Stop, and the files attached to the next message (picked, dropped or pasted,
// shown as chips). It owns no conversation state: the chat view tells it, with update(), whether
// a run works and whether the chat is loaded or sending.

import { h, replaceChildren, formatBytes } from './dom.js';
import { icon } from './icons.js';
import { mountResourcePicker } from './resources_picker.js'; // "@": attach an MCP resource

const MAX_ATTACHMENT_BYTES = 10 * 1024 * 1024;
const MAX_ATTACHMENTS = 10;

export class Composer {
  /**
   * @param {object} opts
   * @param {() => void} opts.onSend Enter or Send
   * @param {() => void} opts.onStop Stop
   * @param {(message: string, kind?: string) => void} opts.toast
   */
  constructor({ onSend, onStop, toast }) {
    this.toast = toast;
    this.attachments = []; // files picked/dropped/pasted for the next message: {file, id}
    this.input = h('textarea', {
      id: 'composer-input',
      class: 'composer-input',
      testid: 'composer-input',
      rows: '1',
      placeholder: 'Message…',
      'aria-describedby': 'composer-hint',
      disabled: true,
    });
    this.sendBtn = h(
      'button',
      {
        type: 'submit',
        class: 'btn btn-primary composer-send',
        testid: 'composer-send',
        disabled: true,
      },
      'Send',
    );
    this.stopBtn = h('button', {
      type: 'button',
      class: 'btn composer-stop',
      testid: 'composer-stop',
      title: 'Stop the answer (Esc)',
      hidden: true,
    }, h('span', { class: 'stop-square', 'aria-hidden': 'true' }), 'Stop');
    this.stopBtn.addEventListener('click', () => onStop());
    this.fileInput = h('input', { type: 'file', multiple: true, class: 'visually-hidden', id: 'composer-file', testid: 'composer-file', tabindex: '-1', 'aria-hidden': 'true' });
    this.fileInput.addEventListener('change', () => {
      this.addFiles([...this.fileInput.files]);
      this.fileInput.value = '';
    });
    this.attachBtn = h('button', { type: 'button', class: 'btn btn-ghost composer-attach', testid: 'composer-attach', 'aria-label': 'Attach files', title: 'Attach files (or drop or paste them)' }, icon('paperclip'));
    this.attachBtn.addEventListener('click', () => this.fileInput.click());
    this.chipsEl = h('ul', { class: 'attach-chips', testid: 'attachment-chips', 'aria-label': 'Attached files', hidden: true });
    this.input.addEventListener('paste', (event) => {
      const files = [...(event.clipboardData?.files || [])];
      if (files.length) {
        event.preventDefault();
        this.addFiles(files);
      }
    });
    // Pickers (commands_picker.js) see each key first: a handler returns true when the key was its own.
    this.keyHandlers = [];
    this.input.addEventListener('keydown', (event) => {
      if (this.keyHandlers.some((handle) => handle(event))) return;
      // Enter sends, Shift+Enter inserts a newline; never while an IME is composing.
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
        event.preventDefault();
        onSend();
      }
    });
    this.input.addEventListener('input', () => {
      this.autosize();
      this.update(this.state);
    });
    this.hintEl = h('div', {
      class: 'composer-hint',
      id: 'composer-hint',
      text: 'Enter to send · Shift+Enter for a new line',
    });
    this.el = h(
      'form',
      { class: 'composer', 'aria-label': 'Send a message' },
      this.chipsEl,
      h(
        'div',
        { class: 'composer-inner' },
        this.attachBtn,
        this.fileInput,
        h('label', { class: 'visually-hidden', for: 'composer-input', text: 'Message' }),
        this.input,
        this.stopBtn,
        this.sendBtn,
      ),
      this.hintEl,
    );
    this.el.addEventListener('submit', (event) => {
      event.preventDefault();
      onSend();
    });
    this.state = { loaded: false, sending: false, running: false, agentName: '', steer: false };
    this.resourcePicker = mountResourcePicker(this); // resources_picker.js: refs(), clear()
  }

  /** The typed message, trimmed. */
  get text() {
    return this.input.value.trim();
  }

  /** The box is locked (the chat is not loaded, or a message is being sent). */
  get disabled() {
    return this.input.disabled;
  }

  /** Accept files dropped anywhere on `el` (the conversation and the composer). */
  acceptDrops(el) {
    el.addEventListener('dragover', (event) => {
      if (![...(event.dataTransfer?.types || [])].includes('Files')) return;
      event.preventDefault();
      el.classList.add('is-dropping');
    });
    el.addEventListener('dragleave', (event) => {
      if (!el.contains(event.relatedTarget)) el.classList.remove('is-dropping');
    });
    el.addEventListener('drop', (event) => {
      const files = [...(event.dataTransfer?.files || [])];
      el.classList.remove('is-dropping');
      if (!files.length) return;
      event.preventDefault();
      this.addFiles(files);
    });
  }

  /**
   * Show the chat's state: {loaded, sending, running (a run works), agentName, steer (the
   * agent's message mode is steer)}. The box stays usable during a run: a message sent then is
   * queued or steered.
   */
  update(state) {
    this.state = state;
    this.resourcePicker?.onState(state); // the chat's pinned resources (resources_picker.js)
    const { running, steer } = state;
    const locked = !state.loaded || state.sending;
    const name = state.agentName || 'the agent';
    this.input.placeholder = running
      ? steer
        ? `${name} is working… a message now joins the current answer`
        : `${name} is working… a message now waits its turn`
      : `Message ${name}…`;
    const wasDisabled = this.input.disabled;
    this.input.disabled = locked;
    const hasText = !!this.text;
    this.sendBtn.disabled = locked || !hasText;
    this.el.classList.toggle('is-locked', locked);
    this.el.classList.toggle('is-running', running);
    // While a run works, Send becomes Stop; typing brings Send (queue / steer) back next to it.
    this.stopBtn.hidden = !running;
    this.sendBtn.hidden = running && !hasText;
    this.sendBtn.textContent = state.sending ? 'Sending…' : running ? (steer ? 'Steer' : 'Queue') : 'Send';
    this.hintEl.textContent = running
      ? 'Esc to stop · Enter to send'
      : 'Enter to send · Shift+Enter for a new line';
    // Give focus back when a run finishes, unless the user is elsewhere.
    if (wasDisabled && !locked && state.loaded) {
      const active = document.activeElement;
      if (!active || active === document.body || active === this.sendBtn) this.input.focus();
    }
  }

  /** Disable Stop while a stop request is under way. */
  setStopping(stopping) {
    this.stopBtn.disabled = stopping;
  }

  autosize() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`;
  }

  /** Replace the text (a new chat's draft; '' after sending). */
  setText(text) {
    this.input.value = text || '';
    this.autosize();
    this.update(this.state);
  }

  focus() {
    this.input.focus();
  }

  /** The attached files, in order; `clearFiles()` once they were uploaded. */
  get files() {
    return this.attachments.map((a) => a.file);
  }

  clearFiles() {
    this.attachments = [];
    this.renderChips();
  }

  addFiles(files) {
    for (const file of files) {
      if (file.size > MAX_ATTACHMENT_BYTES) {
        this.toast(`“${file.name}” is larger than 10 MB and was not attached.`, 'error');
        continue;
      }
      this.attachments.push({ file, id: Math.random().toString(36).slice(2) });
    }
    this.attachments = this.attachments.slice(0, MAX_ATTACHMENTS);
    this.renderChips();
    this.input.focus();
  }

  renderChips() {
    this.chipsEl.hidden = !this.attachments.length;
    replaceChildren(
      this.chipsEl,
      this.attachments.map((a) => {
        const remove = h('button', { type: 'button', class: 'chip-remove', 'aria-label': `Remove ${a.file.name}`, text: '×' });
        remove.addEventListener('click', () => {
          this.attachments = this.attachments.filter((x) => x.id !== a.id);
          this.renderChips();
          this.input.focus();
        });
        return h(
          'li',
          { class: 'attach-chip', testid: 'attachment-chip' },
          icon(a.file.type.startsWith('image/') ? 'image' : 'file'),
          h('span', { class: 'attach-name', text: a.file.name }),
          h('span', { class: 'attach-size', text: formatBytes(a.file.size) }),
          remove,
        );
      }),
    );
  }
}
