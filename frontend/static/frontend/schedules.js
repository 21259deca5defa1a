// "Scheduled" in the chat app (kept out of chat.js, which only hooks in): a button in the chat
// header opens the signed-in user's schedules of this chat's agent
// (GET /api/v1/schedules/?agent=<id>&mine=true): each with its cron, time zone, message and next
// run; Pause / Resume (PATCH {paused}), Delete (after an inline confirmation), and a form to add
// one (POST {agent, cron, timezone, message, chat_mode: new | fixed, chat}). The API's 400
// message is shown as it is (a bad cron or time zone). docs/user-guide.md, "Scheduled".

import { request } from './api.js';
import { fullTime, h, replaceChildren } from './dom.js';

function browserZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
  } catch {
    return 'UTC';
  }
}

/** The "Scheduled" dialog for one agent (and the chat it was opened from). */
export class SchedulesPanel {
  constructor() {
    this.agent = null;
    this.sessionId = null;
    this.title = h('h2', { text: 'Scheduled', id: 'schedules-title' });
    this.intro = h('p', { class: 'muted', testid: 'schedules-intro' });
    this.message = h('p', { class: 'devices-message', testid: 'schedules-message', role: 'status', 'aria-live': 'polite' });
    this.list = h('ul', { class: 'devices-list', testid: 'schedules-list' });
    this.cron = h('input', { type: 'text', id: 'schedule-cron', testid: 'schedule-cron', value: '0 8 * * 1-5', required: '' });
    this.zone = h('input', { type: 'text', id: 'schedule-zone', testid: 'schedule-zone', value: browserZone(), required: '' });
    this.text = h('textarea', { id: 'schedule-message', testid: 'schedule-message', rows: '2', required: '' });
    this.sameChat = h('input', { type: 'checkbox', id: 'schedule-same-chat', testid: 'schedule-same-chat' });
    const add = h('button', { type: 'submit', class: 'btn btn-primary', testid: 'schedule-add', text: 'Add schedule' });
    this.form = h(
      'form',
      { class: 'schedule-form', testid: 'schedule-form' },
      h('h3', { text: 'New schedule' }),
      h('p', {}, h('label', { for: 'schedule-message', text: 'Message to send' }), h('br'), this.text),
      h('p', {},
        h('label', { for: 'schedule-cron', text: 'When (cron: minute hour day month weekday) ' }), this.cron, ' ',
        h('label', { for: 'schedule-zone', text: 'Time zone ' }), this.zone),
      h('p', {}, this.sameChat, ' ', h('label', { for: 'schedule-same-chat', text: 'Post into this chat (otherwise a new chat each time)' })),
      add,
    );
    this.form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.create();
    });
    const close = h('button', { type: 'button', class: 'btn btn-ghost', text: 'Close', testid: 'schedules-close' });
    close.addEventListener('click', () => this.el.close());
    this.el = h(
      'dialog',
      { class: 'devices-dialog schedules-dialog', testid: 'schedules-panel', 'aria-labelledby': 'schedules-title' },
      this.title, this.intro, this.message, this.list, this.form,
      h('div', { class: 'devices-foot' }, close),
    );
  }

  /** Open the dialog for `agent` ({id, name}) from the chat `sessionId`. */
  open(agent, sessionId) {
    this.agent = agent;
    this.sessionId = sessionId;
    this.message.textContent = '';
    this.intro.textContent = `Messages ${agent.name || 'this agent'} gets from you on a schedule; each one starts a run as if you had sent it.`;
    if (!this.el.isConnected) document.body.append(this.el);
    if (!this.el.open) this.el.showModal();
    this.refresh();
  }

  async refresh() {
    let page;
    try {
      page = await request('GET', `schedules/?agent=${encodeURIComponent(this.agent.id)}&mine=true`);
    } catch (err) {
      this.message.textContent = err.message || 'Could not load the schedules.';
      return;
    }
    const schedules = page.results || [];
    if (!schedules.length) {
      replaceChildren(this.list, h('li', { class: 'muted', testid: 'schedules-empty', text: 'Nothing scheduled yet.' }));
      return;
    }
    replaceChildren(this.list, schedules.map((s) => this.item(s)));
  }

  item(schedule) {
    const next = schedule.paused ? 'paused' : schedule.next_runs.length ? `next ${fullTime(schedule.next_runs[0])}` : 'no next run';
    const toggle = h('button', { type: 'button', class: 'link-btn', testid: 'schedule-toggle', text: schedule.paused ? 'Resume' : 'Pause' });
    toggle.addEventListener('click', () => this.patch(schedule, { paused: !schedule.paused }));
    const remove = h('button', { type: 'button', class: 'link-btn', testid: 'schedule-delete', text: 'Delete' });
    remove.addEventListener('click', () => {
      if (remove.dataset.confirm !== 'yes') {
        remove.dataset.confirm = 'yes';
        remove.textContent = 'Delete? Click again';
        return;
      }
      this.remove(schedule);
    });
    return h(
      'li',
      { class: 'device schedule-item', testid: 'schedule-item', dataset: { id: String(schedule.id) } },
      h('span', { class: 'schedule-text', text: schedule.message }),
      h('span', { class: 'muted', testid: 'schedule-when', text: ` · ${schedule.cron} (${schedule.timezone}) · ${next}` }),
      ' ', toggle, ' ', remove,
    );
  }

  async create() {
    const body = {
      agent: this.agent.id, cron: this.cron.value.trim(), timezone: this.zone.value.trim(), message: this.text.value.trim(),
      chat_mode: this.sameChat.checked ? 'fixed' : 'new',
    };
    if (this.sameChat.checked) body.chat = this.sessionId;
    try {
      await request('POST', 'schedules/', body);
    } catch (err) {
      this.message.textContent = err.message || 'Could not add the schedule.';
      return;
    }
    this.text.value = '';
    this.message.textContent = 'Scheduled.';
    this.refresh();
  }

  async patch(schedule, fields) {
    try {
      await request('PATCH', `schedules/${encodeURIComponent(schedule.id)}/`, fields);
      this.message.textContent = fields.paused ? 'Paused.' : 'Resumed.';
    } catch (err) {
      this.message.textContent = err.message || 'Could not change the schedule.';
    }
    this.refresh();
  }

  async remove(schedule) {
    try {
      await request('DELETE', `schedules/${encodeURIComponent(schedule.id)}/`);
      this.message.textContent = 'Deleted.';
    } catch (err) {
      if (err.status !== 404) this.message.textContent = err.message || 'Could not delete the schedule.';
    }
    this.refresh();
  }
}

let panel = null;

/**
 * Put the "Scheduled" button in a chat view's header (idempotent; chat.js calls it whenever
 * the session is (re)loaded). `view.el` holds the header; `session` is the API's session
 * ({id, agent: {id, name}}).
 */
export function mountSchedulesButton(view, session) {
  const header = view.el && view.el.querySelector('.chat-header');
  if (!header || !session || !session.agent || session.agent.id === undefined) return;
  let button = header.querySelector('[data-testid="open-schedules"]');
  if (!button) {
    button = h('button', { type: 'button', class: 'btn btn-ghost schedules-toggle', testid: 'open-schedules', text: 'Scheduled' });
    button.addEventListener('click', () => {
      panel = panel || new SchedulesPanel();
      panel.open(button.scheduleAgent, button.scheduleSession);
    });
    header.append(button);
  }
  button.scheduleAgent = { id: session.agent.id, name: session.agent.name };
  button.scheduleSession = session.id;
}
