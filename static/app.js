// The dashboard's only script (CSP forbids inline script): lease countdowns, "select all"
// on the queue and dead-letters pages, no auto-refresh of a part of a page while the
// operator is choosing or typing in it, "select at least one" before a bulk action, the
// copy buttons, open/closed <details> kept across refreshes, and the calm "new work" line.
(function () {
  "use strict";

  function fmt(seconds) {
    var s = Math.max(0, Math.round(Math.abs(seconds)));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  }

  function stamp(root) {
    var now = Date.now();
    root.querySelectorAll("[data-seconds-left]:not([data-deadline])").forEach(function (el) {
      el.dataset.deadline = now + parseFloat(el.dataset.secondsLeft) * 1000;
    });
    root.querySelectorAll("[data-seconds-ago]:not([data-since])").forEach(function (el) {
      el.dataset.since = now - parseFloat(el.dataset.secondsAgo) * 1000;
    });
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var left = (parseFloat(el.dataset.deadline) - now) / 1000;
      el.textContent = left > 0 ? fmt(left) : "lapsed " + fmt(left) + " ago";
      el.classList.toggle("lapsed", left <= 0);
      el.classList.toggle("soon", left > 0 && left < 10);
    });
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = fmt((now - parseFloat(el.dataset.since)) / 1000);
    });
  }

  document.addEventListener("DOMContentLoaded", function () { stamp(document); });
  document.addEventListener("htmx:afterSwap", function (e) { var swapped = e.detail.target || e.target;
    stamp((swapped && swapped.parentNode) || document); });
  setInterval(tick, 1000);

  document.addEventListener("change", function (e) {
    if (e.target.id === "select-all" || e.target.classList.contains("select-all")) {
      var form = e.target.closest("form") || document;
      form.querySelectorAll("input[name=ids]").forEach(function (box) {
        box.checked = e.target.checked;
      });
    }
  });

  // A bulk action on "the selected" rows with no box ticked: say so beside its buttons,
  // with neither a confirmation dialog nor a request. The sender (a form, or a button)
  // says which field holds the scope (data-selection-scope) or that it always needs a
  // selection (data-needs-selection). Without script the server answers the same.
  function noneSelected(sender) {
    var form = sender.closest && sender.closest("form");
    if (!form) return false;
    var field = sender.dataset.selectionScope && form.elements[sender.dataset.selectionScope];
    var needs = sender.hasAttribute("data-needs-selection") || (field && field.value === "selected");
    return needs && !form.querySelector("input[name=ids]:checked");
  }

  function showSelectionHint(form, show) {
    form.querySelectorAll(".selection-hint").forEach(function (hint) { hint.hidden = !show; });
  }

  document.addEventListener("htmx:confirm", function (e) {
    var sender = e.detail.elt;
    if (sender && noneSelected(sender)) {
      e.preventDefault();
      showSelectionHint(sender.closest("form"), true);
    }
  });
  document.addEventListener("submit", function (e) {  // the same form sent without htmx
    var sender = e.submitter && e.submitter.closest("[data-needs-selection], [data-selection-scope]") ||
      e.target.closest("[data-selection-scope]");
    if (sender && noneSelected(sender)) {
      e.preventDefault();
      showSelectionHint(e.target, true);
    }
  });
  document.addEventListener("change", function (e) {  // a box ticked, or "all that match" chosen
    var form = e.target.closest && e.target.closest("form");
    if (form) showSelectionHint(form, false);
  });

  // Copy buttons: data-copy names the element whose text goes to the clipboard.
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.dataset.copy);
    if (!source) return;
    var done = function (ok) {
      button.textContent = ok ? "Copied" : "Copy failed: select the text instead";
      setTimeout(function () { button.textContent = button.dataset.label || "Copy"; }, 2000);
    };
    button.dataset.label = button.dataset.label || button.textContent;
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent).then(function () { done(true); },
        function () { done(false); });
    } else {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      done(document.execCommand("copy"));
    }
  });

  // <details id=…> stay as the operator left them when their part of the page refreshes.
  // Their summary's click (a key press on it clicks too) records the choice: a "toggle"
  // event would also come from every redrawn <details open>.
  var opened = {};
  document.addEventListener("click", function (e) {
    var summary = e.target.closest && e.target.closest("summary");
    var details = summary && summary.parentElement;
    if (details && details.tagName === "DETAILS" && details.id) opened[details.id] = !details.open;
  });
  document.addEventListener("htmx:afterSettle", function () {
    Object.keys(opened).forEach(function (id) {
      var details = document.getElementById(id);
      if (details && details.open !== opened[id]) details.open = opened[id];
    });
  });

  // "New work in <queue>": only on pages with a #notice line (the overview: any queue; a
  // queue page, data-notice-for: its own), at most once per queue every NOTICE_EVERY ms,
  // drawn in place (its age ticks on) instead of popping up again.
  var NOTICE_EVERY = 10000;
  var announced = {};
  document.addEventListener("htmx:sseBeforeMessage", function (e) {
    var line = e.target;
    if (line.id !== "notice") return;
    e.preventDefault();  // drawn here, not swapped in
    var holder = document.createElement("template");
    holder.innerHTML = e.detail.data;
    var hint = holder.content.querySelector("[data-queues]");
    var only = line.dataset.noticeFor;
    var now = Date.now();
    var fresh = (hint ? hint.dataset.queues.split(",") : []).filter(function (queue) {
      return (!only || queue === only) && !(now - (announced[queue] || 0) < NOTICE_EVERY);
    });
    if (!fresh.length) return;
    fresh.forEach(function (queue) { announced[queue] = now; });
    var shown = fresh.slice(0, 3).join(", ") + (fresh.length > 3 ? " …" : "");
    var age = document.createElement("span");
    age.dataset.since = now;
    age.textContent = "0s";
    line.textContent = "new work in " + shown + " · ";
    line.appendChild(age);
    line.appendChild(document.createTextNode(" ago"));
    line.hidden = false;
  });

  // A field the operator has changed from how the page drew it: a box ticked, an action
  // chosen, a reason or priority typed.
  function changed(field) {
    if (field.type === "hidden" || field.type === "submit" || field.type === "button") return false;
    if (field.type === "checkbox" || field.type === "radio") return field.checked !== field.defaultChecked;
    if (field.tagName === "SELECT") {
      var drawn = 0;
      for (var i = 0; i < field.options.length; i++) {
        if (field.options[i].defaultSelected) drawn = i;
      }
      return field.selectedIndex !== drawn;
    }
    return field.value !== field.defaultValue;
  }

  // Keep what an operator is in the middle of: skip a partial's refresh (polling or a
  // hint) while a field in it is changed, or focused for typing. Otherwise a refresh
  // would untick the boxes, empty a half-typed reason and put the bulk action back to
  // its first choice (Cancel) just before Apply. The action's answer draws it afresh.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail.elt;
    var config = e.detail.requestConfig;
    if (!elt || !elt.querySelectorAll || !config || config.verb !== "get") return;
    var active = document.activeElement;
    var typing = active && elt.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName) &&
      active.type !== "checkbox" && active.type !== "radio";
    if (typing || Array.prototype.some.call(elt.querySelectorAll("input, select, textarea"), changed)) {
      e.preventDefault();
    }
  });
})();
