// "Details" on each answer of the chat app: the run's trace for its own user
// (GET /api/v1/runs/<id>/trace/, member fields only: no prompts, provider names or provider
// error text). A separate module: it watches the chat for run articles
// (article[data-testid="run"][data-run-id]) and adds a Details button next to the answer's
// Copy (or the error's actions); the trace opens in a modal dialog, built with textContent only.
// For the tenant's admins (GET admin/datasets/ answers them, 403 for members), a completed run's
// dialog ends with "Add to a dataset" (POST admin/datasets/<id>/items/from-run/, or a new
// dataset first): the evaluation datasets of docs/admin-guide.md.
import { request } from './api.js';

const STATUS_WORDS = {
  succeeded: 'answered', failed: 'failed', completed: 'completed', cancelled: 'stopped', running: 'running',
  queued: 'queued', awaiting_approval: 'waiting for approval', timed_out: 'timed out', pending: 'pending',
  approved: 'approved', denied: 'denied', answered: 'answered', expired: 'expired',
};

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else if (key === 'testid') node.dataset.testid = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

function ms(value) {
  if (value === null || value === undefined) return '—';
  return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(1)} s`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : '';
}

function words(status) {
  return STATUS_WORDS[status] || status;
}

/** Who decided an approval, as the run's user reads it: you, a reviewer, or its timeout. */
function approvalBy(approval) {
  if (approval.decided_on_timeout) return ' by its timeout';
  if (approval.decided_by_run_user) return ' by you';
  return approval.decided_at && approval.status !== 'expired' ? ' by a reviewer' : '';
}

let dialog = null;

function ensureDialog() {
  if (dialog) return dialog;
  const title = el('h2', { id: 'trace-dialog-title', text: 'How this answer was made' });
  const close = el('button', { type: 'button', class: 'btn trace-close', text: 'Close', testid: 'trace-close' });
  const body = el('div', { class: 'trace-body', testid: 'trace-dialog-body' });
  dialog = el('dialog', { class: 'trace-dialog', 'aria-labelledby': 'trace-dialog-title', testid: 'trace-dialog' },
    el('div', { class: 'trace-head' }, title, close), body);
  close.addEventListener('click', () => dialog.close());
  document.body.append(dialog);
  return dialog;
}

function renderTrace(trace) {
  const run = trace.run;
  const totals = trace.totals;
  const parts = [];
  parts.push(el('p', { class: 'trace-totals', testid: 'trace-totals',
    text: `${words(run.status)} · ${ms(run.duration_ms)} · ${run.loop_count} step${run.loop_count === 1 ? '' : 's'} · `
      + `${totals.tool_calls} tool call${totals.tool_calls === 1 ? '' : 's'} · `
      + `${totals.prompt_tokens + totals.completion_tokens} tokens · $${Number(totals.cost_usd).toFixed(4)}`
      + (totals.fallbacks ? ` · switched model ${totals.fallbacks}×` : '')
      + (totals.retries ? ` · retried ${totals.retries}×` : '') }));
  if (run.error) parts.push(el('p', { class: 'trace-error', text: run.error }));
  const list = el('ol', { class: 'trace-steps' });
  for (const turn of trace.turns) {
    const item = el('li', { class: 'trace-step', testid: 'trace-step' });
    item.append(el('h3', { text: `Step ${turn.turn + 1}` }));
    for (const c of turn.compactions) {
      item.append(el('p', { class: 'trace-line',
        text: `Summarised ${c.messages_summarized} earlier messages (${c.tokens_before} → ${c.tokens_after} tokens).` }));
    }
    // A compaction's model calls (purpose "compaction") wrote a summary, not this step's
    // answer: labelled "Compaction", never counted as the answer's tries.
    // An MCP server's sampling requests (purpose "sampling") used the agent's model for the
    // server, during a tool call: labelled "For a tool", not this step's answer either.
    const calls = [...(turn.compaction_calls || []), ...(turn.sampling_calls || []), ...turn.attempts];
    for (const a of calls) {
      const compaction = a.purpose === 'compaction';
      const label = (compaction ? 'Compaction, ' : a.purpose === 'sampling' ? 'For a tool\'s server, ' : '')
        + (a.is_fallback ? 'switched to ' : a.is_retry ? 'tried again: ' : compaction ? 'summary by ' : 'model ');
      const testid = compaction ? 'trace-compaction-call' : a.purpose === 'sampling' ? 'trace-sampling-call' : 'trace-attempt';
      item.append(el('p', { class: 'trace-line', testid,
        text: `${label[0].toUpperCase()}${label.slice(1)}${a.model}: `
          + `${compaction && a.status === 'succeeded' ? 'done' : words(a.status)} in ${ms(a.latency_ms)}`
          + (a.first_token_ms !== null ? `, first words after ${ms(a.first_token_ms)}` : '')
          + `, ${a.prompt_tokens} + ${a.completion_tokens} tokens`
          + (a.error ? `. ${a.error}` : '') }));
    }
    for (const t of turn.tool_calls) {
      const tool = el('details', { class: 'trace-tool', testid: 'trace-tool' },
        el('summary', { text: `Tool ${t.name}: ${words(t.status)}${t.duration_ms !== null ? ` in ${ms(t.duration_ms)}` : ''}` }),
        el('pre', { class: 'trace-pre', text: JSON.stringify(t.arguments, null, 2) }));
      if (t.result) tool.append(el('pre', { class: 'trace-pre', text: t.result.slice(0, 4000) }));
      if (t.error) tool.append(el('p', { class: 'trace-error', text: t.error }));
      // An MCP server's log messages during the call (at or above its binding's log_level).
      for (const entry of t.server_log || []) {
        const data = typeof entry.data === 'string' ? entry.data : JSON.stringify(entry.data);
        tool.append(el('p', { class: 'trace-line trace-server-log', testid: 'trace-server-log',
          text: `Server log ${entry.level}${entry.logger ? ` (${entry.logger})` : ''}: ${data.slice(0, 2000)}` }));
      }
      if (t.approval) {
        tool.append(el('p', { class: 'trace-line',
          text: `Approval ${words(t.approval.status)}${approvalBy(t.approval)}`
            + (t.approval.decided_at ? ` at ${when(t.approval.decided_at)}` : '')
            + (t.approval.answer && t.approval.status !== 'answered' ? `: “${t.approval.answer}”` : '') }));
      }
      item.append(tool);
    }
    list.append(item);
  }
  parts.push(list);
  return parts;
}

async function datasetsOrNull() {
  try {
    const page = await request('GET', 'admin/datasets/');
    return Array.isArray(page) ? page : page.results || [];
  } catch (err) {
    if (err.status === 403) return null; // a member: evaluation is for the tenant's admins
    throw err;
  }
}

async function addToDataset(runId, select, nameInput, status) {
  const name = nameInput.value.trim();
  status.textContent = 'Adding…';
  try {
    let datasetId = select.value;
    if (name) {
      const created = await request('POST', 'admin/datasets/', { name });
      datasetId = String(created.id);
      select.append(el('option', { value: datasetId, text: created.name }));
      select.value = datasetId;
      nameInput.value = '';
    }
    if (!datasetId) {
      status.textContent = 'Pick a dataset or name a new one.';
      return;
    }
    const item = await request('POST', `admin/datasets/${datasetId}/items/from-run/`, { run: Number(runId) });
    const label = select.selectedOptions[0]?.textContent || 'the dataset';
    status.textContent = `Added to “${label}” as item ${item.id}.`;
  } catch (err) {
    status.textContent = `Not added: ${err.message || err}`;
  }
}

async function datasetSection(runId) {
  const datasets = await datasetsOrNull();
  if (datasets === null) return null;
  const select = el('select', { id: 'trace-dataset', testid: 'trace-dataset' }, el('option', { value: '', text: '—' }));
  for (const d of datasets) select.append(el('option', { value: String(d.id), text: d.name }));
  const nameInput = el('input', { type: 'text', id: 'trace-dataset-new', maxlength: '200',
    placeholder: "or a new dataset's name", testid: 'trace-dataset-new' });
  const status = el('p', { class: 'trace-line', role: 'status', testid: 'trace-dataset-status' });
  const add = el('button', { type: 'button', class: 'btn', text: 'Add', testid: 'trace-dataset-add' });
  add.addEventListener('click', () => addToDataset(runId, select, nameInput, status));
  return el('section', { class: 'trace-dataset', testid: 'trace-add-to-dataset' },
    el('h3', { text: 'Add to a dataset' }),
    el('p', { class: 'trace-line', text: "For evaluation: this question becomes an item, this answer its reference." }),
    el('label', { for: 'trace-dataset', text: 'Dataset ' }), select, ' ',
    el('label', { for: 'trace-dataset-new', class: 'visually-hidden', text: "New dataset's name" }), nameInput, ' ',
    add, status);
}

async function openTrace(runId, opener) {
  const d = ensureDialog();
  const body = d.querySelector('.trace-body');
  body.textContent = 'Loading…';
  d.dataset.runId = runId;
  if (!d.open) d.showModal();
  d.addEventListener('close', () => opener.focus(), { once: true });
  try {
    const trace = await request('GET', `runs/${runId}/trace/`);
    body.textContent = '';
    body.append(...renderTrace(trace));
    if (trace.run.status === 'completed') {
      const section = await datasetSection(runId).catch(() => null);
      if (section && d.open && d.dataset.runId === runId) body.append(section);
    }
  } catch (err) {
    body.textContent = `The details could not be loaded: ${err.message || err}`;
  }
}

function decorate(article) {
  const runId = article.dataset.runId;
  if (!runId) return;
  const status = article.dataset.runStatus;
  if (status === 'queued' || status === 'running') return;
  const host = article.querySelector('.msg-actions [data-testid="copy-reply"]')?.parentElement
    || article.querySelector('.run-error-actions');
  if (!host || host.querySelector('.trace-details-btn')) return;
  const button = el('button', { type: 'button', class: 'msg-action trace-details-btn', testid: 'run-details',
    text: 'Details', 'aria-haspopup': 'dialog', title: 'How this answer was made: models, tools, timings' });
  button.addEventListener('click', () => openTrace(article.dataset.runId, button));
  host.append(button);
}

function scan() {
  document.querySelectorAll('article[data-testid="run"][data-run-id]').forEach(decorate);
}

let scheduled = false;
new MutationObserver(() => {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => { scheduled = false; scan(); });
}).observe(document.body, { childList: true, subtree: true, attributes: true, attributeFilter: ['data-run-status'] });
scan();
