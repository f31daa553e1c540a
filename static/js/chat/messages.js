/* The message list: each message drawn as an article (a user's words, or a reply's parts) in
 * position order, redrawn when its data changes, and the whole branch replaced at once.
 */
import { render as renderMarkdown } from "../markdown.js";
import { el, emptyState, list } from "./page.js";
import { messageHead } from "./heads.js";
import { drawPart } from "./parts.js";
import { messages, parts } from "./state.js";

function drawMessage(data) {
  const article = el("article", {
    className: "message message-" + data.role,
    "data-message-id": data.id,
    "data-role": data.role,
    "data-status": data.status || null,
  });
  article.appendChild(messageHead(data));
  if (data.role === "user") {
    const body = el("div", { className: "md user-text" });
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
  const box = el("div", { className: "parts" });
  data.parts.slice().sort(function (a, b) { return a.index - b.index; }).forEach(function (part) {
    box.appendChild(drawPart(part));
  });
  article.appendChild(box);
  return article;
}

function placeMessage(entry) {
  // Keep articles in position order; a new one normally goes last.
  let after = null;
  messages.forEach(function (other) {
    if (other !== entry && other.el.parentNode === list && other.data.position < entry.data.position) {
      if (!after || other.data.position > after.data.position) { after = other; }
    }
  });
  const anchor = after ? after.el.nextSibling : list.firstChild;
  if (entry.el.parentNode !== list || entry.el.previousSibling !== (after ? after.el : null)) {
    list.insertBefore(entry.el, anchor);
  }
}

export function setMessage(data) {
  const existing = messages.get(data.id);
  if (existing && existing.el.parentNode === list && JSON.stringify(existing.data) === JSON.stringify(data)) {
    return existing; // unchanged (a reconnect's snapshot): keep the drawing, and its image
  }
  const fresh = drawMessage(data);
  if (existing && existing.el.parentNode) { existing.el.replaceWith(fresh); }
  const entry = { data: data, el: fresh };
  messages.set(data.id, entry);
  data.parts.forEach(function (part) { parts.set(part.id, part); });
  placeMessage(entry);
  if (emptyState) { emptyState.hidden = messages.size > 0; }
  return entry;
}

// The messages on screen become `shown` (a snapshot, or another branch): the rest go.
export function showOnly(shown) {
  const seen = new Set();
  shown.forEach(function (data) { seen.add(data.id); setMessage(data); });
  messages.forEach(function (entry, id) {
    if (!seen.has(id)) { entry.el.remove(); messages.delete(id); }
  });
}

// A message's data for one of its head's buttons.
export function messageOf(button) {
  return messages.get(Number(button.closest("article").dataset.messageId)).data;
}

export function redrawHead(entry) {
  const head = entry.el.querySelector(".message-head");
  head.replaceWith(messageHead(entry.data));
  if (entry.data.status) { entry.el.dataset.status = entry.data.status; }
}

export function redrawPart(part) {
  const entry = messages.get(part.message_id);
  if (!entry) { return; }
  const old = entry.el.querySelector('[data-part-id="' + part.id + '"]');
  const img = old && old.querySelector("img");
  if (img && part.state === "succeeded" && img.getAttribute("src") === part.image_url) {
    return; // already showing this image: do not reload it
  }
  const fresh = drawPart(part);
  if (old) { old.replaceWith(fresh); }
  else { entry.el.querySelector(".parts").appendChild(fresh); }
}
