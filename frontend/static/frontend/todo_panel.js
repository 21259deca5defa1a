// The agent's plan beside the conversation (todo_updated frames, the session's todos):
// attached only while there are todos.

import { h, replaceChildren, attach } from './dom.js';

const TODO_ICONS = { completed: '✓', in_progress: '◐', cancelled: '✕', pending: '○' };

export class TodoPanel {
  constructor() {
    this.count = h('span', { class: 'todo-count' });
    this.list = h('ol', { class: 'todo-list' });
    this.el = h(
      'aside',
      { class: 'todo-panel', testid: 'todo-panel', 'aria-label': 'Agent plan' },
      h(
        'details',
        { open: true },
        h('summary', {}, h('span', { class: 'todo-title', text: 'Plan' }), this.count),
        this.list,
      ),
    );
  }

  /** Render into `parent`; the panel is detached while there are no todos. */
  update(todos, parent) {
    const items = Array.isArray(todos) ? todos : [];
    attach(parent, this.el, items.length > 0, null);
    const done = items.filter((t) => t.status === 'completed').length;
    this.count.textContent = `${done}/${items.length}`;
    replaceChildren(
      this.list,
      items.map((todo) => {
        const status = todo.status || 'pending';
        return h(
          'li',
          { class: `todo todo-${status}`, dataset: { status } },
          h('span', { class: 'todo-icon', 'aria-hidden': 'true', text: TODO_ICONS[status] || '○' }),
          h('span', { class: 'todo-content', text: todo.content || '' }),
          todo.priority
            ? h('span', { class: `todo-priority prio-${todo.priority}`, text: todo.priority })
            : null,
          h('span', { class: 'visually-hidden', text: ` (${status.replace('_', ' ')})` }),
        );
      }),
    );
  }
}
