// The chat's live connection: the session's event stream (SessionSocket: dedupe, replay,
// reconnect), what a close means (4404: the chat is gone; 4401/4403 or handshakes failing
// again and again: the login probably expired), the "Live / Reconnecting…" label in the header,
// and a watchdog that asks for the canonical session when a run is active but the stream is down
// or silent, so the composer never stays locked if frames go missing.

import { h } from './dom.js';
import { SessionSocket } from './ws.js';

const CONNECTION_LABELS = {
  connecting: 'Connecting…',
  open: 'Live',
  reconnecting: 'Reconnecting…',
  closed: '',
};

const WATCHDOG_MS = 5000;

export class ChatConnection {
  /**
   * @param {object} opts
   * @param {string} opts.sessionId
   * @param {string} opts.wsBase
   * @param {(frame: object) => void} opts.onFrame each new frame, in order
   * @param {() => void} opts.onReconnect a connection opened after a drop (re-fetch the session)
   * @param {() => void} opts.onAuthLost the stream keeps being refused (the app checks the login)
   * @param {() => {active: boolean, lastFrameAt: number, lastFetchAt: number}} opts.activity
   *   whether a run is active, and when the last frame and the last session fetch were (ms)
   * @param {() => void} opts.onStalled a run is active but nothing arrives: re-fetch now
   */
  constructor({ sessionId, wsBase, onFrame, onReconnect, onAuthLost, activity, onStalled }) {
    this.sessionId = sessionId;
    this.wsBase = wsBase;
    this.onFrame = onFrame;
    this.onReconnect = onReconnect;
    this.onAuthLost = onAuthLost;
    this.activity = activity;
    this.onStalled = onStalled;
    this.socket = null;
    this.failures = 0;
    this.authChecked = false;
    this.stopped = false;
    this.el = h('span', { class: 'conn', role: 'status', hidden: true }); // the header's label
  }

  /** Open the stream (from seq 0: a full replay, which the idempotent merge absorbs). */
  start() {
    this.socket = new SessionSocket(this.sessionId, {
      wsBase: this.wsBase,
      onFrame: (frame) => this.onFrame(frame),
      onStatus: (status) => this.showStatus(status),
      onReconnect: () => this.onReconnect(),
      onClose: (info) => this.closed(info),
    });
    this.socket.start();
    this.watchdog = setInterval(() => this.checkStalled(), WATCHDOG_MS);
  }

  stop() {
    this.stopped = true;
    if (this.socket) this.socket.stop();
    clearInterval(this.watchdog);
  }

  /** An unexpected close: false stops reconnecting. */
  closed({ code, opened }) {
    // 4404: the session is gone or not ours; retrying cannot help.
    if (code === 4404) return false;
    // 4401 (not authenticated), or handshakes failing again and again: the login probably
    // expired; let the app check (it moves to the login screen if so). Keep retrying meanwhile.
    if (code === 4401 || code === 4403) this.failures += 3;
    else this.failures = opened ? 0 : this.failures + 1;
    if (this.failures >= 3 && !this.authChecked) {
      this.authChecked = true;
      this.onAuthLost();
    }
    return true;
  }

  showStatus(status) {
    let label = CONNECTION_LABELS[status] ?? '';
    if (status === 'closed' && !this.stopped) label = 'Disconnected';
    this.el.hidden = !label;
    this.el.textContent = label;
    this.el.className = `conn conn-${status}`;
  }

  /** While a run is active, re-fetch when the socket is down (8 s) or silent (30 s). */
  checkStalled() {
    const { active, lastFrameAt, lastFetchAt } = this.activity();
    if (this.stopped || !active) return;
    const now = Date.now();
    const socketDown = !this.socket || this.socket.status !== 'open';
    const quiet = now - lastFrameAt > 30000;
    const sinceFetch = now - lastFetchAt;
    if ((socketDown && sinceFetch > 8000) || (quiet && sinceFetch > 30000)) this.onStalled();
  }
}
