// What an MCP tool's result holds besides text (issue 37), under its tool card: images the
// server returned (also as embedded resources) shown as pictures, other files (an embedded PDF,
// audio) offered as downloads, and resource links named. Read from the result's own lines, as
// capabilities/mcp/tool.py writes them for the model:
//   [image: artifact:12, image/png, 5321 bytes]
//   [resource doc://files/report.pdf: artifact:13, application/pdf, 24 bytes]
//   [resource link doc://notes/readme "Project readme" text/markdown]

import { h, replaceChildren, formatBytes } from './dom.js';

const STORED = /^\[(image|audio|resource (\S+)): artifact:(\d+), ([^,\s\]]+), (\d+) bytes\]$/;
const LINK = /^\[resource link (\S+)(?: "([^"\n]*)")?(?: (\S+))?\]$/;

/** The files and links of a tool result's text: [{kind: 'file', id, mime, size, uri} | {kind: 'link', uri, title}]. */
export function toolFiles(text) {
  const found = [];
  for (const line of String(text || '').split('\n')) {
    const stored = STORED.exec(line);
    if (stored) {
      found.push({ kind: 'file', id: stored[3], mime: stored[4], size: Number(stored[5]), uri: stored[2] || '', label: stored[1] });
      continue;
    }
    const link = LINK.exec(line);
    if (link) found.push({ kind: 'link', uri: link[1], title: link[2] || '', mime: link[3] || '' });
  }
  return found;
}

/** Fill `el` with the result's pictures, downloads and links (hidden when there are none). */
export function renderToolFiles(el, text) {
  const items = toolFiles(text);
  el.hidden = !items.length;
  replaceChildren(el, items.map((item) => {
    if (item.kind === 'link') {
      const web = /^https?:\/\//i.test(item.uri);
      const name = item.title || item.uri;
      return h('li', { class: 'tool-file tool-link', testid: 'tool-resource-link', title: item.uri },
        web ? h('a', { href: item.uri, target: '_blank', rel: 'noopener noreferrer', text: name }) : h('span', { text: name }),
        item.title ? h('code', { class: 'tool-file-uri', text: item.uri }) : null);
    }
    const src = `/api/v1/artifacts/${encodeURIComponent(item.id)}/content`;
    const name = item.uri ? item.uri.replace(/\/+$/, '').split('/').pop() : `${item.label} ${item.id}`;
    if (item.mime.startsWith('image/')) {
      return h('li', { class: 'tool-file tool-image', testid: 'tool-image' },
        h('a', { href: src, target: '_blank', rel: 'noopener' }, h('img', { src, alt: `${name} (${item.mime})` })));
    }
    return h('li', { class: 'tool-file', testid: 'tool-download' },
      h('a', { href: src, download: name, text: `Download ${name}` }),
      h('span', { class: 'tool-file-meta', text: ` ${item.mime}, ${formatBytes(item.size)}` }));
  }));
}
