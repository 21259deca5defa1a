// A chat's conversation state: one plain object per run, keyed by run id, fed from two sources:
//   - the REST session detail (canonical, fetched on open, after a run ends and after a
//     reconnect), merged with Conversation.mergeRuns();
//   - the session's event frames, applied with Conversation.applyFrame().
// Both merges are idempotent and never move a run or tool call "backwards" (e.g. a replayed
// run_running cannot undo a completed run), so the order in which REST answers and frames
// arrive does not matter. No DOM here: the chat view (chat.js) renders the runs marked dirty.

import { applyBrowserOperation } from './browser.js'; // browser capability
import { applyDocumentStatus } from './knowledge_uploads.js'; // "Add to knowledge" status lines

const ACTIVE_STATUSES = new Set(['queued', 'pending', 'running', 'awaiting_approval']);

/** A run or tool call still working (queued, running or waiting for an approval). */
export const isActive = (status) => ACTIVE_STATUSES.has(status);

/** Progress rank of a run/tool status: queued < running = awaiting approval < anything final.
 * A run goes running → awaiting_approval → running again, so those two share a rank. */
export function rank(status) {
  if (status === 'queued' || status === 'pending') return 0;
  if (status === 'running' || status === 'awaiting_approval') return 1;
  return 2;
}

/** Frame timestamps may be epoch seconds (float) or ISO strings. */
function toIso(ts) {
  if (typeof ts === 'number' && Number.isFinite(ts)) {
    return new Date(ts < 1e12 ? ts * 1000 : ts).toISOString();
  }
  return typeof ts === 'string' ? ts : null;
}

function newRun(id) {
  return {
    id: String(id),
    status: 'queued',
    input: '',
    reply: null, // final reply (REST or run_completed)
    stream: '', // text streamed by content_token frames
    error: '',
    reason: '',
    createdAt: null,
    tools: new Map(), // tool call id -> tool object, in arrival order
    notices: [], // model_fallback / model_retry messages, in arrival order
    approvals: new Map(), // approval id -> {id, kind, status, tool_name, arguments, reason, question, skill}
    steered: false, // posted while another run worked, to an agent in steer mode
    steeredInto: null, // the run its message was handed to
    waitingBehind: false, // posted while another run worked (queue mode): waits its turn
  };
}

/** Merge an approval (REST shape or event payload) into a run; decided ones never go back to pending. */
function upsertApproval(run, raw) {
  const id = String(raw.id ?? raw.approval_id);
  const current = run.approvals.get(id);
  const incoming = {
    id,
    kind: raw.kind || 'tool_call',
    status: raw.status || 'pending',
    tool_name: raw.tool_name || '',
    arguments: raw.arguments,
    reason: raw.reason || '',
    question: raw.question || '',
    skill: raw.skill || '',
    answer: raw.answer || '',
    // Who decides (the approval rule's approvers; {}: the run's user) and, from REST, whether I may.
    approvers: raw.approvers || {},
    can_decide: typeof raw.can_decide === 'boolean' ? raw.can_decide : undefined,
    // An MCP server's request for input: the event's `elicitation`, or the REST shape's fields.
    elicitation: raw.elicitation || (raw.kind === 'elicitation'
      ? { mode: raw.mode, message: raw.message, schema: raw.schema, url: raw.url, server: raw.server }
      : null),
    // An MCP server's request for the agent's model (kind sampling): what it asks.
    sampling: raw.sampling || null,
    // An OAuth MCP server's account to connect (kind connection): which server, whose account.
    connection: raw.connection || null,
  };
  if (!current) run.approvals.set(id, incoming);
  else if (current.status === 'pending') Object.assign(current, incoming);
  // An MCP server that asks again in the same call (its next question, or its next sampling
  // request) re-opens the approval.
  else if (incoming.status === 'pending' && (incoming.kind === 'elicitation' || incoming.kind === 'sampling')
    && JSON.stringify([incoming.kind, incoming.elicitation, incoming.sampling])
      !== JSON.stringify([current.kind, current.elicitation, current.sampling])) Object.assign(current, incoming);
  else if (!current.answer && incoming.answer) current.answer = incoming.answer;
}

function normalizeTool(raw) {
  return {
    id: String(raw.id ?? raw.tool_call_id),
    name: raw.name || 'tool',
    arguments: raw.arguments,
    status: raw.status || 'running',
    result: raw.result ?? null,
    error: raw.error ?? null,
    duration_ms: raw.duration_ms ?? null,
    data: raw.data ?? raw.result_data ?? null, // structured result (citations.js reads its citations)
  };
}

/** Merge tool data into a run without moving its status backwards. */
function upsertTool(run, raw) {
  const incoming = normalizeTool(raw);
  const current = run.tools.get(incoming.id);
  if (!current) {
    run.tools.set(incoming.id, incoming);
    return;
  }
  if (incoming.name && incoming.name !== 'tool') current.name = incoming.name;
  if (incoming.arguments !== undefined && incoming.arguments !== null) {
    current.arguments = incoming.arguments;
  }
  if (rank(incoming.status) >= rank(current.status)) {
    current.status = incoming.status;
    if (incoming.result !== null) current.result = incoming.result;
    if (incoming.error !== null) current.error = incoming.error;
    if (incoming.duration_ms !== null) current.duration_ms = incoming.duration_ms;
    if (incoming.data !== null) current.data = incoming.data;
  }
}

/** Merge one run of the REST session detail into `run`. */
function mergeRestRun(run, raw) {
  if (raw.input) run.input = raw.input;
  if (raw.created_at) run.createdAt = raw.created_at;
  if (raw.steered_into !== undefined && raw.steered_into !== null) run.steeredInto = raw.steered_into;
  if (rank(raw.status) >= rank(run.status)) run.status = raw.status;
  if (!isActive(raw.status)) {
    // Final state from the database is canonical.
    if (typeof raw.reply === 'string' && raw.reply) run.reply = raw.reply;
    else if (run.reply === null) run.reply = raw.reply ?? null;
    run.error = raw.error || '';
    if (raw.reason) run.reason = raw.reason;
  }
  for (const tool of raw.tool_calls || []) upsertTool(run, tool);
  for (const approval of raw.approvals || []) upsertApproval(run, approval);
  if (Array.isArray(raw.context)) run.context = raw.context; // the run's start context (citations.js)
  if (raw.attributions !== undefined) run.attributions = raw.attributions; // platform attribution (citations.js)
}

const ERROR_LABELS = {
  rate_limit: 'a rate limit',
  quota_exhausted: 'an exhausted quota',
  overloaded: 'an overload',
  server: 'a server error',
  timeout: 'a timeout',
  network: 'a network error',
  context_window: 'a too-long conversation',
  content_policy: 'a content filter',
  auth: 'an authentication error',
  not_found: 'a missing model',
  cooldown: 'a cooldown',
  no_tool_support: 'missing tool support',
};

function errorLabel(errorClass) {
  return ERROR_LABELS[errorClass] || (errorClass ? errorClass.replace(/_/g, ' ') : 'an error');
}

export class Conversation {
  /**
   * @param {object} hooks what the frames mean outside the runs (all optional):
   *   todos(todos) — the plan changed; artifactsChanged() — a document or file of the chat
   *   changed; titled(title) — the server named the chat; handedOff(agentName) — a handoff
   *   made another agent the chat's (it answers later messages); runEnded(run, status, {steered}) — a
   *   run that was active (not a replay) completed, failed or was cancelled (`steered`: its
   *   message was handed to another run's answer).
   */
  constructor(hooks = {}) {
    this.hooks = { todos() {}, artifactsChanged() {}, titled() {}, handedOff() {}, runEnded() {}, ...hooks };
    this.runs = new Map(); // run id -> run object
    this.order = []; // run ids, oldest first
    this.dirty = new Set(); // run ids to render again
    this.orderChanged = false;
    this.goneRuns = new Set(); // runs edited or regenerated away
    this.maxServerRunId = 0;
    this.lastFrameAt = Date.now();
  }

  ensureRun(id) {
    const key = String(id);
    let run = this.runs.get(key);
    if (!run) {
      run = newRun(key);
      this.runs.set(key, run);
      this.order.push(key);
      this.orderChanged = true;
    }
    return run;
  }

  /** Forget a run (it left the chat); the caller drops its view. */
  forget(id) {
    this.runs.delete(id);
    this.dirty.delete(id);
  }

  /**
   * Merge the REST session's runs (canonical). Returns the ids of runs that left the chat:
   * runs the server no longer lists, older than the newest it lists (edited or regenerated away).
   */
  mergeRuns(rawRuns) {
    const runs = Array.isArray(rawRuns) ? [...rawRuns] : [];
    // Oldest first (stable sort keeps server order for equal timestamps).
    runs.sort((a, b) => String(a.created_at || '').localeCompare(String(b.created_at || '')));
    for (const raw of runs) {
      const run = this.ensureRun(raw.id);
      mergeRestRun(run, raw);
      this.dirty.add(run.id);
    }
    // Canonical order: the server's runs, then any only seen live so far.
    const serverIds = runs.map((r) => String(r.id));
    // Ids only grow: a run older than the newest the server lists, and not listed, was
    // edited or regenerated away (truncation).
    this.maxServerRunId = Math.max(0, ...serverIds.map(Number).filter(Number.isFinite));
    const listed = new Set(serverIds);
    const gone = (id) => this.goneRuns.has(id) || (!listed.has(id) && Number(id) < this.maxServerRunId);
    const removed = this.order.filter((id) => !listed.has(id) && gone(id));
    for (const id of removed) this.forget(id);
    const liveOnly = this.order.filter((id) => !listed.has(id) && !gone(id));
    this.order = [...serverIds, ...liveOnly];
    this.orderChanged = true;
    return removed;
  }

  /** Forget `run` and every run after it (edit / regenerate truncate the chat); returns their ids. */
  dropRunsFrom(run) {
    const index = this.order.indexOf(String(run.id));
    if (index < 0) return [];
    const removed = this.order.slice(index);
    for (const id of removed) {
      this.goneRuns.add(id);
      this.forget(id);
    }
    this.order = this.order.slice(0, index);
    this.orderChanged = true;
    return removed;
  }

  /** Record the run the server created for a message sent from this chat. */
  addSent(created, { content, steered }) {
    const run = this.ensureRun(created.id);
    if (!run.input) run.input = content;
    if (created.status && rank(created.status) > rank(run.status)) run.status = created.status;
    if (!run.createdAt) run.createdAt = created.created_at || new Date().toISOString();
    if (steered) run.steered = true;
    this.dirty.add(run.id);
    return run;
  }

  hasActiveRun() {
    for (const run of this.runs.values()) if (isActive(run.status)) return true;
    return false;
  }

  /** The runs Stop cancels: the active ones of the chat's own (not steered into another), in order. */
  stoppableRuns() {
    return this.order
      .map((id) => this.runs.get(id))
      .filter((run) => run && isActive(run.status) && !run.steeredInto && !run.steered);
  }

  /** Runs posted while an earlier one works wait their turn ("Queued" chip): mark them. */
  markWaiting() {
    let busyBefore = false;
    for (const id of this.order) {
      const run = this.runs.get(id);
      if (!run) continue;
      const waiting = busyBefore && run.status === 'queued';
      if (waiting !== run.waitingBehind) {
        run.waitingBehind = waiting;
        this.dirty.add(id);
      }
      if (isActive(run.status) && !run.steeredInto && !run.steered) busyBefore = true;
    }
  }

  /** A replayed frame of a run edited or regenerated away: not part of the chat any more. */
  isGone(runId) {
    return !this.runs.has(String(runId)) && (this.goneRuns.has(String(runId)) || Number(runId) < this.maxServerRunId);
  }

  /** Apply one event frame; returns true when a run changed (it is marked dirty). */
  applyFrame(frame) {
    this.lastFrameAt = Date.now();
    const data = frame.data || {};
    if (frame.type === 'todo_updated') {
      this.hooks.todos(data.todos);
      return false;
    }
    if (frame.type === 'artifact_updated') {
      this.hooks.artifactsChanged(); // a document or file of this chat changed
      return false;
    }
    if (frame.type === 'session_titled') {
      this.hooks.titled(data.title); // the model named the chat after its first answer
      return false;
    }
    if (frame.type === 'agent_handoff') {
      this.hooks.handedOff(data.to_agent); // another agent took the chat over: it answers from now on
      return false;
    }
    if (frame.type === 'document_status_changed') {
      applyDocumentStatus(frame); // a file added to the user's knowledge from this chat moved on
      return false;
    }
    if (frame.run_id === null || frame.run_id === undefined) return false;
    // A skill's sub-run: shown as its parent's tool call, not as a run of the conversation.
    if (data.parent_run_id !== undefined && data.parent_run_id !== null) return false;
    if (this.isGone(frame.run_id)) return false;
    const known = this.runs.has(String(frame.run_id));
    const handlers = {
      run_queued: (run) => {
        if (!run.input && typeof data.input === 'string') run.input = data.input;
        if (!run.createdAt) run.createdAt = toIso(frame.ts);
      },
      run_running: (run) => {
        if (rank(run.status) < 2) run.status = 'running';
        if (data.steered_into !== undefined && data.steered_into !== null) run.steeredInto = data.steered_into;
      },
      run_awaiting_approval: (run) => {
        if (rank(run.status) < 2) run.status = 'awaiting_approval';
        for (const approval of data.approvals || []) upsertApproval(run, approval);
        // A run pauses once its other calls have results: a call still shown running is a
        // skill whose sub-run waits for this approval.
        for (const tool of run.tools.values()) if (isActive(tool.status)) tool.status = 'awaiting_approval';
      },
      approval_resolved: (run) => {
        const approval = run.approvals.get(String(data.approval_id));
        if (approval) approval.status = data.status || 'approved';
      },
      model_fallback: (run) => {
        run.notices.push(
          `Switched from ${data.from_model || 'the first model'} to ${data.to_model || 'the next model'} ` +
            `after ${errorLabel(data.error_class)}.`,
        );
      },
      model_retry: (run) => {
        if (data.turn_restarted) {
          run.stream = ''; // the broken answer is discarded; the turn starts again
          run.notices.push('The answer broke off; asking the model again.');
        } else {
          const wait = Number(data.wait_seconds) > 0 ? ` in ${Number(data.wait_seconds).toFixed(1)} s` : '';
          run.notices.push(`Retrying ${data.model || 'the model'}${wait} after ${errorLabel(data.error_class)}.`);
        }
      },
      content_token: (run) => {
        if (isActive(run.status) && typeof data.text === 'string') {
          run.stream += data.text;
          if (rank(run.status) < 1) run.status = 'running';
        }
      },
      tool_call_started: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          arguments: data.arguments,
          status: 'running',
        }),
      tool_call_progress: (run) => {
        // What a running tool says it is doing (a remote A2A agent's status and chunks, a CLI's output).
        const tool = run.tools.get(String(data.tool_call_id));
        if (!tool || !isActive(tool.status)) return;
        if (typeof data.message === 'string') tool.progress = data.message;
        // An MCP server's numbers (not a CLI's output: that one names its stream) drive the card's bar.
        if (!data.stream && typeof data.progress === 'number') {
          tool.progressBar = { value: data.progress, total: typeof data.total === 'number' && data.total > 0 ? data.total : null };
        }
      },
      tool_call_succeeded: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          status: 'succeeded',
          result: data.result ?? '',
          duration_ms: data.duration_ms,
          data: data.data, // e.g. knowledge_search's citations
        }),
      tool_call_failed: (run) =>
        upsertTool(run, {
          id: data.tool_call_id,
          name: data.name,
          status: data.status || 'failed', // 'failed' | 'timed_out'
          error: data.error ?? '',
          duration_ms: data.duration_ms,
        }),
      // --- browser capability (browser.js): what the agent does in the browser ---
      browser_operation: (run) => applyBrowserOperation(run, data),
      // --- end browser capability ---
      run_completed: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'completed';
        run.reply = typeof data.reply === 'string' ? data.reply : (run.reply ?? run.stream);
        if (Array.isArray(data.attributions)) run.attributions = data.attributions; // citations.js
        if (wasActive) this.hooks.runEnded(run, 'completed', { steered: !!data.steered_into }); // not for replays
      },
      guardrail_tripped: (run) => {
        // A guardrail stopped the run (run_failed follows). An output guardrail withdraws the
        // answer streamed so far: the run view shows a retraction notice in its place.
        if (data.retracted) {
          run.stream = '';
          run.retracted = data.message || 'A guardrail withdrew this answer.';
        }
        run.error = data.message || run.error;
        run.reason = 'guardrail_tripped';
      },
      run_failed: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'failed';
        run.error = data.error || run.error || 'The run failed.';
        run.reason = data.reason || run.reason || '';
        if (wasActive) this.hooks.runEnded(run, 'failed', {});
      },
      run_cancelled: (run) => {
        const wasActive = isActive(run.status);
        run.status = 'cancelled';
        if (data.reason) run.reason = data.reason;
        if (wasActive) this.hooks.runEnded(run, 'cancelled', {});
      },
    };
    const handler = handlers[frame.type];
    if (!handler) return false; // unknown frame type: ignore
    // Frames of a run we never saw (e.g. trimmed history) create a placeholder
    // that the next REST refresh fills in.
    const run = this.ensureRun(frame.run_id);
    if (!known && frame.type !== 'run_queued' && rank(run.status) < 1) run.status = 'running';
    handler(run);
    this.dirty.add(run.id);
    return true;
  }
}
