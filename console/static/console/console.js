// The console's small helpers (loaded on every console page; no inline scripts under the CSP).
// Each helper looks for its own markers and does nothing on pages without them.
//  - binding forms: show only the fields of the chosen kind (select[data-binding-kind])
//  - allowed tools: checkboxes from the chosen MCP server's tool list (input.tool-list-input)
//  - approval policy: an "Add a rule" button under the rows (.policy-editor)
//  - copy buttons (button[data-copy="<id>"]): the text of element #id to the clipboard, else the
//    text is selected for Ctrl+C; the outcome in the fieldset's .call-copy-status
"use strict";

(function () {
  function bindingContainer(el) {
    return el.closest(".inline-related") || el.closest("form");
  }

  function fieldRows(container, field) {
    return container.querySelectorAll(".form-row.field-" + field + ", .fieldBox.field-" + field);
  }

  function applyKind(select) {
    var map = JSON.parse(select.getAttribute("data-binding-kind"));
    var container = bindingContainer(select);
    var all = {};
    Object.keys(map).forEach(function (k) { map[k].forEach(function (f) { all[f] = true; }); });
    var wanted = map[select.value] || [];
    Object.keys(all).forEach(function (field) {
      fieldRows(container, field).forEach(function (row) {
        row.classList.toggle("console-hidden", Boolean(select.value) && wanted.indexOf(field) < 0);
      });
    });
  }

  function toolNames(input) {
    return input.value.split(",").map(function (s) { return s.trim(); }).filter(Boolean);
  }

  function renderToolPicker(input) {
    var container = bindingContainer(input);
    var server = container.querySelector('select[name$="mcp_server"]');
    var tools = JSON.parse(input.getAttribute("data-server-tools") || "{}");
    var list = (server && tools[server.value]) || [];
    var picker = input.parentNode.querySelector(".tool-picker-box");
    if (!picker) {
      picker = document.createElement("div");
      picker.className = "tool-picker-box";
      input.parentNode.insertBefore(picker, input.nextSibling);
    }
    picker.textContent = "";
    if (!server || !server.value) return;
    if (!list.length) {
      var note = document.createElement("p");
      note.className = "help";
      note.textContent = "This server has no tool list yet: open it and click Test connection, then come back.";
      picker.appendChild(note);
      return;
    }
    var chosen = toolNames(input);
    var ul = document.createElement("ul");
    ul.className = "tool-picker";
    ul.setAttribute("data-testid", "tool-picker");
    list.forEach(function (tool, i) {
      var li = document.createElement("li");
      var box = document.createElement("input");
      box.type = "checkbox";
      box.id = input.id + "-tool-" + i;
      box.value = tool.name;
      box.checked = chosen.indexOf(tool.name) >= 0;
      box.addEventListener("change", function () {
        var names = toolNames(input).filter(function (n) { return n !== tool.name; });
        if (box.checked) names.push(tool.name);
        input.value = names.join(", ");
      });
      var label = document.createElement("label");
      label.htmlFor = box.id;
      label.className = "vCheckboxLabel";
      label.textContent = tool.name + (tool.description ? " — " + tool.description : "");
      li.appendChild(box);
      li.appendChild(label);
      ul.appendChild(li);
    });
    picker.appendChild(ul);
  }

  function addRuleButton(editor) {
    if (editor.querySelector(".policy-add")) return;
    var button = document.createElement("button");
    button.type = "button";
    button.className = "button policy-add";
    button.textContent = "Add a rule";
    button.addEventListener("click", function () {
      var rows = editor.querySelectorAll("tr.policy-row");
      var last = rows[rows.length - 1];
      var copy = last.cloneNode(true);
      var index = rows.length;
      copy.querySelectorAll("input, select, label").forEach(function (el) {
        ["id", "name", "for"].forEach(function (attr) {
          var v = el.getAttribute(attr);
          if (v) el.setAttribute(attr, v.replace(/-(pattern|action|options)-\d+$/, "-$1-" + index));
        });
        if (el.tagName === "LABEL") el.textContent = el.textContent.replace(/Rule \d+/, "Rule " + (index + 1));
        if (el.tagName === "INPUT") el.value = "";
        if (el.tagName === "SELECT") el.value = "ask";
      });
      last.parentNode.appendChild(copy);
      copy.querySelector("input").focus();
    });
    editor.appendChild(button);
  }

  // Route entries: the model field offers the chosen provider's models (GET …/models/).
  var modelLists = {};
  function offerModels(select) {
    var marker = document.getElementById("console-provider-models");
    var container = select.closest(".inline-related");
    if (!marker || !container) return;
    var input = container.querySelector('input[name$="-model"]');
    if (!input) return;
    var note = container.querySelector(".console-models-note");
    if (!note) {
      note = document.createElement("p");
      note.className = "help console-models-note";
      note.setAttribute("data-testid", "models-note");
      input.parentNode.appendChild(note);
    }
    if (!select.value) { note.textContent = ""; return; }
    var listId = "console-models-" + select.value;
    input.setAttribute("list", listId);
    if (modelLists[select.value]) { note.textContent = modelLists[select.value]; return; }
    note.textContent = "Asking the provider for its models…";
    var url = marker.getAttribute("data-url").replace(/\/0\/models\/$/, "/" + select.value + "/models/");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.json(); })
      .then(function (data) {
        var text;
        if (data.ok) {
          var list = document.getElementById(listId);
          if (!list) {
            list = document.createElement("datalist");
            list.id = listId;
            document.body.appendChild(list);
          }
          list.textContent = "";
          data.models.forEach(function (m) {
            var option = document.createElement("option");
            option.value = m;
            list.appendChild(option);
          });
          text = data.models.length + " models from the provider: pick one from the field's list or type a name.";
        } else {
          text = "The provider's model list could not be read (" + data.error_class + "): " + data.error;
        }
        modelLists[select.value] = text;
        note.textContent = text;
      })
      .catch(function () { note.textContent = "The provider's model list could not be read."; });
  }

  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copyButton(button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-copy"));
      var box = button.closest("fieldset");
      var status = box && box.querySelector(".call-copy-status");
      if (!source) return;
      var say = function (text) { if (status) status.textContent = text; };
      var refuse = function () {
        selectText(source);
        say("Could not copy automatically: the text is selected, press Ctrl+C (⌘C on a Mac).");
      };
      if (!navigator.clipboard) { refuse(); return; }
      navigator.clipboard.writeText(source.textContent)
        .then(function () { say("Copied to the clipboard."); }, refuse);
    });
  }

  function init(root) {
    root.querySelectorAll("button[data-copy]").forEach(copyButton);
    root.querySelectorAll('.inline-related select[name$="-provider"]').forEach(function (select) {
      if (select.name.indexOf("__prefix__") >= 0) return;
      offerModels(select);
      select.addEventListener("change", function () { offerModels(select); });
    });
    root.querySelectorAll("select[data-binding-kind]").forEach(function (select) {
      if (select.name.indexOf("__prefix__") >= 0) return;
      applyKind(select);
      select.addEventListener("change", function () { applyKind(select); });
    });
    root.querySelectorAll("input.tool-list-input").forEach(function (input) {
      if (input.name.indexOf("__prefix__") >= 0) return;
      renderToolPicker(input);
      var server = bindingContainer(input).querySelector('select[name$="mcp_server"]');
      if (server) server.addEventListener("change", function () { renderToolPicker(input); });
    });
    root.querySelectorAll(".policy-editor").forEach(function (editor) {
      var first = editor.querySelector("input");
      if (!first || first.name.indexOf("__prefix__") >= 0) return;
      addRuleButton(editor);
    });
  }

  // A trace page of a run still working re-reads itself every 2 s until the run ends.
  var ACTIVE = ["queued", "running", "awaiting_approval"];
  function followTrace() {
    var trace = document.querySelector('.console-trace-page [data-testid="run-trace"]');
    if (!trace || ACTIVE.indexOf(trace.getAttribute("data-run-status")) < 0) return;
    var timer = setInterval(function () {
      fetch(location.pathname + "?fragment=1", { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) return;
          var fresh = new DOMParser().parseFromString(html, "text/html").querySelector('[data-testid="run-trace"]');
          var current = document.querySelector('[data-testid="run-trace"]');
          if (!fresh || !current) return;
          fresh.id = current.id;
          current.replaceWith(fresh);
          if (ACTIVE.indexOf(fresh.getAttribute("data-run-status")) < 0) clearInterval(timer);
        });
    }, 2000);
  }

  document.addEventListener("DOMContentLoaded", function () { init(document); followTrace(); });
  // Django admin's inlines.js announces a form added with "Add another".
  document.addEventListener("formset:added", function (event) { init(event.target); });
})();
