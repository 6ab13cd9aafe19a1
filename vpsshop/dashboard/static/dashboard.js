// vpsshop dashboard: the little JavaScript the pages need, none of it required to use them.
// Copy buttons, the top-up countdown, live status while a top-up or server is in progress, the
// live price of the order form and of a renewal. (console.js runs the serial console page.) Loaded from 'self' only (the pages' CSP has no inline script).
"use strict";

(function () {
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // Plain-http shops (not localhost): select and copy the old way.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "absolute";
    area.style.left = "-9999px";
    document.body.appendChild(area);
    area.select();
    var ok = document.execCommand("copy");
    document.body.removeChild(area);
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function setupCopy() {
    document.querySelectorAll("button[data-copy]").forEach(function (button) {
      var id = button.getAttribute("data-copy");
      var source = document.getElementById(id);
      var said = document.querySelector('[data-copied-for="' + id + '"]');
      if (!source) return;
      button.hidden = false;
      button.addEventListener("click", function () {
        copyText(source.textContent.trim()).then(function () {
          if (said) said.textContent = "Copied.";
        }, function () {
          if (said) said.textContent = "Copying failed: select the text and copy it yourself.";
        });
      });
    });
  }

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function setupCountdown() {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var end = Date.parse(el.getAttribute("data-countdown"));
      if (isNaN(end)) return;
      function tick() {
        var left = Math.round((end - Date.now()) / 1000);
        if (left <= 0) {
          el.textContent = "the rate has expired; a payment that still arrives is credited at the exchange rate of the moment it is credited";
          return;
        }
        var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
        el.textContent = (h ? h + ":" + pad(m) : m) + ":" + pad(s) + " left";
        window.setTimeout(tick, 1000);
      }
      tick();
    });
  }

  var PAYMENT_WORDS = {
    awaiting_payment: "waiting for your payment",
    seen: "seen, waiting for confirmations",
    confirmed: "confirmed and credited"
  };

  function setField(root, name, text) {
    var el = root.querySelector('[data-field="' + name + '"]');
    if (el && el.textContent !== text) el.textContent = text;
    return el;
  }

  function setupTopupPolling() {
    var root = document.querySelector("[data-poll]");
    if (!root) return;
    var url = root.getAttribute("data-poll");
    var coinUnit = (root.querySelector('[data-field="amount_received"]') || {textContent: ""}).textContent.split(" ").pop();
    function poll() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.json(); })
        .then(function (t) {
          var status = setField(root, "status", t.status);
          if (status) status.className = "status status-" + t.status;
          setField(root, "payment_status", PAYMENT_WORDS[t.payment_status] || t.payment_status);
          if (t.confirmations !== null) {
            setField(root, "confirmations", t.confirmations + " of " + t.confirmations_required);
          }
          setField(root, "amount_received", t.amount_received + " " + coinUnit);
          setField(root, "credited_usd", t.credited_text);  // formatted by the server, as the page prints it
          if (t.status === "pending") {
            window.setTimeout(poll, 5000);
          } else {
            window.location.reload();  // completed, expired or cancelled: show the final page
          }
        })
        .catch(function () { window.setTimeout(poll, 10000); });
    }
    window.setTimeout(poll, 3000);
  }

  function setupServerPolling() {
    var root = document.querySelector("[data-poll-server]");
    if (!root) return;
    var url = root.getAttribute("data-poll-server");
    var was = root.getAttribute("data-status");
    function poll() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { if (!r.ok) throw new Error(String(r.status)); return r.json(); })
        .then(function (s) {
          if (s.status !== was) {
            window.location.replace(window.location.pathname);  // active (or failed): what can be done now
          } else {
            window.setTimeout(poll, 2000);
          }
        })
        .catch(function () { window.setTimeout(poll, 5000); });
    }
    window.setTimeout(poll, 2000);
  }

  function setupPrice() {
    var form = document.querySelector("form[data-pricing]");
    if (!form) return;
    var pricing = JSON.parse(form.getAttribute("data-pricing"));
    var balanceEl = document.getElementById("order-balance");
    var balance = balanceEl ? Number(balanceEl.getAttribute("data-balance")) : NaN;
    var priceEl = document.getElementById("price");
    var cycleEl = document.getElementById("price-cycle");
    var warnEl = document.getElementById("price-warning");
    function update() {
      var plan = form.elements.plan.value, location = form.elements.location.value;
      var cycle = (form.querySelector('input[name="cycle"]:checked') || {value: "monthly"}).value;
      var entry = pricing[plan + ":" + location];
      if (!entry) return;
      var annual = cycle === "annual";
      priceEl.textContent = entry[annual ? "annual" : "monthly"];  // formatted by the server, as the page prints it
      cycleEl.textContent = annual ? "per year" : "per month";
      if (warnEl) warnEl.hidden = !(Number(entry[annual ? "annual_usd" : "monthly_usd"]) > balance);
    }
    form.addEventListener("change", update);
    update();
  }

  function setupRenewQuote() {
    // The renewal's price for the number of cycles typed, from the API's quote (the server words it).
    var form = document.querySelector("form[data-quote]");
    if (!form) return;
    var url = form.getAttribute("data-quote");
    var input = form.elements.periods, quoted = form.elements.quoted;
    var text = form.querySelector('[data-field="quote"]');
    var label = form.querySelector('[data-field="renew-label"]');
    var asked = 0;
    function update() {
      var periods = input.value.trim();
      if (!/^[0-9]{1,4}$/.test(periods)) return;
      var mine = ++asked;
      fetch(url + "?periods=" + periods, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { return r.json(); })
        .then(function (q) {
          if (mine !== asked) return;  // a newer question is on its way
          text.textContent = q.text;
          if (q.ok) {
            quoted.value = String(q.periods);  // the price shown is for this many: renewing pays it
            label.textContent = q.label;
          }
        })
        .catch(function () {});
    }
    input.addEventListener("input", update);
    input.addEventListener("change", update);
  }

  document.addEventListener("DOMContentLoaded", function () {
    setupCopy();
    setupCountdown();
    setupTopupPolling();
    setupServerPolling();
    setupPrice();
    setupRenewQuote();
  });
})();
