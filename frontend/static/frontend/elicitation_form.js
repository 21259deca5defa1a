// An MCP server's request for input (elicitation) inside an approval card: a form built from the
// requested schema (the MCP spec's primitive types: string with format email / uri / date /
// date-time, number, integer, boolean, single-select enums as `enum` or `oneOf` const, and
// multi-select arrays of enums; defaults and required fields), or, in URL mode, the full URL with
// its domain highlighted that opens only on a click. Accept / Decline / Cancel answer it.

import { h } from './dom.js';

const INPUT_TYPES = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' };

/** The choices of an enum property: [{value, label}] (`enum` + `enumNames`, or `oneOf`/`anyOf` const). */
function choicesOf(spec) {
  if (Array.isArray(spec.enum)) {
    return spec.enum.map((value, i) => ({ value, label: (spec.enumNames || [])[i] || String(value) }));
  }
  const options = spec.oneOf || spec.anyOf;
  if (Array.isArray(options)) return options.map((o) => ({ value: o.const, label: o.title || String(o.const) }));
  return null;
}

/** One field: its label, control and a read() that returns [present, value]. */
function field(name, spec, required) {
  const id = `elicit-${name}-${Math.random().toString(36).slice(2, 8)}`;
  const title = `${spec.title || name}${required ? ' *' : ''}`;
  const hint = spec.description ? h('div', { class: 'elicit-hint', text: spec.description }) : null;
  const choices = spec.type === 'array' ? choicesOf(spec.items || {}) : choicesOf(spec);
  let control;
  let read;
  if (spec.type === 'array' && choices) {
    const defaults = new Set(Array.isArray(spec.default) ? spec.default : []);
    const boxes = choices.map((c) => {
      const box = h('input', { type: 'checkbox', value: String(c.value), testid: `elicit-${name}-${c.value}` });
      box.checked = defaults.has(c.value);
      return [c.value, h('label', { class: 'elicit-choice' }, box, ` ${c.label}`), box];
    });
    control = h('fieldset', { class: 'elicit-choices', id }, h('legend', { text: title }), ...boxes.map((b) => b[1]));
    read = () => [true, boxes.filter((b) => b[2].checked).map((b) => b[0])];
    return { el: h('div', { class: 'elicit-field' }, control, hint), read };
  }
  if (choices) {
    control = h('select', { id, name, testid: `elicit-${name}` });
    if (!required) control.append(h('option', { value: '', text: '—' }));
    choices.forEach((c, i) => control.append(h('option', { value: String(i), text: c.label })));
    const chosen = choices.findIndex((c) => c.value === spec.default);
    control.value = chosen >= 0 ? String(chosen) : required ? '0' : '';
    read = () => (control.value === '' ? [false] : [true, choices[Number(control.value)].value]);
  } else if (spec.type === 'boolean') {
    control = h('input', { id, name, type: 'checkbox', testid: `elicit-${name}` });
    control.checked = spec.default === true;
    read = () => [true, control.checked];
  } else if (spec.type === 'number' || spec.type === 'integer') {
    control = h('input', { id, name, type: 'number', testid: `elicit-${name}`, step: spec.type === 'integer' ? '1' : 'any' });
    if (spec.minimum !== undefined) control.min = String(spec.minimum);
    if (spec.maximum !== undefined) control.max = String(spec.maximum);
    if (spec.default !== undefined) control.value = String(spec.default);
    read = () => (control.value === '' ? [false] : [true, Number(control.value)]);
  } else {
    control = h('input', { id, name, type: INPUT_TYPES[spec.format] || 'text', testid: `elicit-${name}` });
    if (spec.maxLength !== undefined) control.maxLength = spec.maxLength;
    if (spec.default !== undefined) control.value = String(spec.default);
    read = () => {
      if (control.value === '') return [false];
      // datetime-local has no zone: send it as UTC-less ISO text, which date-time accepts.
      return [true, spec.format === 'date-time' && control.value.length === 16 ? `${control.value}:00` : control.value];
    };
  }
  if (required) control.required = true;
  const label = h('label', { for: id, text: title });
  return { el: h('div', { class: 'elicit-field' }, label, control, hint), read };
}

/** The form of a form-mode elicitation: {el, values()} (values: only the fields filled in). */
export function elicitationForm(schema) {
  const properties = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const fields = Object.entries(properties).map(([name, spec]) => [name, field(name, spec || {}, required.has(name))]);
  const el = h('div', { class: 'elicit-form', testid: 'elicit-form' }, ...fields.map(([, f]) => f.el));
  const values = () => {
    const content = {};
    for (const [name, f] of fields) {
      const [present, value] = f.read();
      if (present) content[name] = value;
    }
    return content;
  };
  return { el, values };
}

/** A URL-mode elicitation: the whole URL, its domain highlighted, opened only by a click. */
export function elicitationLink(url) {
  let parsed = null;
  try {
    parsed = new URL(url);
  } catch {
    parsed = null;
  }
  if (!parsed || !['http:', 'https:'].includes(parsed.protocol)) {
    return h('div', { class: 'elicit-url', testid: 'elicit-url', text: url });
  }
  const host = parsed.host;
  const at = url.indexOf(host);
  const parts = at >= 0
    ? [url.slice(0, at), h('strong', { class: 'elicit-domain', testid: 'elicit-domain', text: host }), url.slice(at + host.length)]
    : [url];
  // rel=noopener noreferrer: the page cannot reach back into the chat.
  return h('a', { class: 'elicit-url', testid: 'elicit-url', href: parsed.href, target: '_blank', rel: 'noopener noreferrer' }, ...parts);
}
