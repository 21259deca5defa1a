// The chat's Files panel: the documents doc_write wrote (opened in place) and the files
// attached to the chat; knowledge_uploads.js adds "Add to knowledge" under the attachments.

import { api } from './api.js';
import { h, replaceChildren, spinner, formatBytes } from './dom.js';
import { icon } from './icons.js';
import { mountKnowledgeUploads } from './knowledge_uploads.js'; // "Add to knowledge" on attachments, "My knowledge"
import { renderRichText } from './richtext.js';

export class FilesPanel {
  /**
   * @param {object} chat the ChatView: its sessionId and toast; handed to mountKnowledgeUploads
   */
  constructor(chat) {
    this.chat = chat;
    this.open = false;
    this.docView = null;
    this.toggle = h('button', {
      type: 'button',
      class: 'btn btn-ghost files-toggle',
      testid: 'files-toggle',
      'aria-expanded': 'false',
      'aria-controls': 'files-panel',
      text: 'Files',
    });
    this.toggle.addEventListener('click', () => (this.open ? this.hide() : this.show()));
    this.el = h('aside', { class: 'files-panel', id: 'files-panel', testid: 'files-panel', 'aria-label': 'Files of this chat', hidden: true });
  }

  /** Open the panel (and the document `documentId`, when given). */
  async show({ documentId = null } = {}) {
    this.open = true;
    this.el.hidden = false;
    this.toggle.setAttribute('aria-expanded', 'true');
    await this.load();
    if (documentId) await this.showDocument(documentId);
  }

  hide() {
    this.open = false;
    this.el.hidden = true;
    this.toggle.setAttribute('aria-expanded', 'false');
    this.toggle.focus();
  }

  /** Draw the panel from the API (again). */
  async load() {
    const close = h('button', { type: 'button', class: 'btn btn-ghost', 'aria-label': 'Close files', text: '×' });
    close.addEventListener('click', () => this.hide());
    const head = h('div', { class: 'files-head' }, h('h2', { class: 'files-title', text: 'Files' }), close);
    replaceChildren(this.el, head, h('div', { class: 'side-note' }, spinner(), ' Loading…'));
    let artifacts = [];
    let documents = [];
    try {
      [artifacts, documents] = await Promise.all([
        api.listArtifacts(this.chat.sessionId),
        api.listDocuments(this.chat.sessionId),
      ]);
    } catch (err) {
      replaceChildren(this.el, head, h('p', { class: 'side-note side-error', text: err.message || 'Could not load files.' }));
      return;
    }
    const docItems = documents.map((doc) => {
      const open = h('button', { type: 'button', class: 'file-item', testid: 'file-document', dataset: { documentId: String(doc.id) } },
        icon('doc'),
        h('span', { class: 'file-name', text: doc.title || `Document ${doc.id}` }),
        h('span', { class: 'file-meta', text: `v${doc.version}` }));
      open.addEventListener('click', () => this.showDocument(doc.id));
      return h('li', {}, open);
    });
    const artifactItems = artifacts.map((a) =>
      h('li', {}, h('a', {
        class: 'file-item',
        testid: 'file-artifact',
        dataset: { artifactId: String(a.id) },
        href: `/api/v1/artifacts/${encodeURIComponent(a.id)}/content`,
        target: '_blank',
        rel: 'noopener',
      },
      a.mime_type.startsWith('image/')
        ? h('img', { class: 'file-thumb', src: `/api/v1/artifacts/${encodeURIComponent(a.id)}/content`, alt: '' })
        : icon('file'),
      h('span', { class: 'file-name', text: a.name }),
      h('span', { class: 'file-meta', text: formatBytes(a.size_bytes) }))));
    this.docView = h('div', { class: 'doc-view', testid: 'document-view', hidden: true });
    replaceChildren(
      this.el,
      head,
      h('h3', { class: 'files-sub', text: 'Documents' }),
      docItems.length ? h('ul', { class: 'files' }, docItems) : h('p', { class: 'side-note', text: 'No documents yet.' }),
      h('h3', { class: 'files-sub', text: 'Files and attachments' }),
      artifactItems.length ? h('ul', { class: 'files' }, artifactItems) : h('p', { class: 'side-note', text: 'Nothing attached yet.' }),
      this.docView,
    );
    mountKnowledgeUploads(this.chat); // --- knowledge_uploads.js: "Add to knowledge" under attachments ---
  }

  async showDocument(id) {
    try {
      const doc = await api.getDocument(id);
      if (!this.docView) return;
      this.docView.hidden = false;
      replaceChildren(
        this.docView,
        h('h3', { class: 'doc-title', text: doc.title || `Document ${doc.id}` }),
        h('div', { class: 'bubble rich doc-body' }, renderRichText(doc.content || '')),
      );
      this.docView.scrollIntoView({ block: 'nearest' });
    } catch (err) {
      this.chat.toast(err.message || 'Could not open the document.', 'error');
    }
  }
}
