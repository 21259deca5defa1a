// Small DOM helpers shared by the views.
//
// Everything that ends up on screen is built with createElement/textContent:
// nothing in this app assigns innerHTML, so text coming from users or models
// can never be interpreted as markup.

// Attributes that must be set as DOM properties rather than attributes.
const PROPS = new Set(['value', 'checked', 'disabled', 'hidden', 'open', 'selected']);

/**
 * Create an element.
 *   h('button', {class: 'btn', testid: 'logout', onclick: fn}, 'Log out')
 * props: `class`, `text`, `testid` (-> data-testid), `dataset` (object),
 * `on<event>` (listener), DOM properties listed in PROPS, anything else is an
 * attribute (true -> empty attribute, null/false/undefined -> skipped).
 * Children: nodes, strings (text nodes), arrays (flattened), null (skipped).
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === null || value === undefined || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key === 'text') el.textContent = value;
      else if (key === 'testid') el.dataset.testid = value;
      else if (key === 'dataset') Object.assign(el.dataset, value);
      else if (key.startsWith('on') && typeof value === 'function') {
        el.addEventListener(key.slice(2), value);
      } else if (PROPS.has(key)) el[key] = value;
      else el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children (same rules as h()). */
export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Replace all children of `el`. */
export function replaceChildren(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A small inline spinner (purely decorative). */
export function spinner() {
  return h('span', { class: 'spinner', 'aria-hidden': 'true' });
}

const timeFmt = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });
const dateFmt = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric' });
const fullFmt = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });

/** "14:05" for today, "Mar 3" otherwise; '' for missing/invalid dates. */
export function shortTime(iso) {
  const d = iso ? new Date(iso) : null;
  if (!d || Number.isNaN(d.getTime())) return '';
  const now = new Date();
  return d.toDateString() === now.toDateString() ? timeFmt.format(d) : dateFmt.format(d);
}

/** A full, human readable timestamp (for title tooltips). */
export function fullTime(iso) {
  const d = iso ? new Date(iso) : null;
  if (!d || Number.isNaN(d.getTime())) return '';
  return fullFmt.format(d);
}

/** "850 ms", "2.4 s". */
export function formatDuration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms)) return '';
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
}

/** "512 chars", "3.2k chars". */
export function formatSize(chars) {
  return chars < 1000 ? `${chars} chars` : `${(chars / 1000).toFixed(1)}k chars`;
}

/** Insert `node` into `parent` (before `before`) when `show`, else detach it. */
export function attach(parent, node, show, before) {
  if (show && node.parentNode !== parent) parent.insertBefore(node, before);
  else if (!show && node.parentNode) node.remove();
}

/** "512 B", "1.2 kB", "3.4 MB". */
export function formatBytes(n) {
  if (n < 1000) return `${n} B`;
  if (n < 1e6) return `${(n / 1000).toFixed(1)} kB`;
  return `${(n / 1e6).toFixed(1)} MB`;
}
