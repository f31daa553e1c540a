/* Tandem's conversation page: the live socket, the composer; Markdown is markdown.js's,
 * copy buttons copy.js's, Esc shortcuts.js's.
 *
 * Hand-written, no build step. Everything the server or the model sends is escaped first
 * (static/js/markdown.js renders text through markdown-it and DOMPurify: safe tags only).
 */
(function () {
  "use strict";

  var renderMarkdown = window.TandemMarkdown.render;  // static/js/markdown.js
  var drawMarkdown = window.TandemMarkdown.draw;

  // ------------------------------------------------------------------ the conversation page

  var root = document.getElementById("chat");
  if (!root) { return; }

  // A new conversation has no id (and no row) until its first message is sent.
  var conversationId = Number(root.dataset.conversationId) || null;
  var turnsUrl = root.dataset.turnsUrl;
  var withId = function (template, id) { return template.replace("/0/", "/" + id + "/"); };
  var stopUrl = function (id) { return withId(root.dataset.stopUrl, id); };
  var retryUrl = function (id) { return withId(root.dataset.retryUrl, id); };
  var newImageUrl = function (id) { return withId(root.dataset.newImageUrl, id); };
  var regenerateUrl = function (id) { return withId(root.dataset.regenerateUrl, id); };
  var versionUrl = function (id) { return withId(root.dataset.versionUrl, id); };
  var editUrl = function (id) { return withId(root.dataset.editUrl, id); };
  var branchUrl = function (id) { return withId(root.dataset.branchUrl, id); };
  var list = document.getElementById("messages");
  var emptyState = document.getElementById("empty-state");
  var composer = document.getElementById("composer");
  var textarea = composer.querySelector("textarea");
  var imageToggle = composer.querySelector("input[name=image]");
  var sendButton = composer.querySelector("button.send");
  var notice = document.getElementById("composer-notice");
  var connection = document.getElementById("connection");

  var messages = new Map(); // message id -> {data, el}
  var parts = new Map(); // part id -> part payload (the live copy)
  var pending = new Map(); // message id -> events that arrived before its 201 response

  // Exposed for tests and debugging: the raw text the page holds for each part.
  window.tandem = {
    partText: function (id) { var p = parts.get(Number(id)); return p ? p.text : null; },
    partSeq: function (id) { var p = parts.get(Number(id)); return p ? p.seq : null; },
  };

  function csrfToken() {
    var match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
    if (match) { return decodeURIComponent(match[1]); }
    var field = document.querySelector("input[name=csrfmiddlewaretoken]"); // an HttpOnly cookie
    return field ? field.value : "";
  }

  function post(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify(body || {}),
    });
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (key) {
      if (key === "text") { node.textContent = attrs[key]; }
      else if (key === "className") { node.className = attrs[key]; }
      else if (attrs[key] !== null && attrs[key] !== undefined && attrs[key] !== false) {
        node.setAttribute(key, attrs[key]);
      }
    });
    (children || []).forEach(function (child) { if (child) { node.appendChild(child); } });
    return node;
  }

  // -------------------------------------------------------------- scrolling

  function nearBottom() {
    return list.scrollHeight - list.scrollTop - list.clientHeight < 120;
  }
  function toBottom() { list.scrollTop = list.scrollHeight; }
  function keepingScroll(change) {
    var stick = nearBottom();
    change();
    if (stick) { toBottom(); }
  }

  // -------------------------------------------------------------- drawing

  var TEXT_STATUS = {
    queued: "waiting…",
    cancelled: "stopped",
    interrupted: "interrupted — the server restarted",
  };

  function drawTextBody(part, node) {
    var md = node.querySelector(".md");
    var oldCaret = md.querySelector(".caret");
    if (oldCaret) { oldCaret.remove(); }
    drawMarkdown(md, part.text); // keeps the finished blocks' DOM
    if (part.state === "streaming") {
      // The caret sits at the end of the text, inside its last paragraph, item or code block.
      var caret = el("span", { className: "caret", "aria-hidden": "true" });
      var last = md.lastElementChild;
      while (last && /^(UL|OL)$/.test(last.tagName) && last.lastElementChild) { last = last.lastElementChild; }
      if (last && last.classList.contains("code-block")) { last = last.querySelector("pre code"); }
      if (last && last.classList.contains("table-wrap")) { last = null; }
      (last && last.tagName !== "HR" ? last : md).appendChild(caret);
    }
    node.dataset.seq = String(part.seq);
  }

  function textStatus(part) {
    if (part.state === "failed") {
      return el("p", { className: "part-status is-failed" }, [
        el("strong", { text: "The text failed: " }),
        document.createTextNode(part.error || "unknown error"),
      ]);
    }
    var words = TEXT_STATUS[part.state];
    if (!words && part.state === "succeeded" && part.finish_reason === "length") {
      words = "stopped at the length limit";
    }
    if (!words) { return null; }
    return el("p", { className: "part-status is-" + part.state, text: words });
  }

  function textPart(part) {
    var node = el("div", {
      className: "part part-text",
      "data-part-id": part.id,
      "data-kind": "text",
      "data-state": part.state,
    }, [el("div", { className: "md" })]);
    drawTextBody(part, node);
    var status = textStatus(part);
    if (status) { node.appendChild(status); }
    return node;
  }

  function progressBar(fraction, label) {
    var pct = Math.max(0, Math.min(100, Math.round((fraction || 0) * 100)));
    var bar = el("div", {
      className: "progress",
      role: "progressbar",
      "aria-valuemin": "0",
      "aria-valuemax": "100",
      "aria-valuenow": String(pct),
      "aria-label": label,
    }, [el("div", { className: "progress-fill" })]);
    bar.firstChild.style.width = pct + "%";
    return bar;
  }

  function safeImageUrl(url) {
    return typeof url === "string" && (/^\/(?!\/)/.test(url) || /^https?:\/\//i.test(url));
  }

  function imagePart(part) {
    var node = el("div", {
      className: "part part-image",
      "data-part-id": part.id,
      "data-kind": "image",
      "data-state": part.state,
      "data-attempt": part.attempt,
    });
    if (part.state === "succeeded" && safeImageUrl(part.image_url)) {
      node.appendChild(picture(part.image_url, "The generated image"));
      var again = el("button", { type: "button", className: "new-image", text: "New image" });
      again.addEventListener("click", function () { newImage(part.id, again); });
      node.appendChild(el("div", { className: "image-actions" }, [
        again,
        part.attempt > 1 ? el("span", { className: "muted small", text: "attempt " + part.attempt }) : null,
      ]));
      return node;
    }
    // "New image": the old picture stays on screen while the new one is drawn, and if it fails.
    var previous = safeImageUrl(part.previous_image_url) ? part.previous_image_url : null;
    if (previous) {
      node.dataset.previous = "true";
      node.appendChild(picture(previous, "The previous image"));
    }
    if (previous && (part.state === "queued" || part.state === "running")) {
      var done = Math.round((part.progress || 0) * 100);
      node.appendChild(el("div", { className: "redraw-status" }, [
        el("p", {
          className: "part-status is-" + part.state,
          text: part.state === "queued" ? "New image waiting for a worker…" : "Drawing a new image… " + done + "%",
        }),
        progressBar(part.progress, "New image progress"),
      ]));
      return node;
    }
    if (part.state === "queued" || part.state === "running") {
      var pct = Math.round((part.progress || 0) * 100);
      var words = part.state === "queued"
        ? "Image waiting for a worker…"
        : "Drawing the image… " + pct + "%";
      node.appendChild(el("div", { className: "image-placeholder" }, [
        el("div", { className: "image-placeholder-art", "aria-hidden": "true" }),
        el("p", { className: "part-status is-" + part.state, text: words }),
        progressBar(part.progress, "Image progress"),
        part.attempt > 1 ? el("p", { className: "muted small", text: "Attempt " + part.attempt }) : null,
      ]));
      return node;
    }
    // failed, cancelled, interrupted: a card with the reason and a retry button.
    var title = {
      failed: previous ? "The new image failed" : "The image failed",
      cancelled: previous ? "The new image was stopped" : "The image was stopped",
      interrupted: "The image was interrupted",
    }[part.state] || "No image";
    var reason = part.error || (part.state === "cancelled" ? "You stopped it before it finished." : "");
    var retry = el("button", { type: "button", className: "retry-image", text: "Retry image" });
    retry.addEventListener("click", function () { retryImage(part.id, retry); });
    node.appendChild(el("div", { className: "failure-card", role: "group", "aria-label": title }, [
      el("p", { className: "failure-title", text: title }),
      reason ? el("p", { className: "failure-reason", text: reason }) : null,
      el("div", { className: "failure-actions" }, [
        retry,
        part.attempt > 1 ? el("span", { className: "muted small", text: "attempt " + part.attempt }) : null,
      ]),
      el("p", { className: "failure-notice", role: "status", hidden: "" }),
    ]));
    return node;
  }

  function picture(url, words) {
    var img = el("img", { alt: words, loading: "lazy" });
    img.src = url;
    return el("figure", { className: "image-frame" }, [
      el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, [img]),
    ]);
  }

  function drawPart(part) {
    return part.kind === "image" ? imagePart(part) : textPart(part);
  }

  function messageHead(data) {
    var head = el("div", { className: "message-head" }, [
      el("span", { className: "author", text: data.role === "user" ? "You" : "Tandem" }),
    ]);
    if (data.role === "user") {
      if (data.wants_image) { head.appendChild(el("span", { className: "chip", text: "with image" })); }
      branchControls(data, head);
      head.appendChild(copyMessageButton(data));
      return head;
    }
    if (data.status === "partial") {
      head.appendChild(el("span", {
        className: "badge badge-partial",
        title: "One part of this reply finished and another did not.",
        text: "partial",
      }));
    } else if (data.status === "failed") {
      var has = function (state) { return data.parts.some(function (p) { return p.state === state; }); };
      head.appendChild(has("failed") ? el("span", { className: "badge badge-failed", text: "failed" })
        : has("interrupted") ? el("span", { className: "badge badge-failed", text: "interrupted" })
          : el("span", { className: "badge badge-stopped", text: "stopped" }));
    }
    if ((data.versions || 1) > 1) { head.appendChild(versionNav(data)); }
    if (data.status === "in_progress") {
      var stop = el("button", { type: "button", className: "stop", text: "Stop" });
      stop.addEventListener("click", function () { stopMessage(data.id, stop); });
      head.appendChild(stop);
    } else if (data.status) {
      var again = el("button", { type: "button", className: "regenerate", text: "Regenerate" });
      again.addEventListener("click", function () { regenerate(data.id, again); });
      head.appendChild(again);
    }
    head.appendChild(copyMessageButton(data));
    return head;
  }

  function copyMessageButton(data) {
    // Copies the Markdown source: the user's words, or the shown version's text as it stands.
    var words = data.role === "user" ? "Copy your message" : "Copy the reply's text";
    return window.TandemCopy.button("Copy", words, function () { // static/js/copy.js
      if (data.role === "user") { return data.text; }
      var text = data.parts.filter(function (p) { return p.kind === "text"; })[0];
      var live = text && parts.get(text.id);
      return live ? live.text : "";
    });
  }

  function stepper(kind, current, count, busy, show) {
    // "‹ 2 / 3 ›" between the versions of a reply or the branches of an edited message;
    // `show(n, button)` asks the server for the one to put on screen (and in the history).
    var step = function (label, words, to) {
      var button = el("button", {
        type: "button", className: "version-step " + kind + "-step", text: label, "aria-label": words,
        disabled: busy || to < 1 || to > count ? "" : null,
      });
      button.addEventListener("click", function () { show(to, button); });
      return button;
    };
    var plural = kind === "branch" ? "branches" : "versions";
    var group = kind === "branch" ? "Branches from this message" : "Versions of this reply";
    return el("span", { className: "versions " + plural, role: "group", "aria-label": group }, [
      step("‹", "Previous " + kind, current - 1),
      el("span", { className: "version-label " + kind + "-label", text: current + " / " + count }),
      step("›", "Next " + kind, current + 1),
    ]);
  }

  function versionNav(data) {
    // The versions of a regenerated reply; the one shown is the model's history.
    return stepper("version", data.version, data.versions, data.status === "in_progress",
      function (to, button) { showVersion(data.id, to, button); });
  }

  // -------------------------------------------------------------- branches (edit and resend)

  function branchControls(data, head) {
    // A user message's "‹ 2 / 3 ›" (its edits, each a branch) and its Edit button.
    if ((data.branches || 1) > 1) { head.appendChild(branchNav(data)); }
    var edit = el("button", { type: "button", className: "edit-message", text: "Edit" });
    edit.addEventListener("click", function () { startEdit(data, edit); });
    head.appendChild(edit);
  }

  function branchNav(data) {
    // Drawn like the versions of a reply; the branch shown is the model's history.
    return stepper("branch", data.branch, data.branches, false,
      function (to, button) { showBranch(data.id, to, button); });
  }

  function startEdit(data, button) {
    // The bubble becomes a box with the words to change; sending starts a new branch.
    var article = button.closest("article");
    var bubble = article.querySelector(".bubble");
    if (article.querySelector(".edit-form")) { return; }
    var box = el("textarea", { className: "edit-text", rows: "3", "aria-label": "Edit your message" });
    box.value = data.text;
    var error = el("p", { className: "inline-error edit-error", role: "status", hidden: "" });
    var submit = el("button", { type: "submit", className: "small-button", text: "Send" });
    var cancel = el("button", { type: "button", className: "small-button quiet", text: "Cancel" });
    var form = el("form", { className: "edit-form", "aria-label": "Edit your message" }, [
      box,
      el("div", { className: "edit-actions" }, [
        el("span", { className: "muted small", text: "Sends it as a new branch; this one is kept." }),
        cancel,
        submit,
      ]),
      error,
    ]);
    var end = function () { form.remove(); bubble.hidden = false; button.hidden = false; button.focus(); };
    bubble.hidden = true;
    button.hidden = true;
    bubble.after(form);
    cancel.addEventListener("click", end);
    box.addEventListener("keydown", function (event) {
      if (event.key === "Escape") { event.preventDefault(); event.stopPropagation(); end(); }
      else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        form.requestSubmit();
      }
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      sendEdit(data.id, box, submit, error);
    });
    box.focus();
  }

  function sendEdit(messageId, box, button, error) {
    var fail = function (words) {
      button.disabled = false;
      button.textContent = "Send";
      error.hidden = false;
      error.textContent = words;
      box.setAttribute("aria-invalid", "true");
    };
    if (!box.value.trim()) { fail("Write a message first."); return; }
    button.disabled = true;
    button.textContent = "Sending…";
    post(editUrl(messageId), { text: box.value }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 201) { applySnapshot(body.messages); toBottom(); return; }
        fail(errorText(response, body, "The edit was not sent"));
      });
    }, function () { fail("Could not reach the server; the edit was not sent."); });
  }

  function showBranch(messageId, branch, button) {
    button.disabled = true;
    post(branchUrl(messageId), { branch: branch }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 200) { applySnapshot(body.messages); return; }
        button.disabled = false;
        showNotice("error", errorText(response, body, "That branch could not be shown"));
      });
    }, function () { button.disabled = false; showNotice("error", "Could not reach the server."); });
  }

  function drawMessage(data) {
    var article = el("article", {
      className: "message message-" + data.role,
      "data-message-id": data.id,
      "data-role": data.role,
      "data-status": data.status || null,
    });
    article.appendChild(messageHead(data));
    if (data.role === "user") {
      var body = el("div", { className: "md user-text" });
      body.innerHTML = renderMarkdown(data.text);
      article.appendChild(el("div", { className: "bubble" }, [body]));
      return article;
    }
    if (data.history_truncated) {
      article.appendChild(el("p", {
        className: "note history-note",
        text: "Older messages were left out to fit the model's context.",
      }));
    }
    var box = el("div", { className: "parts" });
    data.parts.slice().sort(function (a, b) { return a.index - b.index; }).forEach(function (part) {
      box.appendChild(drawPart(part));
    });
    article.appendChild(box);
    return article;
  }

  function placeMessage(entry) {
    // Keep articles in position order; a new one normally goes last.
    var after = null;
    messages.forEach(function (other) {
      if (other !== entry && other.el.parentNode === list && other.data.position < entry.data.position) {
        if (!after || other.data.position > after.data.position) { after = other; }
      }
    });
    var anchor = after ? after.el.nextSibling : list.firstChild;
    if (entry.el.parentNode !== list || entry.el.previousSibling !== (after ? after.el : null)) {
      list.insertBefore(entry.el, anchor);
    }
  }

  function setMessage(data) {
    var existing = messages.get(data.id);
    if (existing && existing.el.parentNode === list && JSON.stringify(existing.data) === JSON.stringify(data)) {
      return existing; // unchanged (a reconnect's snapshot): keep the drawing, and its image
    }
    var fresh = drawMessage(data);
    if (existing && existing.el.parentNode) { existing.el.replaceWith(fresh); }
    var entry = { data: data, el: fresh };
    messages.set(data.id, entry);
    data.parts.forEach(function (part) { parts.set(part.id, part); });
    placeMessage(entry);
    if (emptyState) { emptyState.hidden = messages.size > 0; }
    return entry;
  }

  function redrawHead(entry) {
    var head = entry.el.querySelector(".message-head");
    head.replaceWith(messageHead(entry.data));
    if (entry.data.status) { entry.el.dataset.status = entry.data.status; }
  }

  function redrawPart(part) {
    var entry = messages.get(part.message_id);
    if (!entry) { return; }
    var old = entry.el.querySelector('[data-part-id="' + part.id + '"]');
    var img = old && old.querySelector("img");
    if (img && part.state === "succeeded" && img.getAttribute("src") === part.image_url) {
      return; // already showing this image: do not reload it
    }
    var fresh = drawPart(part);
    if (old) { old.replaceWith(fresh); }
    else { entry.el.querySelector(".parts").appendChild(fresh); }
  }

  // -------------------------------------------------------------- live events

  function applySnapshot(list_) {
    keepingScroll(function () {
      var seen = new Set();
      list_.forEach(function (data) { seen.add(data.id); setMessage(data); });
      messages.forEach(function (entry, id) {
        if (!seen.has(id)) { entry.el.remove(); messages.delete(id); }
      });
      pending.forEach(function (events, messageId) {
        pending.delete(messageId);
        if (messages.has(messageId)) { events.forEach(handleEvent); }
      });
    });
  }

  function deferIfUnknown(messageId, event) {
    if (messages.has(messageId)) { return false; }
    // Events can outrun this page's own 201 answer: keep them until it has been drawn.
    var queue = pending.get(messageId) || [];
    if (queue.length < 5000) { queue.push(event); }
    pending.set(messageId, queue);
    if (!sending) { resync("a reply created elsewhere"); }
    return true;
  }

  function onDelta(event) {
    if (deferIfUnknown(event.message_id, event)) { return; }
    var part = parts.get(event.part_id);
    // A delta carries pieces first..seq of its part (the server gathers a few at a time).
    var first = event.first === undefined ? event.seq : event.first;
    if (!part || event.seq <= part.seq) { return; } // already have it (snapshot or earlier)
    // The server mends gaps from the live tail; one that still shows means start over.
    if (first !== part.seq + 1) { resync("missed text pieces"); return; }
    part.text += event.text;
    part.seq = event.seq;
    var node = document.querySelector('[data-part-id="' + part.id + '"]');
    if (part.state === "queued") {
      part.state = "streaming";
      keepingScroll(function () { redrawPart(part); });
      return;
    }
    if (node) { drawOnNextFrame(part); }
  }

  // A streaming text is redrawn at most once per animation frame, however many pieces came.
  var dirtyParts = new Set();
  var frameAsked = false;

  function drawOnNextFrame(part) {
    dirtyParts.add(part.id);
    if (frameAsked) { return; }
    frameAsked = true;
    requestAnimationFrame(function () {
      frameAsked = false;
      var ids = Array.from(dirtyParts);
      dirtyParts.clear();
      keepingScroll(function () {
        ids.forEach(function (id) {
          var current = parts.get(id);
          var node = document.querySelector('.part-text[data-part-id="' + id + '"]');
          if (current && node && current.state === node.dataset.state) { drawTextBody(current, node); }
        });
      });
    });
  }

  function onPartState(event) {
    var incoming = event.part;
    if (deferIfUnknown(incoming.message_id, event)) { return; }
    var owner = messages.get(incoming.message_id).data;
    if (owner.version !== undefined && incoming.version !== owner.version) { return; } // not shown
    var part = parts.get(incoming.id);
    if (!part) {
      part = incoming;
      parts.set(part.id, part);
      messages.get(part.message_id).data.parts.push(part);
    } else {
      ["state", "progress", "error", "attempt", "image_url", "previous_image_url", "finish_reason"].forEach(function (key) {
        part[key] = incoming[key];
      });
      if (incoming.seq >= part.seq) { part.text = incoming.text; part.seq = incoming.seq; }
    }
    keepingScroll(function () { redrawPart(part); });
  }

  function onMessageUpdate(event) {
    // Another version of a reply is shown (regenerated, or browsed here or in another tab).
    if (deferIfUnknown(event.message.id, event)) { return; }
    keepingScroll(function () { setMessage(event.message); });
  }

  function onMessageState(event) {
    if (deferIfUnknown(event.message_id, event)) { return; }
    var entry = messages.get(event.message_id);
    entry.data.status = event.status;
    redrawHead(entry);
  }

  function handleEvent(event) {
    switch (event.type) {
      case "snapshot": applySnapshot(event.messages); break;
      case "part.delta": onDelta(event); break;
      case "part.state": onPartState(event); break;
      case "message.state": onMessageState(event); break;
      case "message.update": onMessageUpdate(event); break;
      case "conversation.branch": applySnapshot(event.messages); break; // edited or browsed
      case "conversation.state":
        showTitle(event.conversation.title);
        showSettings(event.conversation.settings);
        break;
      case "conversation.deleted": onDeleted(); break;
      default: break;
    }
  }

  // -------------------------------------------------------------- the socket

  var socket = null;
  var attempts = 0;
  var retryTimer = null;
  var lastResync = 0;

  function setConnection(state, words) {
    connection.dataset.connection = state;
    connection.textContent = words;
  }

  function stopped(words) {
    socket = null;
    setConnection("closed", words);
  }

  function reconnectLater() {
    attempts += 1;
    var delay = Math.min(10000, 500 * Math.pow(2, attempts - 1)) * (0.8 + Math.random() * 0.4);
    setConnection("connecting", "connection lost — reconnecting…");
    retryTimer = setTimeout(connect, delay);
  }

  function connect() {
    clearTimeout(retryTimer);
    var scheme = location.protocol === "https:" ? "wss:" : "ws:";
    var ws = new WebSocket(scheme + "//" + location.host + "/ws/conversations/" + conversationId + "/");
    var opened = false;
    socket = ws;
    setConnection("connecting", attempts ? "reconnecting…" : "connecting…");
    ws.onopen = function () { opened = true; attempts = 0; setConnection("open", "live"); };
    ws.onmessage = function (message) {
      if (ws !== socket) { return; }
      var event;
      try { event = JSON.parse(message.data); } catch (e) { return; }
      handleEvent(event);
    };
    ws.onclose = function (close) {
      if (ws !== socket) { return; }
      socket = null;
      if (close.code === 4401) { stopped("signed out — reload the page to sign in"); return; }
      if (close.code === 4404) { stopped("this conversation is not available"); return; }
      if (opened) { reconnectLater(); return; }
      // Refused before it opened: a browser cannot see why, so ask the page itself.
      fetch(location.pathname, { credentials: "same-origin", redirect: "follow" })
        .then(function (response) {
          if (response.status === 404) { stopped("this conversation is not available"); }
          else if (response.redirected && /\/accounts\/login\//.test(response.url)) {
            stopped("signed out — reload the page to sign in");
          } else { reconnectLater(); }
        }, reconnectLater);
    };
  }

  var resyncTimer = null;

  function resync(why) {
    // Missed text pieces, or a reply this page never saw created (another tab sent it):
    // start over from a fresh snapshot, at most once a second.
    if (resyncTimer) { return; }
    resyncTimer = setTimeout(function () {
      resyncTimer = null;
      lastResync = Date.now();
      var old = socket;
      socket = null;
      if (old) { try { old.close(4000, why); } catch (e) { /* already closing */ } }
      connect();
    }, Math.max(0, lastResync + 1000 - Date.now()));
  }

  window.addEventListener("online", function () { if (!socket && conversationId && !deleted) { connect(); } });

  // -------------------------------------------------------------- actions

  function showNotice(kind, words) {
    notice.hidden = !words;
    notice.dataset.kind = kind || "";
    notice.textContent = words || "";
    textarea.setAttribute("aria-invalid", kind === "error" ? "true" : "false");
  }

  function errorText(response, body, fallback) {
    return (body && typeof body.error === "string" && body.error) || fallback + " (HTTP " + response.status + ")";
  }

  var sending = false;
  var holdUntil = 0;
  var holdTimer = null;

  function holdSend(seconds) {
    holdUntil = Date.now() + seconds * 1000;
    clearInterval(holdTimer);
    var tick = function () {
      var left = Math.ceil((holdUntil - Date.now()) / 1000);
      if (left <= 0) {
        clearInterval(holdTimer);
        sendButton.disabled = sending;
        sendButton.textContent = "Send";
        return;
      }
      sendButton.disabled = true;
      sendButton.textContent = "Wait " + left + " s";
    };
    tick();
    holdTimer = setInterval(tick, 250);
  }

  // -------------------------------------------------------------- the conversation itself

  var titleNode = document.getElementById("conversation-title");
  var actions = document.getElementById("chat-actions");
  var renameForm = document.getElementById("rename-form");
  var renameInput = document.getElementById("rename-input");
  var renameError = document.getElementById("rename-error");
  var deleted = false;

  function currentLink() {
    return document.querySelector('.conversation-list a[aria-current="page"]');
  }

  function showTitle(title) {
    titleNode.textContent = title;
    titleNode.dataset.untitled = "false";
    var link = currentLink();
    if (link) { link.textContent = title; link.dataset.untitled = "false"; }
    document.title = title + " · Tandem";
  }

  function becomeConversation(conversation) {
    // The first message created the conversation: this page is now its page.
    conversationId = conversation.id;
    turnsUrl = conversation.turns_url;
    root.dataset.conversationId = String(conversation.id);
    history.replaceState(null, "", conversation.url);
    var nav = document.querySelector(".conversation-list");
    var ul = nav.querySelector("ul") || nav.appendChild(el("ul"));
    var empty = nav.querySelector(".empty-list");
    if (empty) { empty.remove(); }
    ul.insertBefore(el("li", {}, [el("a", {
      href: conversation.url,
      "data-conversation-id": conversation.id,
      "data-untitled": "false",
      "aria-current": "page",
      text: conversation.title,
    })]), ul.firstChild);
    showTitle(conversation.title);
    document.getElementById("export-md").href = withId(root.dataset.exportUrl, conversation.id);
    document.getElementById("export-json").href = withId(root.dataset.exportUrl, conversation.id).replace(/\.md$/, ".json");
    actions.hidden = false;
    connect();
  }

  function startRename() {
    renameInput.value = titleNode.textContent;
    renameError.hidden = true;
    titleNode.hidden = true;
    actions.hidden = true;
    renameForm.hidden = false;
    renameInput.focus();
    renameInput.select();
  }

  function endRename() {
    renameForm.hidden = true;
    titleNode.hidden = false;
    actions.hidden = false;
    renameInput.removeAttribute("aria-invalid");
  }

  function saveRename() {
    var button = renameForm.querySelector("button[type=submit]");
    button.disabled = true;
    post(withId(root.dataset.renameUrl, conversationId), { title: renameInput.value })
      .then(function (response) {
        return response.json().catch(function () { return null; }).then(function (body) {
          if (response.status === 200) { showTitle(body.conversation.title); endRename(); return; }
          renameError.hidden = false;
          renameError.textContent = (body && body.errors && body.errors.title) || errorText(response, body, "The title was not saved");
          renameInput.setAttribute("aria-invalid", "true");
        });
      }, function () {
        renameError.hidden = false;
        renameError.textContent = "Could not reach the server.";
      })
      .then(function () { button.disabled = false; });
  }

  document.getElementById("rename").addEventListener("click", startRename);
  document.getElementById("rename-cancel").addEventListener("click", endRename);
  renameForm.addEventListener("submit", function (event) { event.preventDefault(); saveRename(); });
  renameInput.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { event.preventDefault(); endRename(); }
  });

  var deleteButton = document.getElementById("delete");
  var deleteConfirm = document.getElementById("delete-confirm");
  deleteButton.addEventListener("click", function () {
    deleteButton.hidden = true;
    deleteConfirm.hidden = false;
    document.getElementById("delete-no").focus();
  });
  document.getElementById("delete-no").addEventListener("click", function () {
    deleteConfirm.hidden = true;
    deleteButton.hidden = false;
  });
  document.getElementById("delete-yes").addEventListener("click", function () {
    var yes = document.getElementById("delete-yes");
    yes.disabled = true;
    post(withId(root.dataset.deleteUrl, conversationId)).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 200) { deleted = true; location.assign(body.redirect); return; }
        yes.disabled = false;
        showNotice("error", errorText(response, body, "The conversation was not deleted"));
      });
    }, function () {
      yes.disabled = false;
      showNotice("error", "Could not reach the server; the conversation was not deleted.");
    });
  });

  // -------------------------------------------------------------- its settings

  var settingsForm = document.getElementById("settings-form");
  var settingsNotice = document.getElementById("settings-notice");
  var pendingSettings = null; // saved before the conversation exists: sent with its first message
  var SETTING_NAMES = ["system_prompt", "temperature", "top_p", "max_new_tokens", "image_by_default"];

  function settingsValues() {
    var values = {};
    SETTING_NAMES.forEach(function (name) {
      var field = settingsForm.elements[name];
      values[name] = field.type === "checkbox" ? field.checked : field.value;
    });
    return values;
  }

  function showSettings(values) {
    if (!values) { return; }
    SETTING_NAMES.forEach(function (name) {
      var field = settingsForm.elements[name];
      if (field === document.activeElement) { return; } // not under the user's cursor
      if (field.type === "checkbox") { field.checked = !!values[name]; }
      else { field.value = String(values[name]); }
    });
  }

  function showSettingErrors(errors) {
    settingsForm.querySelectorAll(".field-error").forEach(function (node) {
      var words = errors && errors[node.dataset.for];
      node.hidden = !words;
      node.textContent = words || "";
      var field = settingsForm.elements[node.dataset.for];
      if (words) { field.setAttribute("aria-invalid", "true"); } else { field.removeAttribute("aria-invalid"); }
    });
  }

  function saveSettings() {
    showSettingErrors(null);
    if (!conversationId) {
      // No conversation yet: these go with the first message, checked there.
      pendingSettings = settingsValues();
      imageToggle.checked = pendingSettings.image_by_default;
      settingsNotice.textContent = "Kept: they apply from the first message.";
      return;
    }
    settingsNotice.textContent = "Saving…";
    post(withId(root.dataset.settingsUrl, conversationId), settingsValues()).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 200) {
          var saved = body.conversation.settings;
          showSettings(saved);
          imageToggle.checked = saved.image_by_default;
          settingsNotice.textContent = "Saved: the next reply uses them.";
          return;
        }
        showSettingErrors(body && body.errors);
        settingsNotice.textContent = errorText(response, body, "Not saved");
      });
    }, function () { settingsNotice.textContent = "Could not reach the server; not saved."; });
  }

  settingsForm.addEventListener("submit", function (event) { event.preventDefault(); saveSettings(); });

  function onDeleted() {
    // Deleted here or in another tab: nothing more will come, and nothing can be sent.
    deleted = true;
    var old = socket;
    socket = null;
    if (old) { try { old.close(); } catch (e) { /* already closing */ } }
    setConnection("closed", "this conversation was deleted");
    actions.hidden = true;
    sendButton.disabled = true;
    textarea.disabled = true;
    showNotice("error", "This conversation was deleted.");
  }

  function send() {
    if (sending || Date.now() < holdUntil) { return; }
    var text = textarea.value;
    if (!text.trim()) { showNotice("error", "Write a message first."); textarea.focus(); return; }
    sending = true;
    sendButton.disabled = true;
    composer.setAttribute("aria-busy", "true");
    var body = { text: text, image: imageToggle.checked };
    if (!conversationId && pendingSettings) { body.settings = pendingSettings; } // created with them
    post(turnsUrl, body)
      .then(function (response) {
        return response.json().catch(function () { return null; }).then(function (body) {
          if (response.status === 201) {
            showNotice("", "");
            textarea.value = "";
            autosize();
            if (!conversationId) { becomeConversation(body.conversation); }
            else if (titleNode.dataset.untitled === "true") { showTitle(body.conversation.title); }
            keepingScroll(function () {
              [body.user, body.reply].forEach(function (data) {
                if (!messages.has(data.id)) { setMessage(data); }
                var queued = pending.get(data.id);
                if (queued) { pending.delete(data.id); queued.forEach(handleEvent); }
              });
            });
            toBottom();
            return;
          }
          if (response.status === 422 && body && body.errors) {
            showSettingErrors(body.errors);
            document.getElementById("settings-panel").open = true;
            showNotice("error", "Check the conversation's settings: " + body.error);
          } else if (response.status === 422) {
            showNotice("error", errorText(response, body, "That message can't be sent"));
          } else if (response.status === 429) {
            var wait = parseInt(response.headers.get("Retry-After") || "5", 10) || 5;
            showNotice("busy", errorText(response, body, "The engine is busy") + " You can send again in " + wait + " s.");
            holdSend(Math.min(wait, 60));
          } else if (response.status === 503) {
            var later = parseInt(response.headers.get("Retry-After") || "5", 10) || 5;
            showNotice("busy", errorText(response, body, "The model is still loading"));
            holdSend(Math.min(later, 60));
          } else if (response.status === 403) {
            showNotice("error", "Your session has expired; reload the page and sign in again.");
          } else {
            showNotice("error", errorText(response, body, "Something went wrong"));
          }
        });
      })
      .catch(function () {
        showNotice("error", "Could not reach the server; check your connection and try again.");
      })
      .then(function () {
        sending = false;
        if (pending.size) { resync("a reply created elsewhere"); }
        composer.removeAttribute("aria-busy");
        if (Date.now() >= holdUntil) { sendButton.disabled = false; }
      });
  }

  function stopMessage(messageId, button) {
    button.disabled = true;
    button.textContent = "Stopping…";
    post(stopUrl(messageId)).then(function (response) {
      if (response.status !== 202) {
        button.disabled = false;
        button.textContent = "Stop";
      }
    }, function () { button.disabled = false; button.textContent = "Stop"; });
  }

  function regenerate(messageId, button) {
    button.disabled = true;
    button.textContent = "Regenerating…";
    post(regenerateUrl(messageId)).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 202) {
          keepingScroll(function () { setMessage(body.message); });
          return;
        }
        button.disabled = false;
        button.textContent = "Regenerate";
        showNotice(response.status === 409 ? "error" : "busy", errorText(response, body, "The reply was not regenerated"));
      });
    }, function () {
      button.disabled = false;
      button.textContent = "Regenerate";
      showNotice("error", "Could not reach the server; the reply was not regenerated.");
    });
  }

  function showVersion(messageId, version, button) {
    button.disabled = true;
    post(versionUrl(messageId), { version: version }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 200) { keepingScroll(function () { setMessage(body.message); }); return; }
        button.disabled = false;
        showNotice("error", errorText(response, body, "That version could not be shown"));
      });
    }, function () { button.disabled = false; });
  }

  function newImage(partId, button) {
    button.disabled = true;
    button.textContent = "Starting…";
    post(newImageUrl(partId)).then(function (response) {
      if (response.status === 202) { return; } // the new attempt arrives over the socket
      return response.json().catch(function () { return null; }).then(function (body) {
        button.disabled = false;
        button.textContent = "New image";
        showNotice("error", errorText(response, body, "A new image could not be started"));
      });
    }, function () {
      button.disabled = false;
      button.textContent = "New image";
      showNotice("error", "Could not reach the server.");
    });
  }

  function retryImage(partId, button) {
    var card = button.closest(".failure-card");
    var say = card.querySelector(".failure-notice");
    button.disabled = true;
    button.textContent = "Retrying…";
    post(retryUrl(partId)).then(function (response) {
      if (response.status === 202) { return; } // the new state arrives over the socket
      return response.json().catch(function () { return null; }).then(function (body) {
        button.disabled = false;
        button.textContent = "Retry image";
        say.hidden = false;
        say.textContent = errorText(response, body, "The image could not be retried");
      });
    }, function () {
      button.disabled = false;
      button.textContent = "Retry image";
      say.hidden = false;
      say.textContent = "Could not reach the server.";
    });
  }

  // -------------------------------------------------------------- the composer

  function autosize() {
    textarea.style.height = "auto";
    textarea.style.height = Math.min(textarea.scrollHeight + 2, 240) + "px";
  }

  textarea.addEventListener("keydown", function (event) {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey && !event.ctrlKey && !event.metaKey) {
      event.preventDefault();
      send();
    }
  });
  textarea.addEventListener("input", function () {
    autosize();
    if (notice.dataset.kind === "error") { showNotice("", ""); }
  });
  composer.addEventListener("submit", function (event) { event.preventDefault(); send(); });

  // -------------------------------------------------------------- start

  var initial = JSON.parse(document.getElementById("initial-messages").textContent || "[]");
  applySnapshot(initial);
  toBottom();
  if (conversationId) { connect(); }
  textarea.focus();
})();
