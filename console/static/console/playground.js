// The console's playground ("Try this agent"): a chat with the agent as the admin user,
// through the same REST API and WebSocket as the chat app, with the run's trace beside it.
//  - POST /api/v1/sessions/ {agent}  (X-Tenant: the agent's tenant; CSRF token from the cookie)
//  - POST /api/v1/sessions/<id>/messages/ {content, draft: true} -> {run: {id}} (the agent's draft)
//  - WS /ws/sessions/<id>/: content_token frames stream the reply; run_* frames end it
//  - GET /api/v1/runs/<id>/ every 1.5 s as a safety net (a lost socket still ends the run)
//  - GET <console>/agent_sessions/run/<id>/trace/?fragment=1: the trace, re-read on each event
"use strict";

(function () {
  var root = document.getElementById("playground");
  if (!root) return;
  var api = root.getAttribute("data-api");
  var tenant = root.getAttribute("data-tenant");
  var agentId = Number(root.getAttribute("data-agent-id"));
  var traceUrlZero = root.getAttribute("data-trace-url");
  var log = document.getElementById("pg-log");
  var form = document.getElementById("pg-form");
  var input = document.getElementById("pg-input");
  var send = document.getElementById("pg-send");
  var status = document.getElementById("pg-status");
  var tracePane = document.getElementById("pg-trace");
  var TERMINAL = ["completed", "failed", "cancelled"];

  var state = { sessionId: null, runId: null, bubble: null, ws: null, lastSeq: 0, poll: null, traceTimer: null,
                busy: false, streamed: "" };

  function cookie(name) {
    var m = document.cookie.match("(^|;)\\s*" + name + "=([^;]*)");
    return m ? decodeURIComponent(m[2]) : "";
  }

  function call(method, path, body) {
    var headers = { "Accept": "application/json", "X-Tenant": tenant };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      headers["X-CSRFToken"] = cookie("csrftoken");
    }
    return fetch(api + path, { method: method, headers: headers, credentials: "same-origin",
                               body: body ? JSON.stringify(body) : undefined })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (data) {
          if (!r.ok) throw new Error(data.message || ("HTTP " + r.status));
          return data;
        });
      });
  }

  function bubble(role, text) {
    var div = document.createElement("div");
    div.className = "playground-msg " + role;
    div.setAttribute("data-testid", "playground-" + role);
    div.textContent = text;
    log.appendChild(div);
    log.scrollTop = log.scrollHeight;
    return div;
  }

  function setBusy(busy, text) {
    state.busy = busy;
    send.disabled = busy;
    status.textContent = text || "";
  }

  function refreshTrace() {
    if (!state.runId) return;
    var url = traceUrlZero.replace(/\/0\/trace\/$/, "/" + state.runId + "/trace/") + "?fragment=1";
    fetch(url, { credentials: "same-origin" }).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) tracePane.innerHTML = html; });
  }

  function scheduleTrace() {
    if (state.traceTimer) return;
    state.traceTimer = setTimeout(function () { state.traceTimer = null; refreshTrace(); }, 400);
  }

  function finish(run) {
    if (!state.bubble || run.id !== state.runId) return;
    clearInterval(state.poll);
    state.poll = null;
    if (run.status === "completed") {
      state.bubble.textContent = run.reply || state.streamed || "(empty reply)";
    } else {
      state.bubble.classList.add("error");
      state.bubble.textContent = (state.streamed ? state.streamed + "\n\n" : "") +
        (run.status === "cancelled" ? "Stopped." : "The run failed: " + (run.error || run.reason || "unknown error"));
    }
    state.bubble.setAttribute("data-run-status", run.status);
    state.bubble = null;
    setBusy(false, "Run " + run.id + " " + run.status + ".");
    refreshTrace();
  }

  function showApprovals(approvals) {
    approvals.forEach(function (a) {
      if (a.status !== "pending" || document.getElementById("pg-approval-" + a.approval_id)) return;
      var box = document.createElement("div");
      box.className = "playground-msg assistant";
      box.id = "pg-approval-" + a.approval_id;
      box.setAttribute("data-testid", "playground-approval");
      var p = document.createElement("p");
      p.textContent = a.kind === "question" ? "The agent asks: " + a.question
        : "Approve " + a.tool_name + " " + JSON.stringify(a.arguments) + "?";
      box.appendChild(p);
      var decide = function (body) {
        call("POST", "approvals/" + a.approval_id + "/", body).then(function () {
          box.textContent = "Decided: " + (body.decision || "answered") + ".";
        }).catch(function (e) { p.textContent += " — " + e.message; });
      };
      if (a.kind === "question") {
        var answer = document.createElement("input");
        answer.type = "text";
        answer.setAttribute("aria-label", "Your answer");
        var ok = document.createElement("button");
        ok.type = "button"; ok.className = "button"; ok.textContent = "Answer";
        ok.addEventListener("click", function () { decide({ answer: answer.value }); });
        box.appendChild(answer); box.appendChild(ok);
      } else {
        ["approve", "deny"].forEach(function (d) {
          var b = document.createElement("button");
          b.type = "button"; b.className = "button"; b.textContent = d === "approve" ? "Approve" : "Deny";
          b.setAttribute("data-testid", "playground-" + d);
          b.addEventListener("click", function () { decide({ decision: d }); });
          box.appendChild(b);
        });
      }
      log.insertBefore(box, state.bubble);
    });
  }

  function onFrame(frame) {
    if (typeof frame.seq === "number") state.lastSeq = Math.max(state.lastSeq, frame.seq);
    if (frame.run_id !== state.runId) return;
    var data = frame.data || {};
    if (frame.type === "content_token" && state.bubble) {
      state.streamed += data.text || "";
      state.bubble.textContent = state.streamed;
      return;
    }
    if (frame.type === "reasoning_token") return;
    if (frame.type === "model_retry" && data.turn_restarted) state.streamed = "";
    if (frame.type === "run_awaiting_approval") showApprovals(data.approvals || []);
    if (frame.type === "run_completed") finish({ id: state.runId, status: "completed", reply: data.reply });
    else if (frame.type === "run_failed") finish({ id: state.runId, status: "failed", error: data.error });
    else if (frame.type === "run_cancelled") finish({ id: state.runId, status: "cancelled" });
    else scheduleTrace();
  }

  function connect() {
    if (state.ws || !state.sessionId) return;
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + "/ws/sessions/" + state.sessionId + "/?after_seq=" + state.lastSeq);
    state.ws = ws;
    ws.onmessage = function (e) { try { onFrame(JSON.parse(e.data)); } catch (err) { /* not a frame */ } };
    ws.onclose = function () { if (state.ws === ws) state.ws = null; };
  }

  function pollRun() {
    if (!state.runId) return;
    call("GET", "runs/" + state.runId + "/").then(function (run) {
      if (TERMINAL.indexOf(run.status) >= 0) finish(run);
      else {
        if (!state.ws) connect();
        if (run.status === "awaiting_approval") {
          showApprovals((run.approvals || []).map(function (a) {
            return { approval_id: a.id, status: a.status, kind: a.kind, question: a.question,
                     tool_name: a.tool_name, arguments: a.arguments };
          }));
        }
        scheduleTrace();
      }
    }).catch(function () { /* the next poll tries again */ });
  }

  function ensureSession() {
    if (state.sessionId) return Promise.resolve(state.sessionId);
    return call("POST", "sessions/", { agent: agentId }).then(function (s) {
      state.sessionId = s.id;
      state.lastSeq = 0;
      connect();
      return s.id;
    });
  }

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    var text = input.value.trim();
    if (!text || state.busy) return;
    setBusy(true, "Sending…");
    bubble("user", text);
    input.value = "";
    ensureSession().then(function (sid) {
      return call("POST", "sessions/" + sid + "/messages/", { content: text, draft: true });
    }).then(function (data) {
      state.runId = data.run.id;
      state.streamed = "";
      state.bubble = bubble("assistant", "…");
      state.bubble.setAttribute("data-run-id", String(state.runId));
      setBusy(true, "Run " + state.runId + " is working…");
      refreshTrace();
      state.poll = setInterval(pollRun, 1500);
    }).catch(function (err) {
      bubble("error", "Could not send: " + err.message);
      setBusy(false, "");
    });
  });

  input.addEventListener("keydown", function (e) {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
  });

  document.getElementById("pg-new").addEventListener("click", function () {
    if (state.ws) { var ws = state.ws; state.ws = null; ws.close(); }
    clearInterval(state.poll);
    state = { sessionId: null, runId: null, bubble: null, ws: null, lastSeq: 0, poll: null, traceTimer: null,
              busy: false, streamed: "" };
    log.textContent = "";
    tracePane.textContent = "";
    setBusy(false, "New conversation.");
    input.focus();
  });

  // The form is rendered disabled: it works only once the handlers above are attached (a
  // message typed before this deferred script ran would otherwise go nowhere).
  input.disabled = false;
  send.disabled = false;
  document.getElementById("pg-new").disabled = false;
})();
