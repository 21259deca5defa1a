// "Add to knowledge" in the chat app (kept out of chat.js, which only hooks in):
// - mountKnowledgeUploads(view): called by ChatView.loadFiles once the Files panel is drawn.
//   It asks GET /api/v1/sessions/<id>/knowledge-uploads/ whether the chat's agent allows
//   adding attachments to the user's own knowledge (the agent's knowledge binding has
//   `user_uploads`) and which attachments are in it already; under each attachment it puts
//   "Add to knowledge" (POST …/artifacts/<id>/add-to-knowledge/) or the document's status:
//   queued → parsing → embedding (with progress) → ready, or failed with the reason, polled
//   from GET /api/v1/knowledge-bases/<kb>/documents/<id>/ until it ends.
// - "My knowledge" in the Files panel's head opens a dialog with the user's own documents
//   (GET /api/v1/knowledge-bases/<kb>/documents/), their status, and Delete (after an inline
//   confirmation; DELETE …/documents/<id>/).

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

const POLL_MS = 1500; // how often a document being ingested is asked for its status
const POLL_LIMIT = 800; // polls at most (20 minutes), then the status says to reopen the panel
const PAGE_LIMIT = 10; // pages of "My knowledge" fetched at most
const FINAL = new Set(['ready', 'failed']);
const enc = encodeURIComponent;

/** The words for a document's status: "Queued", "Embedding 40%", "In your knowledge", "Failed: …". */
export function statusText(doc) {
  switch (doc.status) {
    case 'queued':
      return 'Queued for your knowledge…';
    case 'parsing':
      return 'Reading…';
    case 'embedding':
      return `Embedding ${Math.round((doc.progress || 0) * 100)}%…`;
    case 'ready':
      return 'In your knowledge';
    case 'failed':
      return `Failed: ${doc.status_reason || 'unknown reason'}`;
    default:
      return doc.status;
  }
}

const docPath = (doc) => `knowledge-bases/${enc(doc.knowledge_base)}/documents/${enc(doc.id)}/`;

/** Show `doc`'s status in `slot` (a status line under an attachment), polling until it ends. */
function follow(slot, doc, retry) {
  const show = (d) => {
    slot.dataset.status = d.status;
    const line = h('span', { class: `kn-status kn-${d.status}`, testid: 'knowledge-status', role: 'status', text: statusText(d) });
    if (d.status === 'failed' && retry) {
      const again = h('button', { type: 'button', class: 'link-btn', testid: 'add-to-knowledge', text: 'Try again' });
      again.addEventListener('click', () => retry(again));
      replaceChildren(slot, line, ' ', again);
    } else {
      replaceChildren(slot, line);
    }
  };
  show(doc);
  if (FINAL.has(doc.status)) return;
  let polls = 0;
  const tick = async () => {
    if (!slot.isConnected) return; // the panel was redrawn or closed: its new status line polls
    polls += 1;
    if (polls > POLL_LIMIT) {
      slot.lastChild.textContent = `${statusText(doc)} (reopen Files to refresh)`;
      return;
    }
    try {
      doc = await request('GET', docPath(doc));
    } catch (err) {
      if (err.status === 404) {
        replaceChildren(slot, h('span', { class: 'kn-status', testid: 'knowledge-status', text: 'Removed from your knowledge' }));
        return;
      }
      // a network blip: keep asking
    }
    if (!slot.isConnected) return;
    show(doc);
    if (!FINAL.has(doc.status)) setTimeout(tick, POLL_MS);
  };
  setTimeout(tick, POLL_MS);
}

/** Add artifact `artifactId` of the chat to the user's knowledge and follow its status in `slot`. */
async function add(view, slot, artifactId, button) {
  button.disabled = true;
  button.textContent = 'Adding…';
  const retry = (b) => add(view, slot, artifactId, b);
  try {
    const doc = await request('POST', `sessions/${enc(view.sessionId)}/artifacts/${enc(artifactId)}/add-to-knowledge/`, {});
    follow(slot, doc, retry);
  } catch (err) {
    button.disabled = false;
    button.textContent = 'Add to knowledge';
    view.toast(err.message || 'Could not add the file to your knowledge.', 'error');
  }
}

/**
 * Put "Add to knowledge" / the document status under each attachment of `view`'s Files panel,
 * and "My knowledge" in its head. `view` is the ChatView ({sessionId, filesPanel, toast});
 * the attachment links carry `data-artifact-id`.
 */
export async function mountKnowledgeUploads(view) {
  const panel = view.filesPanel;
  if (!panel) return;
  const drawn = panel.firstChild; // the panel's head: tells whether the panel was redrawn meanwhile
  let info;
  try {
    info = await request('GET', `sessions/${enc(view.sessionId)}/knowledge-uploads/`);
  } catch {
    return; // the Files panel works without it
  }
  if (!drawn || !drawn.isConnected || panel.firstChild !== drawn) return;
  const head = panel.querySelector('.files-head');
  if (head && (info.user_uploads || info.knowledge_base) && !head.querySelector('[data-testid="open-my-knowledge"]')) {
    const open = h('button', { type: 'button', class: 'btn btn-ghost kn-open', testid: 'open-my-knowledge', text: 'My knowledge' });
    open.addEventListener('click', () => {
      dialog = dialog || new MyKnowledge();
      dialog.open(view);
    });
    head.insertBefore(open, head.lastChild);
  }
  for (const item of info.attachments || []) {
    const link = panel.querySelector(`[data-testid="file-artifact"][data-artifact-id="${CSS.escape(String(item.artifact_id))}"]`);
    const li = link && link.closest('li');
    if (!li || li.querySelector('.kn-row')) continue;
    const slot = h('div', { class: 'kn-row', testid: 'knowledge-row', dataset: { artifactId: String(item.artifact_id) } });
    const retry = info.user_uploads ? (b) => add(view, slot, item.artifact_id, b) : null;
    if (item.document) {
      follow(slot, item.document, retry);
    } else if (info.user_uploads && item.supported) {
      const button = h('button', {
        type: 'button',
        class: 'link-btn',
        testid: 'add-to-knowledge',
        text: 'Add to knowledge',
        'aria-label': `Add ${item.name} to your knowledge`,
      });
      button.addEventListener('click', () => add(view, slot, item.artifact_id, button));
      slot.append(button);
    } else {
      continue;
    }
    li.append(slot);
  }
}

let dialog = null;

/** The "My knowledge" dialog: the user's own documents (from their chats), status, Delete. */
class MyKnowledge {
  constructor() {
    this.view = null;
    this.title = h('h2', { id: 'my-knowledge-title', text: 'My knowledge' });
    this.intro = h('p', {
      class: 'muted',
      text: 'Files you added from your chats. Agents that allow it search them when you ask; nobody else sees them.',
    });
    this.message = h('p', { class: 'devices-message', testid: 'my-knowledge-message', role: 'status', 'aria-live': 'polite' });
    this.list = h('ul', { class: 'devices-list kn-list', testid: 'my-knowledge-list' });
    const close = h('button', { type: 'button', class: 'btn btn-ghost', testid: 'my-knowledge-close', text: 'Close' });
    close.addEventListener('click', () => this.el.close());
    this.el = h(
      'dialog',
      { class: 'devices-dialog kn-dialog', testid: 'my-knowledge', 'aria-labelledby': 'my-knowledge-title' },
      this.title,
      this.intro,
      this.message,
      this.list,
      h('div', { class: 'devices-foot' }, close),
    );
  }

  /** Open the dialog from `view` (the ChatView whose Files panel it was opened from). */
  open(view) {
    this.view = view;
    this.message.textContent = '';
    if (!this.el.isConnected) document.body.append(this.el);
    if (!this.el.open) this.el.showModal();
    this.refresh();
  }

  async refresh() {
    let docs = [];
    try {
      const info = await request('GET', `sessions/${enc(this.view.sessionId)}/knowledge-uploads/`);
      if (info.knowledge_base) {
        let page = await request('GET', `knowledge-bases/${enc(info.knowledge_base)}/documents/`);
        docs = [...(page.results || [])];
        for (let i = 1; page.next && i < PAGE_LIMIT; i += 1) {
          page = await request('GET', page.next);
          docs.push(...(page.results || []));
        }
      }
    } catch (err) {
      this.message.textContent = err.message || 'Could not load your knowledge.';
      return;
    }
    if (!docs.length) {
      replaceChildren(this.list, h('li', { class: 'muted', testid: 'my-knowledge-empty', text: 'Nothing added yet. Use “Add to knowledge” on a file in a chat.' }));
      return;
    }
    replaceChildren(this.list, docs.map((d) => this.item(d)));
  }

  item(doc) {
    const status = h('span', { class: `kn-status kn-${doc.status}`, testid: 'my-knowledge-status' });
    const remove = h('button', { type: 'button', class: 'link-btn', testid: 'my-knowledge-delete', text: 'Delete' });
    const row = h(
      'li',
      { class: 'device kn-item', testid: 'my-knowledge-item', dataset: { id: String(doc.id) } },
      h('span', { class: 'kn-title', text: doc.title || doc.source, title: `${doc.source} · added ${fullTime(doc.created_at)}` }),
      ' · ',
      status,
      remove,
    );
    follow(status, doc, null);
    remove.addEventListener('click', () => {
      if (remove.dataset.confirm !== 'yes') {
        remove.dataset.confirm = 'yes';
        remove.textContent = 'Delete? Click again';
        remove.setAttribute('aria-label', `Confirm: delete "${doc.title || doc.source}" from your knowledge`);
        return;
      }
      this.delete(doc, row);
    });
    return row;
  }

  async delete(doc, row) {
    try {
      await request('DELETE', docPath(doc));
    } catch (err) {
      if (err.status !== 404) {
        this.message.textContent = err.message || 'Could not delete it.';
        return;
      }
    }
    row.remove();
    this.message.textContent = `Deleted “${doc.title || doc.source}” from your knowledge.`;
    if (this.view.filesOpen && !this.view.destroyed) this.view.loadFiles(); // its attachment may be added again
    if (!this.list.querySelector('[data-testid="my-knowledge-item"]')) this.refresh();
  }
}
