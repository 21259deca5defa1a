// The /ws/browser/ wire protocol, extension side. Twin of browser/protocol.py on the server:
// keep the two in step (same version, same frame shapes, same limits).
//
// extension -> server: hello {protocol_versions, extension_version, ops}, result {id, ok,
//   result | error{code, message}}, ping/pong {ts}
// server -> extension: welcome {protocol, server_version, device, user, tenant, ping_seconds},
//   command {id, op, params, deadline_ms, idempotency_key}, ping/pong, error {code, message}

export const PROTOCOL_VERSION = 1;
export const SUBPROTOCOL = 'agent-platform.browser.v1';
export const TOKEN_SUBPROTOCOL_PREFIX = 'token.';
export const MAX_FRAME_BYTES = 8 * 1024 * 1024;
export const OPS = ['tabs', 'navigate', 'snapshot', 'click', 'type', 'select', 'press', 'scroll', 'wait_for',
  'get_text', 'screenshot'];

export class ProtocolError extends Error {}

const isObject = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
const isStr = (v, max) => typeof v === 'string' && v.length > 0 && v.length <= max;

/** Parse and validate one frame from the server; throws ProtocolError. */
export function parseServerFrame(text) {
  if (typeof text !== 'string') throw new ProtocolError('binary frames are not part of the protocol');
  if (text.length > MAX_FRAME_BYTES) throw new ProtocolError(`frame of ${text.length} bytes is too big`);
  let frame;
  try {
    frame = JSON.parse(text);
  } catch (err) {
    throw new ProtocolError(`not JSON: ${err.message}`);
  }
  if (!isObject(frame)) throw new ProtocolError('a frame is a JSON object');
  switch (frame.type) {
    case 'welcome':
      if (frame.protocol !== PROTOCOL_VERSION) throw new ProtocolError(`server speaks protocol ${frame.protocol}`);
      if (!isObject(frame.device) || typeof frame.user !== 'string') throw new ProtocolError('welcome: bad shape');
      return frame;
    case 'command':
      if (!isStr(frame.id, 64)) throw new ProtocolError('command: id');
      if (!OPS.includes(frame.op)) throw new ProtocolError(`command: unknown op ${frame.op}`);
      if (!isObject(frame.params)) throw new ProtocolError('command: params must be an object');
      if (!Number.isInteger(frame.deadline_ms) || frame.deadline_ms < 1 || frame.deadline_ms > 300000) {
        throw new ProtocolError('command: deadline_ms');
      }
      if (!isStr(frame.idempotency_key, 128)) throw new ProtocolError('command: idempotency_key');
      return frame;
    case 'ping':
    case 'pong':
      return frame;
    case 'error':
      if (typeof frame.code !== 'string') throw new ProtocolError('error: code');
      return frame;
    default:
      throw new ProtocolError(`unknown frame type ${JSON.stringify(frame.type)}`);
  }
}

export const hello = (extensionVersion) => ({
  type: 'hello', protocol_versions: [PROTOCOL_VERSION], extension_version: extensionVersion, ops: OPS,
});
export const okResult = (id, result) => ({ type: 'result', id, ok: true, result });
export const errorResult = (id, code, message) => ({
  type: 'result', id, ok: false, error: { code: String(code).slice(0, 64), message: String(message).slice(0, 4000) },
});

// Origin rules: same as browser/origins.py. Entries are origins ("https://example.com") or
// host patterns ("*.example.com"); blocked wins; an empty allow-list allows all not blocked.
export function originOf(url) {
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.host}`.toLowerCase();
  } catch {
    return '';
  }
}

function matches(entry, url) {
  entry = entry.trim().toLowerCase().replace(/\/+$/, '');
  let host = '';
  try {
    host = new URL(url).hostname.toLowerCase();
  } catch {
    return false;
  }
  if (entry.startsWith('*.')) {
    const base = entry.slice(2);
    return host === base || host.endsWith(`.${base}`);
  }
  if (entry.includes('://')) return originOf(url) === originOf(entry);
  return host === entry;
}

export function originAllowed(url, policy) {
  if (!url || url === 'about:blank' || url.startsWith('chrome://newtab')) return true;
  const allowed = policy?.allowed_origins || [];
  const blocked = policy?.blocked_origins || [];
  if (blocked.some((b) => matches(b, url))) return false;
  return allowed.length === 0 || allowed.some((a) => matches(a, url));
}
