// REST client for /api/v1.
//
// - Cookie session auth: every request is sent with credentials 'same-origin'.
// - Unsafe methods carry the Django CSRF token (X-CSRFToken) read from the
//   `csrftoken` cookie at request time (Django rotates it on login).
// - Non-2xx answers become an ApiError carrying the server's `message`
//   (error body shape: {"message": "...", "extra": {...}}).

const SAFE_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);

let apiBase = '/api/v1';

/** Set the API prefix (from the page's app-config). */
export function configureApi({ api_base: base } = {}) {
  if (typeof base === 'string' && base) apiBase = base.replace(/\/+$/, '');
}

export class ApiError extends Error {
  /**
   * @param {number} status HTTP status, 0 for network failures
   * @param {string} message human readable message
   * @param {object} [extra] the error body's `extra`
   */
  constructor(status, message, extra = {}) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.extra = extra || {};
  }

  /** True for "not logged in" answers. */
  get isAuth() {
    return this.status === 401 || this.status === 403;
  }
}

export function getCookie(name) {
  for (const part of document.cookie ? document.cookie.split(';') : []) {
    const [key, ...rest] = part.trim().split('=');
    if (key === name) return decodeURIComponent(rest.join('='));
  }
  return '';
}

/**
 * Resolve a path relative to the API base ("sessions/") or a URL given by the
 * server (pagination `next`). Cross-origin URLs are reduced to their path so
 * credentials never leave this origin.
 */
function resolve(pathOrUrl) {
  if (/^https?:\/\//i.test(pathOrUrl) || pathOrUrl.startsWith('/')) {
    const url = new URL(pathOrUrl, window.location.href);
    return url.origin === window.location.origin ? url.href : url.pathname + url.search;
  }
  return `${apiBase}/${pathOrUrl}`;
}

/** Pick a readable message out of an error body (ours, or DRF's defaults). */
function messageFrom(body, status) {
  if (body && typeof body === 'object') {
    const fields = body.extra && typeof body.extra === 'object' ? body.extra.fields : null;
    if (typeof body.message === 'string' && body.message) {
      // Validation errors: {"message": "Validation error.", "extra": {"fields": {name: [msg]}}}
      const first = fields && typeof fields === 'object' ? Object.entries(fields)[0] : null;
      if (first) {
        const detail = Array.isArray(first[1]) ? first[1][0] : first[1];
        if (typeof detail === 'string' && detail) {
          return `${body.message} ${first[0] === 'non_field_errors' ? '' : `${first[0]}: `}${detail}`;
        }
      }
      return body.message;
    }
    if (typeof body.detail === 'string' && body.detail) return body.detail;
    if (Array.isArray(body.non_field_errors) && body.non_field_errors.length) {
      return String(body.non_field_errors[0]);
    }
  }
  if (status >= 500) return `The server had a problem (HTTP ${status}). Please try again.`;
  return `Request failed (HTTP ${status}).`;
}

/**
 * Perform a request and return the parsed JSON body (null for empty bodies).
 * Throws ApiError on network failure or non-2xx status.
 */
export async function request(method, path, body, { signal } = {}) {
  method = method.toUpperCase();
  const headers = { Accept: 'application/json' };
  const init = { method, headers, credentials: 'same-origin', signal };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  if (!SAFE_METHODS.has(method)) {
    const token = getCookie('csrftoken');
    if (token) headers['X-CSRFToken'] = token;
  }

  let response;
  try {
    response = await fetch(resolve(path), init);
  } catch (err) {
    if (err && err.name === 'AbortError') throw err;
    throw new ApiError(0, 'Network error: the server could not be reached.');
  }

  let data = null;
  const text = response.status === 204 ? '' : await response.text().catch(() => '');
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null; // HTML error page or similar: fall back to a generic message
    }
  }
  if (!response.ok) {
    throw new ApiError(response.status, messageFrom(data, response.status), data && data.extra);
  }
  return data;
}

/** POST multipart form data (attachments); same errors as request(). */
async function upload(path, formData) {
  const headers = { Accept: 'application/json' };
  const token = getCookie('csrftoken');
  if (token) headers['X-CSRFToken'] = token;
  let response;
  try {
    response = await fetch(resolve(path), { method: 'POST', headers, body: formData, credentials: 'same-origin' });
  } catch {
    throw new ApiError(0, 'Network error: the server could not be reached.');
  }
  const text = await response.text().catch(() => '');
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 413 && !(data && data.message)) {
      throw new ApiError(413, 'The file is too large.', data && data.extra);
    }
    throw new ApiError(response.status, messageFrom(data, response.status), data && data.extra);
  }
  return data;
}

const get = (path, opts) => request('GET', path, undefined, opts);
const post = (path, body, opts) => request('POST', path, body ?? {}, opts);

/** Normalise a list answer: paginated {results, next} or a bare array. */
function asPage(data) {
  if (Array.isArray(data)) return { results: data, next: null, count: data.length };
  return {
    results: Array.isArray(data?.results) ? data.results : [],
    next: data?.next || null,
    count: data?.count ?? null,
  };
}

/** Fetch every page of a list endpoint (bounded, for small lists like agents). */
async function getAll(path, maxPages = 20) {
  const all = [];
  let next = path;
  for (let i = 0; next && i < maxPages; i += 1) {
    const page = asPage(await get(next));
    all.push(...page.results);
    next = page.next;
  }
  return all;
}

const enc = encodeURIComponent;

export const api = {
  me: () => get('auth/me/'),
  /** The caller's tenants, default (last picked) first: [{id, name, slug, role, default}]. */
  tenants: () => get('auth/tenants/'),
  /** Make `slug` the caller's default tenant (where they land; what the app shows). */
  pickTenant: (slug) => post('auth/tenant/', { tenant: slug }),
  login: (username, password) => post('auth/login/', { username, password }),
  logout: () => post('auth/logout/'),
  listAgents: () => getAll('agents/'),
  /** One page of sessions; pass the previous page's `next` to continue, or a search `q`. */
  listSessions: async (next, { q = '', activity = '' } = {}) => {
    if (next) return asPage(await get(next));
    const params = new URLSearchParams();
    if (q) params.set('q', q);
    if (activity) params.set('activity', activity);
    const query = params.toString();
    return asPage(await get(`sessions/${query ? `?${query}` : ''}`));
  },
  renameSession: (id, title) => request('PATCH', `sessions/${enc(id)}/`, { title }),
  deleteSession: (id) => request('DELETE', `sessions/${enc(id)}/`),
  restoreSession: (id) => post(`sessions/${enc(id)}/restore/`),
  cancelRun: (id) => post(`runs/${enc(id)}/cancel/`),
  editRun: (id, content) => post(`runs/${enc(id)}/edit/`, { content }),
  retryRun: (id) => post(`runs/${enc(id)}/retry/`),
  regenerate: (sessionId) => post(`sessions/${enc(sessionId)}/regenerate/`),
  continueChat: (sessionId) => post(`sessions/${enc(sessionId)}/continue/`),
  /** Upload files (File objects) as attachments: [{id, name, mime_type, size_bytes, reference}]. */
  uploadAttachments: (sessionId, files) => {
    const form = new FormData();
    for (const file of files) form.append('file', file, file.name || 'pasted-file');
    return upload(`sessions/${enc(sessionId)}/attachments/`, form);
  },
  listArtifacts: (sessionId) => get(`sessions/${enc(sessionId)}/artifacts/`),
  listDocuments: async (sessionId) => asPage(await get(`documents/?session=${enc(sessionId)}`)).results,
  getDocument: (id) => get(`documents/${enc(id)}/`),
  usageMe: () => get('usage/me/'),
  createSession: (agentId) => post('sessions/', { agent: agentId }),
  getSession: (id, opts) => get(`sessions/${enc(id)}/`, opts),
  sendMessage: (id, content, resources) =>
    post(`sessions/${enc(id)}/messages/`, resources && resources.length ? { content, resources } : { content }),
  listResources: (agentId, q) => get(`agents/${enc(agentId)}/resources/?q=${encodeURIComponent(q || '')}`),
  /** MCP resources pinned to a chat: {results: [{id, server, binding, uri, bound}]}; pin {binding, uri}; unpin. */
  listPinnedResources: (sessionId) => get(`sessions/${enc(sessionId)}/pinned-resources/`),
  pinResource: (sessionId, body) => post(`sessions/${enc(sessionId)}/pinned-resources/`, body),
  unpinResource: (sessionId, pinId) => request('DELETE', `sessions/${enc(sessionId)}/pinned-resources/${enc(pinId)}/`),
  /** Decide an approval: {decision: 'approve'|'deny', reason} or, for a question, {answer}. */
  decideApproval: (id, body) => post(`approvals/${enc(id)}/`, body),
};
