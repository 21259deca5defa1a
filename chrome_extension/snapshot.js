// The page-side half of the browser tools: ONE script, used by both backends.
//
// - The Chrome extension injects it into the tab's isolated world
//   (chrome.scripting.executeScript({files: ["snapshot.js"]})).
// - The server-side Playwright backend injects the same file (page.add_script_tag /
//   page.evaluate of its text) into the page.
//
// It defines `globalThis.__apBrowser.run(op, params)` (async, returns a JSON-able object):
//   ok:    {ok: true, result: {...}}
//   error: {ok: false, error: {code, message}}
//
// Refs. Every line of a snapshot names an element `[ref=e12]`. The ref is stamped on the
// element (a WeakMap element -> ref, and a Map ref -> WeakRef(element)) together with the
// generation (snapshot number) that last listed it. Ref numbers never repeat in a tab: the
// caller passes `ref_start` (the backend keeps the tab's counter) so a ref of a previous
// document cannot name an element of the next one. An action on a ref whose element is gone
// (detached, re-rendered, other document) fails with code `stale_ref`: never a silent no-op.
//
// Budget: `max_chars` bounds the snapshot text (the server converts its token budget with
// llm.tokens' 4 characters per token). Elements in the viewport come first, then the
// other visible ones, in document order; hidden elements are left out.
(() => {
  'use strict';
  const VERSION = 1;
  if (globalThis.__apBrowser && globalThis.__apBrowser.version === VERSION) return;

  const state = {
    generation: 0,
    nextRef: 1,
    refs: new Map(), // "e12" -> {el: WeakRef, gen, role, name}
    elRefs: new WeakMap(), // element -> "e12"
    lastLines: null, // lines of the last snapshot/diff, for "what changed"
  };

  const LANDMARK_TAGS = {
    MAIN: 'main', NAV: 'navigation', HEADER: 'banner', FOOTER: 'contentinfo', ASIDE: 'complementary',
    FORM: 'form', DIALOG: 'dialog', H1: 'heading', H2: 'heading', H3: 'heading', H4: 'heading',
    H5: 'heading', H6: 'heading', TABLE: 'table',
  };
  const INTERACTIVE_ROLES = new Set([
    'button', 'link', 'textbox', 'searchbox', 'checkbox', 'radio', 'combobox', 'listbox', 'option',
    'menuitem', 'menuitemcheckbox', 'menuitemradio', 'tab', 'switch', 'slider', 'spinbutton',
    'treeitem', 'gridcell',
  ]);
  const LANDMARK_ROLES = new Set([
    'main', 'navigation', 'banner', 'contentinfo', 'complementary', 'form', 'dialog', 'alertdialog',
    'heading', 'region', 'search', 'alert', 'status', 'table',
  ]);
  const SELECTOR = [
    'a[href]', 'button', 'input:not([type=hidden])', 'select', 'textarea', 'summary',
    '[role]', '[contenteditable=""]', '[contenteditable=true]', '[onclick]', '[tabindex]:not([tabindex="-1"])',
    'main', 'nav', 'header', 'footer', 'aside', 'form', 'dialog', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'table',
  ].join(',');

  const clip = (s, n) => {
    s = (s || '').replace(/\s+/g, ' ').trim();
    return s.length > n ? s.slice(0, n - 1) + '…' : s;
  };
  const quote = (s) => JSON.stringify(s);

  function roleOf(el) {
    const explicit = (el.getAttribute('role') || '').trim().split(/\s+/)[0];
    if (explicit) return explicit;
    const tag = el.tagName;
    if (tag === 'A') return 'link';
    if (tag === 'BUTTON' || tag === 'SUMMARY') return 'button';
    if (tag === 'SELECT') return el.multiple || el.size > 1 ? 'listbox' : 'combobox';
    if (tag === 'TEXTAREA') return 'textbox';
    if (tag === 'INPUT') {
      const type = (el.getAttribute('type') || 'text').toLowerCase();
      if (['button', 'submit', 'reset', 'image'].includes(type)) return 'button';
      if (type === 'checkbox') return 'checkbox';
      if (type === 'radio') return 'radio';
      if (type === 'range') return 'slider';
      if (type === 'number') return 'spinbutton';
      if (type === 'search') return 'searchbox';
      return 'textbox';
    }
    if (tag === 'HEADER' && el.closest('main,article,section,aside,nav')) return '';
    if (tag === 'FOOTER' && el.closest('main,article,section,aside,nav')) return '';
    if (LANDMARK_TAGS[tag]) return LANDMARK_TAGS[tag];
    if (el.isContentEditable) return 'textbox';
    if (el.hasAttribute('onclick') || el.hasAttribute('tabindex')) return 'button';
    return '';
  }

  /** A label's own text: without the text of controls inside it (a select's options...). */
  function labelText(label) {
    let out = '';
    const walk = (node) => {
      for (const child of node.childNodes) {
        if (child.nodeType === Node.TEXT_NODE) out += child.textContent;
        else if (child.nodeType === Node.ELEMENT_NODE && !['SELECT', 'TEXTAREA', 'INPUT', 'BUTTON'].includes(child.tagName)) walk(child);
      }
    };
    walk(label);
    return out;
  }

  function nameOf(el, role) {
    const aria = el.getAttribute('aria-label');
    if (aria && aria.trim()) return clip(aria, 80);
    const labelledby = el.getAttribute('aria-labelledby');
    if (labelledby) {
      const text = labelledby.split(/\s+/).map((id) => document.getElementById(id)?.textContent || '').join(' ');
      if (text.trim()) return clip(text, 80);
    }
    if (el.labels && el.labels.length) {
      const text = Array.from(el.labels).map(labelText).join(' ');
      if (text.trim()) return clip(text, 80);
    }
    if (el.tagName === 'INPUT' && ['button', 'submit', 'reset'].includes((el.type || '').toLowerCase())) {
      return clip(el.value || el.type, 80);
    }
    if (el.tagName === 'IMG' || el.tagName === 'INPUT') {
      const alt = el.getAttribute('alt');
      if (alt) return clip(alt, 80);
    }
    const placeholder = el.getAttribute('placeholder');
    if (placeholder && (role === 'textbox' || role === 'searchbox' || role === 'combobox')) return clip(placeholder, 80);
    if (['main', 'navigation', 'banner', 'contentinfo', 'complementary', 'form', 'region', 'search', 'table'].includes(role)) {
      return clip(el.getAttribute('title') || el.getAttribute('name') || '', 80);
    }
    if (role === 'textbox' || role === 'searchbox' || role === 'combobox' || role === 'listbox') {
      return clip(el.getAttribute('title') || el.getAttribute('name') || '', 80);
    }
    const text = el.innerText !== undefined ? el.innerText : el.textContent;
    return clip(text || el.getAttribute('title') || '', 80);
  }

  function visibility(el) {
    const rect = el.getBoundingClientRect();
    if (rect.width === 0 && rect.height === 0 && el.tagName !== 'OPTION') return null;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || style.display === 'none') return null;
    if (el.closest('[hidden],[aria-hidden="true"]')) return null;
    const inView = rect.bottom > 0 && rect.right > 0 && rect.top < innerHeight && rect.left < innerWidth;
    return { inView };
  }

  function refFor(el, role, name) {
    let ref = state.elRefs.get(el);
    if (!ref) {
      ref = `e${state.nextRef++}`;
      state.elRefs.set(el, ref);
    }
    state.refs.set(ref, { el: new WeakRef(el), gen: state.generation, role, name });
    return ref;
  }

  function describe(el, role, name) {
    const parts = [role];
    if (name) parts.push(quote(name));
    if (role === 'heading') parts.push(`level=${el.tagName.match(/^H(\d)$/)?.[1] || el.getAttribute('aria-level') || ''}`);
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') {
      const type = (el.getAttribute('type') || '').toLowerCase();
      if (type === 'password') parts.push('type=password');
      if (type === 'checkbox' || type === 'radio') {
        if (el.checked) parts.push('checked');
      } else if (!['button', 'submit', 'reset', 'image'].includes(type) && el.value) {
        parts.push(type === 'password' ? 'value=•••' : `value=${quote(clip(el.value, 60))}`);
      }
      if (el.required) parts.push('required');
    }
    if (el.tagName === 'SELECT') {
      const opts = Array.from(el.options);
      const selected = opts.filter((o) => o.selected).map((o) => clip(o.label || o.value, 30));
      if (selected.length) parts.push(`value=${quote(selected.join(', '))}`);
      const shown = opts.slice(0, 8).map((o) => clip(o.label || o.value, 30));
      parts.push(`options=${JSON.stringify(shown)}${opts.length > 8 ? `+${opts.length - 8}` : ''}`);
    }
    if (el.tagName === 'A') {
      const href = el.getAttribute('href') || '';
      if (href && !href.startsWith('javascript:')) parts.push(`href=${quote(clip(href, 60))}`);
    }
    if (el.disabled || el.getAttribute('aria-disabled') === 'true') parts.push('disabled');
    if (el.getAttribute('aria-expanded')) parts.push(`expanded=${el.getAttribute('aria-expanded')}`);
    return parts.join(' ');
  }

  /** Lines for every visible interactive/landmark element: in-viewport ones first. */
  function collect() {
    state.generation += 1;
    const first = [];
    const rest = [];
    for (const el of document.querySelectorAll(SELECTOR)) {
      const role = roleOf(el);
      if (!role || !(INTERACTIVE_ROLES.has(role) || LANDMARK_ROLES.has(role))) continue;
      const vis = visibility(el);
      if (!vis) continue;
      const name = nameOf(el, role);
      if (LANDMARK_ROLES.has(role) && role !== 'heading' && role !== 'form' && role !== 'dialog' && !name && role !== 'main') {
        // unnamed generic landmarks add little; keep main/form/dialog
        if (!['navigation', 'search'].includes(role)) continue;
      }
      const ref = refFor(el, role, name);
      (vis.inView ? first : rest).push(`[ref=${ref}] ${describe(el, role, name)}`);
    }
    return { lines: first.concat(rest), inView: first.length };
  }

  function snapshot(params) {
    if (Number.isInteger(params.ref_start) && params.ref_start > state.nextRef) state.nextRef = params.ref_start;
    const maxChars = Math.max(200, Number(params.max_chars) || 8000);
    const { lines, inView } = collect();
    state.lastLines = lines;
    const out = [];
    let used = 0;
    let shown = 0;
    for (const line of lines) {
      if (used + line.length + 1 > maxChars) break;
      out.push(line);
      used += line.length + 1;
      shown += 1;
    }
    if (shown < lines.length) {
      out.push(`[… ${lines.length - shown} more elements not shown: raise max_tokens, or scroll and snapshot again]`);
    }
    if (!lines.length) out.push('(no interactive elements visible)');
    return {
      url: location.href, title: document.title, text: out.join('\n'), elements: lines.length, shown,
      in_viewport: inView, next_ref: state.nextRef, generation: state.generation,
    };
  }

  class OpError extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }

  function resolve(ref) {
    if (typeof ref !== 'string' || !/^e\d+$/.test(ref)) {
      throw new OpError('invalid_arguments', `${JSON.stringify(ref)} is not a ref; refs look like "e12" and come from browser_snapshot.`);
    }
    const entry = state.refs.get(ref);
    const el = entry && entry.el.deref();
    if (!entry || !el || !el.isConnected) {
      throw new OpError('stale_ref',
        `Ref ${ref} is stale: its element is gone (the page changed or navigated since the snapshot that listed it). ` +
        'Take a new browser_snapshot and use its refs.');
    }
    const role = roleOf(el);
    if (role !== entry.role) {
      throw new OpError('stale_ref',
        `Ref ${ref} is stale: the element changed (was ${entry.role}, now ${role || 'not interactive'}). Take a new browser_snapshot.`);
    }
    return el;
  }

  function diff() {
    const before = state.lastLines;
    const { lines } = collect();
    state.lastLines = lines;
    if (!before) return { added: lines.slice(0, 10), removed: [], added_count: lines.length, removed_count: 0 };
    const prev = new Set(before);
    const now = new Set(lines);
    const added = lines.filter((l) => !prev.has(l));
    const removed = before.filter((l) => !now.has(l));
    return { added: added.slice(0, 10), removed: removed.slice(0, 10), added_count: added.length, removed_count: removed.length };
  }

  function passwordForm(el) {
    const form = el.form || el.closest('form');
    if (!form) return null;
    const pw = Array.from(form.querySelectorAll('input[type=password]')).find((p) => p.value);
    return pw ? form : null;
  }

  function needsApproval(message, params) {
    if (!params.approved) throw new OpError('approval_required', `${message} on ${location.origin}`);
  }

  // Navigation detection without fixed delays: watch the submit/click events our action
  // dispatches and read `defaultPrevented` once every listener ran.
  function watchNavigation() {
    let navigating = false;
    const seen = [];
    const onEvent = (event) => seen.push(event);
    window.addEventListener('submit', onEvent, true);
    window.addEventListener('click', onEvent, true);
    const onUnload = () => { navigating = true; };
    window.addEventListener('beforeunload', onUnload);
    return () => {
      window.removeEventListener('submit', onEvent, true);
      window.removeEventListener('click', onEvent, true);
      window.removeEventListener('beforeunload', onUnload);
      for (const event of seen) {
        if (event.defaultPrevented) continue;
        if (event.type === 'submit') {
          const form = event.target;
          if (form && !(form.getAttribute('target') || '').startsWith('_blank')) navigating = true;
        } else {
          const a = event.target instanceof Element ? event.target.closest('a[href]') : null;
          if (a && !a.target && a.getAttribute('href') && !a.getAttribute('href').startsWith('#')
              && !a.getAttribute('href').startsWith('javascript:')) navigating = true;
          const submit = event.target instanceof Element
            ? event.target.closest('button:not([type=button]):not([type=reset]), input[type=submit], input[type=image]') : null;
          if (submit && submit.form && !submit.form.hasAttribute('onsubmit') && seen.every((e) => e.type !== 'submit')) {
            // the submit event below decides; nothing here
          }
        }
      }
      return navigating;
    };
  }

  const settle = () => new Promise((r) => setTimeout(r, 0)).then(() => new Promise((r) => setTimeout(r, 0)));

  function setValue(el, value) {
    const proto = el.tagName === 'TEXTAREA' ? HTMLTextAreaElement.prototype
      : el.tagName === 'SELECT' ? HTMLSelectElement.prototype : HTMLInputElement.prototype;
    const setter = Object.getOwnPropertyDescriptor(proto, 'value')?.set;
    if (setter) setter.call(el, value); else el.value = value;
  }

  async function act(fn) {
    const stop = watchNavigation();
    let navigating = false;
    try {
      await fn();
    } finally {
      await settle();
      navigating = stop();
    }
    const result = { url: location.href, title: document.title, navigating };
    if (!navigating) result.diff = diff();
    return result;
  }

  function keyEvent(el, key, type) {
    const init = { key, code: key.length === 1 ? `Key${key.toUpperCase()}` : key, bubbles: true, cancelable: true, composed: true };
    return el.dispatchEvent(new KeyboardEvent(type, init));
  }

  const ops = {
    snapshot,

    async click(params) {
      const el = resolve(params.ref);
      const form = el.closest('button, input[type=submit], input[type=image]') ? passwordForm(el) : null;
      if (form) needsApproval('Submitting a form that contains a password', params);
      el.scrollIntoView({ block: 'center', inline: 'center' });
      return act(() => {
        if (typeof el.focus === 'function') el.focus({ preventScroll: true });
        el.click();
      });
    },

    async type(params) {
      const el = resolve(params.ref);
      const text = String(params.text ?? '');
      const isPassword = el.tagName === 'INPUT' && (el.type || '').toLowerCase() === 'password';
      if (isPassword) needsApproval('Typing into a password field', params);
      if (params.submit && !isPassword && (el.form || el.closest('form'))) {
        const form = el.form || el.closest('form');
        if (form.querySelector('input[type=password]')) needsApproval('Submitting a form that contains a password', params);
      }
      if (!(el.tagName === 'INPUT' || el.tagName === 'TEXTAREA' || el.isContentEditable)) {
        throw new OpError('not_editable', `Ref ${params.ref} is a ${roleOf(el)}, not a text field; pick a textbox ref from the snapshot.`);
      }
      if (el.disabled || el.readOnly) throw new OpError('not_editable', `Ref ${params.ref} is disabled or read-only.`);
      el.scrollIntoView({ block: 'center' });
      return act(() => {
        el.focus({ preventScroll: true });
        if (el.isContentEditable) {
          el.textContent = text;
          el.dispatchEvent(new InputEvent('input', { bubbles: true, data: text, inputType: 'insertText' }));
        } else {
          setValue(el, text);
          el.dispatchEvent(new InputEvent('input', { bubbles: true, data: text, inputType: 'insertText' }));
          el.dispatchEvent(new Event('change', { bubbles: true }));
        }
        if (params.submit) {
          const allowed = keyEvent(el, 'Enter', 'keydown');
          keyEvent(el, 'Enter', 'keyup');
          const form = el.form || el.closest('form');
          if (allowed && form) form.requestSubmit();
        }
      });
    },

    async select(params) {
      const el = resolve(params.ref);
      if (el.tagName !== 'SELECT') throw new OpError('not_selectable', `Ref ${params.ref} is a ${roleOf(el)}, not a select box.`);
      const wanted = (params.values || []).map(String);
      const matched = [];
      return act(() => {
        for (const option of el.options) {
          const hit = wanted.includes(option.value) || wanted.includes(option.label) || wanted.includes(option.text.trim());
          option.selected = hit && (el.multiple || matched.length === 0);
          if (option.selected) matched.push(option.value);
        }
        if (!matched.length) {
          throw new OpError('no_such_option',
            `None of ${JSON.stringify(wanted)} is an option of ${params.ref}; options: ${JSON.stringify(Array.from(el.options).map((o) => o.label).slice(0, 20))}.`);
        }
        el.dispatchEvent(new Event('input', { bubbles: true }));
        el.dispatchEvent(new Event('change', { bubbles: true }));
      });
    },

    async press(params) {
      const keys = String(params.keys || '');
      const target = document.activeElement || document.body;
      if (/(^|\s|\+)Enter($|\s)/.test(keys) && target.form && passwordForm(target)) {
        needsApproval('Submitting a form that contains a password', params); // before any key event
      }
      return act(() => {
        for (const combo of keys.split(/\s+/).filter(Boolean)) {
          const key = combo.split('+').pop();
          const allowed = keyEvent(target, key, 'keydown');
          if (key.length === 1 && allowed && (target.tagName === 'INPUT' || target.tagName === 'TEXTAREA')) {
            setValue(target, target.value + key);
            target.dispatchEvent(new InputEvent('input', { bubbles: true, data: key, inputType: 'insertText' }));
          }
          keyEvent(target, key, 'keyup');
          if (key === 'Enter' && allowed && target.form) target.form.requestSubmit();
          if (key === 'Tab') {
            const focusable = Array.from(document.querySelectorAll('a[href],button,input,select,textarea,[tabindex]'))
              .filter((e) => !e.disabled && e.tabIndex >= 0);
            const i = focusable.indexOf(target);
            focusable[(i + 1) % focusable.length]?.focus();
          }
        }
      });
    },

    async scroll(params) {
      const direction = params.direction || 'down';
      return act(() => {
        if (params.ref && params.ref !== 'page') {
          resolve(params.ref).scrollIntoView({ block: 'center' });
          return;
        }
        const dy = { down: 0.8, up: -0.8 }[direction] || 0;
        const dx = { right: 0.8, left: -0.8 }[direction] || 0;
        window.scrollBy(dx * innerWidth, dy * innerHeight);
      });
    },

    async wait_for(params) {
      const timeoutMs = Math.max(0, Math.min(Number(params.timeout_ms) || 5000, 60000));
      const started = performance.now();
      const has = (t) => (document.body?.innerText || '').includes(t);
      if (params.seconds !== undefined && params.seconds !== null && !params.text && !params.text_gone) {
        await new Promise((r) => setTimeout(r, Math.min(Number(params.seconds) * 1000, timeoutMs)));
        return { url: location.href, title: document.title, waited_ms: Math.round(performance.now() - started), diff: diff() };
      }
      for (;;) {
        const done = (params.text ? has(params.text) : true) && (params.text_gone ? !has(params.text_gone) : true);
        if (done) return { url: location.href, title: document.title, waited_ms: Math.round(performance.now() - started), diff: diff() };
        if (performance.now() - started > timeoutMs) {
          throw new OpError('timeout', params.text
            ? `The text ${JSON.stringify(params.text)} did not appear within ${timeoutMs} ms.`
            : `The text ${JSON.stringify(params.text_gone)} was still there after ${timeoutMs} ms.`);
        }
        await new Promise((r) => setTimeout(r, 50));
      }
    },

    async get_text(params) {
      const maxChars = Math.max(1, Math.min(Number(params.max_chars) || 4000, 100000));
      const el = params.ref && params.ref !== 'page' ? resolve(params.ref) : document.body;
      const text = ((el && (el.innerText ?? el.textContent)) || '').replace(/\n{3,}/g, '\n\n').trim();
      return {
        url: location.href, title: document.title, text: text.slice(0, maxChars),
        truncated: text.length > maxChars, total_chars: text.length,
      };
    },

    async info() {
      return { url: location.href, title: document.title, ready_state: document.readyState };
    },
  };

  async function run(op, params) {
    const fn = ops[op];
    if (!fn) return { ok: false, error: { code: 'unknown_op', message: `Unknown page operation ${JSON.stringify(op)}.` } };
    try {
      return { ok: true, result: await fn(params || {}) };
    } catch (err) {
      if (err instanceof OpError) return { ok: false, error: { code: err.code, message: err.message } };
      return { ok: false, error: { code: 'page_error', message: `${err && err.name}: ${err && err.message}` } };
    }
  }

  globalThis.__apBrowser = { version: VERSION, run, ops: Object.keys(ops) };
})();
