// The dashboard's only script (CSP forbids inline script): lease countdowns, "select all"
// on the queue and dead-letters pages, and no auto-refresh of a part of a page while the
// operator is choosing or typing in it.
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
