/* The conversation page's elements and URLs, and the helpers every chat module uses: el() to
 * build nodes, post() for the JSON actions, the notice line under the composer, scrolling.
 *
 * Hand-written, no build step. Everything the server or the model sends is escaped first
 * (static/js/markdown.js renders text through markdown-it and DOMPurify: safe tags only).
 */

export const root = document.getElementById("chat");
export const list = document.getElementById("messages");
export const emptyState = document.getElementById("empty-state");
export const composer = document.getElementById("composer");
export const textarea = composer.querySelector("textarea");
export const imageToggle = composer.querySelector("input[name=image]");
export const sendButton = composer.querySelector("button.send");
const notice = document.getElementById("composer-notice");

// An action's URL: the page carries each one with 0 for the id (data-stop-url, …).
export function urlFor(name, id) {
  return root.dataset[name + "Url"].replace("/0/", "/" + id + "/");
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  if (match) { return decodeURIComponent(match[1]); }
  const field = document.querySelector("input[name=csrfmiddlewaretoken]"); // an HttpOnly cookie
  return field ? field.value : "";
}

export function post(url, body) {
  return fetch(url, {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
    body: JSON.stringify(body || {}),
  });
}

export function errorText(response, body, fallback) {
  return (body && typeof body.error === "string" && body.error) || fallback + " (HTTP " + response.status + ")";
}

export function el(tag, attrs, children) {
  const node = document.createElement(tag);
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

// The line under the composer: errors, "the engine is busy", …
export function showNotice(kind, words) {
  notice.hidden = !words;
  notice.dataset.kind = kind || "";
  notice.textContent = words || "";
  textarea.setAttribute("aria-invalid", kind === "error" ? "true" : "false");
}

// Typing again clears an error notice; a "busy" one stays.
export function clearErrorNotice() {
  if (notice.dataset.kind === "error") { showNotice("", ""); }
}

// -------------------------------------------------------------- scrolling

function nearBottom() {
  return list.scrollHeight - list.scrollTop - list.clientHeight < 120;
}

export function toBottom() { list.scrollTop = list.scrollHeight; }

// Makes a change and, if the list was scrolled to its end, keeps it there.
export function keepingScroll(change) {
  const stick = nearBottom();
  change();
  if (stick) { toBottom(); }
}
