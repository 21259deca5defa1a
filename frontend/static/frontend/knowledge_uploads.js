// "Add to knowledge" in the chat app (kept out of chat.js, which only hooks in):
// - mountKnowledgeUploads(view): called by ChatView.loadFiles once the Files panel is drawn.
//   It asks GET /api/v1/sessions/<id>/knowledge-uploads/ whether the chat's agent allows
//   adding attachments to the user's own knowledge (the agent's knowledge binding has
//   `user_uploads`) and which attachments are in it already; under each attachment it puts
//   "Add to knowledge" (POST …/artifacts/<id>/add-to-knowledge/) or the document's status:
//   queued → parsing → embedding (with progress) → ready, or failed with the reason.
// - Status updates come as `document_status_changed` events on the chat's own event stream
//   (chat.js hands them to applyDocumentStatus): the server publishes each status change of a
//   document to the chat it was added from, and the stream replays what a reconnect missed.
//   GET /api/v1/knowledge-bases/<kb>/documents/<id>/ is polled only as a fallback: while the
//   chat's stream is not open, and for documents added from another chat (their events go
//   there), e.g. in "My knowledge".
// - "My knowledge" in the Files panel's head opens a dialog with the user's own documents
//   (GET /api/v1/knowledge-bases/<kb>/documents/), their status, and Delete (after an inline
//   confirmation; DELETE …/documents/<id>/).

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

const POLL_MS = 1500; // how often a document being ingested is asked for its status (fallback only)
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

// document id → {seq, data} of its latest `document_status_changed` frame, and the status lines
// following it (callbacks taking the frame's data).
const latest = new Map();
const watchers = new Map();

/** A `document_status_changed` frame from the chat's stream (chat.js's applyFrame hands it here). */
export function applyDocumentStatus(frame) {
  const data = frame.data || {};
  const key = String(data.document_id);
  const seen = latest.get(key);
  if (seen && seen.seq >= frame.seq) return;
  latest.set(key, { seq: frame.seq, data });
  for (const watch of [...(watches(key))]) watch(data);
}

function watches(key) {
  if (!watchers.has(key)) watchers.set(key, new Set());
  return watchers.get(key);
}

/** The document API's shape from an event's data (the fields statusText and the slot use). */
function fromEvent(doc, data) {
  return {
    ...doc,
    id: data.document_id,
    knowledge_base: data.knowledge_base_id,
    title: data.title,
    status: data.status,
    status_reason: data.status_reason,
    chunk_count: data.chunk_count,
    embedded_count: data.embedded_count,
    progress: data.progress,
  };
}

/** The chat's event stream is open and carries `doc`'s events (it was added from this chat). */
function streamed(view, doc) {
  return Boolean(view && view.socket && view.socket.status === 'open' && String(doc.chat_session_id) === String(view.sessionId));
}

/** The chat stream's last seq now: frames after it are news to a document fetched from now on. */
const seqNow = (view) => (view && view.socket ? view.socket.lastSeq || 0 : 0);

/**
 * Show `doc`'s status in `slot` (a status line under an attachment) and follow it until it
 * ends: from the chat's events (those newer than `sinceSeq`, the stream's seq when `doc` was
 * fetched), polling the API while they cannot come (see the head of this file).
 */
function follow(slot, doc, retry, view, sinceSeq = 0) {
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
  const key = String(doc.id);
  const seen = latest.get(key);
  if (seen && seen.seq > sinceSeq) doc = fromEvent(doc, seen.data);
  show(doc);
  if (FINAL.has(doc.status)) return;
  let done = false;
  const watch = (data) => {
    if (done) return;
    if (!slot.isConnected) {
      done = true;
      watches(key).delete(watch);
      return;
    }
    doc = fromEvent(doc, data);
    show(doc);
    if (FINAL.has(doc.status)) {
      done = true;
      watches(key).delete(watch);
    }
  };
  watches(key).add(watch);
  let polls = 0;
  const tick = async () => {
    if (done) return;
    if (!slot.isConnected) { // the panel was redrawn or closed: its new status line follows
      done = true;
      watches(key).delete(watch);
      return;
    }
    if (streamed(view, doc)) { // the events bring the status: no request
      setTimeout(tick, POLL_MS);
      return;
    }
    polls += 1;
    if (polls > POLL_LIMIT) {
      slot.lastChild.textContent = `${statusText(doc)} (reopen Files to refresh)`;
      return;
    }
    try {
      const fetched = await request('GET', docPath(doc));
      if (done) return; // an event ended it meanwhile
      doc = fetched;
    } catch (err) {
      if (err.status === 404) {
        done = true;
        watches(key).delete(watch);
        replaceChildren(slot, h('span', { class: 'kn-status', testid: 'knowledge-status', text: 'Removed from your knowledge' }));
        return;
      }
      // a network blip: keep asking
    }
    if (!slot.isConnected || done) return;
    show(doc);
    if (FINAL.has(doc.status)) {
      done = true;
      watches(key).delete(watch);
    } else {
      setTimeout(tick, POLL_MS);
    }
  };
  setTimeout(tick, POLL_MS);
}

/** Add artifact `artifactId` of the chat to the user's knowledge and follow its status in `slot`. */
async function add(view, slot, artifactId, button) {
  button.disabled = true;
  button.textContent = 'Adding…';
  const retry = (b) => add(view, slot, artifactId, b);
  const since = seqNow(view); // its events come after this: the add commits after the request is sent
  try {
    const doc = await request('POST', `sessions/${enc(view.sessionId)}/artifacts/${enc(artifactId)}/add-to-knowledge/`, {});
    follow(slot, doc, retry, view, since);
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
  const since = seqNow(view);
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
      follow(slot, item.document, retry, view, since);
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
    this.since = seqNow(this.view);
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
    follow(status, doc, null, this.view, this.since);
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
