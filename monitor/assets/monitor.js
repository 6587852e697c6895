// Live updates for the autocomp monitor: while the tab is visible, asks for the page again
// every 5 s with If-None-Match; on a changed page (200) swaps the #live region in place,
// keeping scroll, focus and open <details>, unless a form in it is being filled in.
// Also: a pause button (shown only when this script runs) and j/k between matrix rows.
(function () {
  "use strict";
  var PERIOD = 5000;
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var toggle = document.getElementById("live-toggle");
  var etag = null;
  var busy = false;
  var paused = false;

  function isField(el) {
    return !!el && (/^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName) || el.isContentEditable);
  }

  // A field that has focus or differs from how the page came: the user is busy with it.
  function editing() {
    if (isField(document.activeElement)) return true;
    var fields = live.querySelectorAll("input, select, textarea");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden") continue;
      if (f.tagName === "SELECT") {
        // Without a `selected` attribute the first option is the one the page came with.
        var initial = 0;
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].defaultSelected) { initial = j; break; }
        }
        if (f.selectedIndex !== initial) return true;
      } else if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var fresh = doc.getElementById("live");
    if (!fresh || editing() || fresh.innerHTML === live.innerHTML) return;
    var open = {};
    var details = live.querySelectorAll("details[id]");
    for (var i = 0; i < details.length; i++) open[details[i].id] = details[i].open;
    var active = document.activeElement;
    var focusKey = null;
    if (active && live.contains(active)) focusKey = active.id || active.getAttribute("href");
    var x = window.scrollX, y = window.scrollY;
    live.replaceChildren.apply(live, Array.prototype.map.call(fresh.childNodes, function (node) {
      return document.importNode(node, true);
    }));
    var now = live.querySelectorAll("details[id]");
    for (var k = 0; k < now.length; k++) {
      if (Object.prototype.hasOwnProperty.call(open, now[k].id)) now[k].open = open[now[k].id];
    }
    if (focusKey) {
      var found = document.getElementById(focusKey);
      if (!found || !live.contains(found)) {
        var links = live.querySelectorAll("a[href]");
        for (var m = 0; m < links.length && !found; m++) {
          if (links[m].getAttribute("href") === focusKey) found = links[m];
        }
      }
      if (found) found.focus({ preventScroll: true });
    }
    window.scrollTo(x, y);
    document.title = doc.title;
    // UTC in the pages' own format (the footer names it); the browser's clock, so said.
    if (status) status.textContent = "Updated at " + new Date().toISOString() + " (this browser's clock)";
  }

  function poll() {
    if (busy || paused || document.visibilityState !== "visible" || editing()) return;
    busy = true;
    var headers = { "Accept": "text/html" };
    if (etag) headers["If-None-Match"] = etag;
    fetch(window.location.href, { headers: headers, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (response.status !== 200) return null;
        // A page without a tag (a batch page while a run goes) is asked for whole next time.
        etag = response.headers.get("ETag");
        return response.text();
      })
      .then(function (html) { if (html) swap(html); })
      .catch(function () { /* the next poll tries again */ })
      .then(function () { busy = false; });
  }

  if (live && window.fetch && window.DOMParser) {
    window.setInterval(poll, PERIOD);
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") poll();
    });
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        paused = !paused;
        toggle.setAttribute("aria-pressed", paused ? "true" : "false");
        toggle.textContent = paused ? "Resume live updates" : "Pause live updates";
        if (status) status.textContent = paused ? "Live updates paused" : "Live updates on";
        if (!paused) poll();
      });
    }
  }

  // j / k: next / previous batch of the matrix (outside form fields, without modifiers).
  document.addEventListener("keydown", function (event) {
    if (event.altKey || event.ctrlKey || event.metaKey || (event.key !== "j" && event.key !== "k")) return;
    if (isField(event.target)) return;
    var links = document.querySelectorAll("table.matrix tbody th a");
    if (!links.length) return;
    var i = Array.prototype.indexOf.call(links, document.activeElement);
    if (event.key === "j") i = Math.min(i + 1, links.length - 1);
    else i = i < 0 ? 0 : Math.max(i - 1, 0);
    links[i].focus();
    event.preventDefault();
  });
})();
