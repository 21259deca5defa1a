// Long-term memory in the chat app (kept out of chat.js, which only hooks in):
// - a "Memory" button in the chat header (mountMemoryButton, called by ChatView.mergeSession);
// - the "Memory" dialog: what this chat's agent remembers about the signed-in user
//   (GET /api/v1/memories/?agent=<id>), forget one (DELETE /api/v1/memories/<id>/) or all
//   (DELETE /api/v1/memories/?agent=<id>), each after an inline confirmation, and
//   "Remember this chat now" (POST /api/v1/memories/extract/ {session}).

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

const PAGE_LIMIT = 10; // pages of the list fetched at most (the API pages by its default size)

/** The "Memory" dialog for one agent (and the chat it was opened from). */
export class MemoryPanel {
  constructor() {
    this.agentId = null;
    this.sessionId = null;
    this.agentName = '';
    this.memories = [];
    this.enabled = true;
    this.title = h('h2', { text: 'Memory' });
    this.intro = h('p', { class: 'muted', testid: 'memory-intro' });
    this.message = h('p', { class: 'devices-message', testid: 'memory-message', role: 'status', 'aria-live': 'polite' });
    this.list = h('ul', { class: 'devices-list', testid: 'memory-list' });
    this.extractBtn = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'memory-extract', text: 'Remember this chat now' });
    this.extractBtn.addEventListener('click', () => this.extract());
    this.clearBtn = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'memory-clear', text: 'Forget everything' });
    this.clearBtn.addEventListener('click', () => this.confirmClear());
    this.confirmBox = h('div', { class: 'memory-confirm', testid: 'memory-confirm', hidden: true });
    const close = h('button', { type: 'button', class: 'btn btn-ghost', text: 'Close', testid: 'memory-close' });
    close.addEventListener('click', () => this.el.close());
    this.el = h(
      'dialog',
      { class: 'devices-dialog memory-dialog', testid: 'memory-panel', 'aria-labelledby': 'memory-title' },
      this.title,
      this.intro,
      this.message,
      this.list,
      this.confirmBox,
      h('div', { class: 'devices-foot' }, this.extractBtn, ' ', this.clearBtn, ' ', close),
    );
    this.title.id = 'memory-title';
  }

  /** Open the dialog for `agent` ({id, name}) from the chat `sessionId`. */
  open(agent, sessionId) {
    this.agentId = agent.id;
    this.agentName = agent.name || 'This agent';
    this.sessionId = sessionId;
    this.message.textContent = '';
    this.confirmBox.hidden = true;
    if (!this.el.isConnected) document.body.append(this.el);
    if (!this.el.open) this.el.showModal();
    this.refresh();
  }

  async refresh() {
    const agent = encodeURIComponent(this.agentId);
    let page;
    const memories = [];
    try {
      page = await request('GET', `memories/?agent=${agent}`);
      memories.push(...(page.results || []));
      for (let i = 1; page.next && i < PAGE_LIMIT; i += 1) {
        page = await request('GET', page.next);
        memories.push(...(page.results || []));
      }
    } catch (err) {
      this.message.textContent = err.message || 'Could not load what the agent remembers.';
      return;
    }
    this.memories = memories;
    this.enabled = page.memory_enabled !== false;
    this.intro.textContent = this.enabled
      ? `What ${this.agentName} remembers about you from earlier chats. It uses the most relevant of these when you write. Only you see this list (and your workspace admins).`
      : `Memory is off for ${this.agentName}: it learns nothing new about you. What it remembered before is listed below.`;
    this.extractBtn.hidden = !this.enabled || !this.sessionId;
    this.clearBtn.hidden = !memories.length;
    if (!memories.length) {
      replaceChildren(this.list, h('li', { class: 'muted', testid: 'memory-empty', text: 'Nothing remembered yet.' }));
      return;
    }
    replaceChildren(this.list, memories.map((m) => this.item(m)));
  }

  item(memory) {
    const forget = h('button', { type: 'button', class: 'link-btn', testid: 'memory-forget', text: 'Forget' });
    const row = h(
      'li',
      { class: 'device memory-item', testid: 'memory-item', dataset: { id: String(memory.id), category: memory.category } },
      h('span', { class: 'memory-text', text: memory.text }),
      h('span', { class: 'muted', text: ` · ${memory.category}`, title: `Last updated ${fullTime(memory.updated_at)}` }),
      forget,
    );
    forget.addEventListener('click', () => {
      if (forget.dataset.confirm !== 'yes') {
        forget.dataset.confirm = 'yes';
        forget.textContent = 'Forget? Click again';
        forget.setAttribute('aria-label', `Confirm: forget "${memory.text}"`);
        return;
      }
      this.forget(memory, row);
    });
    return row;
  }

  async forget(memory, row) {
    try {
      await request('DELETE', `memories/${encodeURIComponent(memory.id)}/`);
    } catch (err) {
      if (err.status !== 404) {
        this.message.textContent = err.message || 'Could not forget this.';
        return;
      }
    }
    row.remove();
    this.message.textContent = 'Forgotten.';
    this.memories = this.memories.filter((m) => m.id !== memory.id);
    if (!this.memories.length) this.refresh();
  }

  confirmClear() {
    const yes = h('button', { type: 'button', class: 'btn btn-primary', testid: 'memory-clear-confirm', text: 'Forget all' });
    const no = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'memory-clear-cancel', text: 'Cancel' });
    yes.addEventListener('click', () => this.clearAll());
    no.addEventListener('click', () => {
      this.confirmBox.hidden = true;
    });
    replaceChildren(
      this.confirmBox,
      h('p', { text: `Forget all ${this.memories.length} things ${this.agentName} remembers about you? This cannot be undone.` }),
      yes,
      ' ',
      no,
    );
    this.confirmBox.hidden = false;
    yes.focus();
  }

  async clearAll() {
    this.confirmBox.hidden = true;
    try {
      const res = await request('DELETE', `memories/?agent=${encodeURIComponent(this.agentId)}`);
      this.message.textContent = `Forgotten: ${res.deleted} item${res.deleted === 1 ? '' : 's'}.`;
    } catch (err) {
      this.message.textContent = err.message || 'Could not forget.';
    }
    this.refresh();
  }

  async extract() {
    try {
      await request('POST', 'memories/extract/', { session: this.sessionId });
      this.message.textContent = 'The agent is reading this chat; new memories appear here in a moment.';
      setTimeout(() => {
        if (this.el.open) this.refresh();
      }, 8000);
    } catch (err) {
      this.message.textContent = err.message || 'Could not start.';
    }
  }
}

let panel = null;

/**
 * Put the "Memory" button in a chat view's header (idempotent; chat.js calls it whenever the
 * session is (re)loaded). `view.el` holds the header; `session` is the API's session
 * ({id, agent: {id, name}}).
 */
export function mountMemoryButton(view, session) {
  const header = view.el && view.el.querySelector('.chat-header');
  if (!header || !session || !session.agent || session.agent.id === undefined) return;
  let button = header.querySelector('[data-testid="open-memory"]');
  if (!button) {
    button = h('button', { type: 'button', class: 'btn btn-ghost memory-toggle', testid: 'open-memory', text: 'Memory' });
    button.addEventListener('click', () => {
      panel = panel || new MemoryPanel();
      panel.open(button.memoryAgent, button.memorySession);
    });
    header.append(button);
  }
  button.memoryAgent = { id: session.agent.id, name: session.agent.name };
  button.memorySession = session.id;
}
