// Live session events over a WebSocket, with dedupe and reconnect.
//
// Frames are JSON objects {seq, type, session_id, run_id, data, ts}. `seq`
// increases within a session. The socket remembers the highest seq applied
// and:
//   - drops any frame whose seq is <= that value (replays after a reconnect
//     may overlap frames already seen);
//   - reconnects with exponential backoff (0.5 s doubling up to 5 s) and asks
//     the server to replay what was missed with ?after_seq=<last seq>.
// The session cookie authenticates the handshake, so the URL carries no token.

const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 5000;
// A connection must stay up this long before the backoff resets, so a server
// that accepts then immediately drops us is not hammered every 500 ms.
const STABLE_AFTER_MS = 3000;
const PING_INTERVAL_MS = 25000;

/** Base URL for WebSockets: ws(s)://<this origin><wsBase>, or wsBase if absolute. */
function socketBase(wsBase) {
  const base = (wsBase || '/ws').replace(/\/+$/, '');
  if (/^wss?:\/\//i.test(base)) return base;
  return window.location.origin.replace(/^http/, 'ws') + base;
}

export class SessionSocket {
  /**
   * @param {string|number} sessionId
   * @param {object} opts
   * @param {string} [opts.wsBase] e.g. "/ws"
   * @param {(frame: object) => void} opts.onFrame called once per new frame, in order
   * @param {(status: 'connecting'|'open'|'reconnecting'|'closed') => void} [opts.onStatus]
   * @param {() => void} [opts.onReconnect] called when a connection opens after a drop
   * @param {(info: {code: number, opened: boolean}) => boolean|void} [opts.onClose]
   *   called on every unexpected close (e.g. to notice an auth close code);
   *   returning false stops reconnecting
   * @param {number} [opts.afterSeq] start after this seq (default 0: full replay)
   */
  constructor(sessionId, { wsBase, onFrame, onStatus, onReconnect, onClose, afterSeq = 0 } = {}) {
    this.sessionId = String(sessionId);
    this.base = socketBase(wsBase);
    this.onFrame = onFrame || (() => {});
    this.onStatus = onStatus || (() => {});
    this.onReconnect = onReconnect || (() => {});
    this.onClose = onClose || (() => {});
    this.lastSeq = afterSeq;
    this.ws = null;
    this.stopped = true;
    this.attempt = 0;
    this.everOpened = false;
    this.retryTimer = null;
    this.stableTimer = null;
    this.status = 'closed';
    this._onOnline = () => this.reconnectNow();
    this._onVisible = () => {
      if (document.visibilityState === 'visible') this.reconnectNow();
    };
  }

  get url() {
    return `${this.base}/sessions/${encodeURIComponent(this.sessionId)}/?after_seq=${this.lastSeq}`;
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    window.addEventListener('online', this._onOnline);
    document.addEventListener('visibilitychange', this._onVisible);
    this._connect();
  }

  /** Close for good (navigating away). No further callbacks are made. */
  stop() {
    this.stopped = true;
    window.removeEventListener('online', this._onOnline);
    document.removeEventListener('visibilitychange', this._onVisible);
    clearTimeout(this.retryTimer);
    clearTimeout(this.stableTimer);
    clearInterval(this.pingTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
      try {
        ws.close(1000, 'bye');
      } catch {
        /* already closing */
      }
    }
    this._setStatus('closed');
  }

  /** Skip the remaining backoff delay if we are waiting to reconnect. */
  reconnectNow() {
    if (this.stopped || this.ws) return;
    clearTimeout(this.retryTimer);
    this._connect();
  }

  _setStatus(status) {
    if (this.status === status) return;
    this.status = status;
    try {
      this.onStatus(status);
    } catch (err) {
      console.error(err);
    }
  }

  _connect() {
    this.retryTimer = null;
    this._setStatus(this.everOpened || this.attempt > 0 ? 'reconnecting' : 'connecting');
    let ws;
    try {
      ws = new WebSocket(this.url);
    } catch (err) {
      console.error('WebSocket failed to start', err);
      this._scheduleRetry();
      return;
    }
    this.ws = ws;

    ws.onopen = () => {
      const isReconnect = this.everOpened;
      this.everOpened = true;
      this._setStatus('open');
      this.stableTimer = setTimeout(() => {
        this.attempt = 0;
      }, STABLE_AFTER_MS);
      // Application-level ping so proxies do not close an idle socket
      // (the server answers {"type": "pong"}, which is ignored).
      clearInterval(this.pingTimer);
      this.pingTimer = setInterval(() => {
        if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'ping' }));
      }, PING_INTERVAL_MS);
      if (isReconnect) {
        try {
          this.onReconnect();
        } catch (err) {
          console.error(err);
        }
      }
    };

    ws.onmessage = (event) => {
      let payload;
      try {
        payload = JSON.parse(event.data);
      } catch {
        return; // not JSON: ignore
      }
      // Accept a single frame or a batch (array) of frames.
      for (const frame of Array.isArray(payload) ? payload : [payload]) this._handle(frame);
    };

    // An error is always followed by a close event: reconnect from there.
    ws.onerror = () => {};

    let opened = false;
    ws.addEventListener('open', () => {
      opened = true;
    });
    ws.onclose = (event) => {
      clearTimeout(this.stableTimer);
      if (this.ws !== ws) return;
      this.ws = null;
      clearInterval(this.pingTimer);
      if (this.stopped) return;
      let retry = true;
      try {
        retry = this.onClose({ code: event.code, opened }) !== false;
      } catch (err) {
        console.error(err);
      }
      if (retry) {
        this._scheduleRetry();
      } else {
        this.stopped = true;
        this._setStatus('closed');
      }
    };
  }

  _scheduleRetry() {
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** this.attempt);
    this.attempt += 1;
    this._setStatus('reconnecting');
    // A little jitter so many tabs do not reconnect in lockstep.
    const jittered = Math.min(BACKOFF_MAX_MS, delay * (0.85 + Math.random() * 0.3));
    this.retryTimer = setTimeout(() => this._connect(), jittered);
  }

  _handle(frame) {
    if (!frame || typeof frame !== 'object' || typeof frame.type !== 'string') return;
    if (frame.session_id != null && String(frame.session_id) !== this.sessionId) return;
    const seq = Number(frame.seq);
    if (frame.seq != null && Number.isFinite(seq)) {
      if (seq <= this.lastSeq) return; // duplicate or replayed frame: already applied
      this.lastSeq = seq;
    }
    try {
      this.onFrame(frame);
    } catch (err) {
      // A rendering bug must not kill the stream.
      console.error('Failed to apply frame', frame, err);
    }
  }
}
