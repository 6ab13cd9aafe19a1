// vpsshop dashboard: the serial console page. Opens the WebSocket named by the page's ticket
// (POST /v1/servers/{id}/console, single use, valid for seconds), shows what the guest prints and
// sends the lines typed below it. Loaded from 'self' only; the page has no inline script.
"use strict";

(function () {
  var MAX_CHARS = 200000;  // keep the newest output only
  var CSI = /\u001b\[[0-9;?]*[ -\/]*[@-~]|\u001b[()][A-Za-z0-9]|\u001b[=>78]/g;

  function start(root) {
    var path = root.getAttribute("data-console");
    var out = root.querySelector("#console-output");
    var state = root.querySelector('[data-field="console-state"]');
    var form = root.querySelector("#console-send");
    var line = root.querySelector("#console-line");
    var scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    var socket = new WebSocket(scheme + "//" + window.location.host + path);
    var decoder = new TextDecoder("utf-8");
    socket.binaryType = "arraybuffer";

    function show(text) {
      var atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 8;
      var clean = text.replace(CSI, "").replace(/\r\n/g, "\n").replace(/\r/g, "");
      var all = out.textContent + clean;
      out.textContent = all.length > MAX_CHARS ? all.slice(all.length - MAX_CHARS) : all;
      if (atEnd) out.scrollTop = out.scrollHeight;
    }

    function send(text) {
      if (socket.readyState === WebSocket.OPEN) socket.send(new TextEncoder().encode(text));
    }

    socket.addEventListener("open", function () {
      state.textContent = "Connected.";
      form.hidden = false;
    });
    socket.addEventListener("message", function (event) {
      show(typeof event.data === "string" ? event.data : decoder.decode(event.data, {stream: true}));
    });
    socket.addEventListener("close", function (event) {
      form.hidden = true;
      var why = event.reason ? ": " + event.reason : "";
      if (event.code === 4401) {
        state.textContent = "Not connected" + why + ". Press Connect again for a new ticket.";
      } else {
        state.textContent = "The console closed" + why + ". Press Connect again to reopen it.";
      }
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      send(line.value + "\r");
      line.value = "";
      line.focus();
    });
    root.querySelectorAll("[data-send]").forEach(function (button) {
      button.addEventListener("click", function () {
        if (button.getAttribute("data-send") === "ctrl-c") send("\u0003");
        line.focus();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.querySelector("[data-console]");
    if (root && window.WebSocket) start(root);
  });
})();
