/* A reply's parts as DOM: the text (Markdown, with a caret while it streams, and a line for a
 * state other than done) and the image (its progress, the picture, or a failure card). The
 * image's buttons are wired here: what they start comes back over the socket.
 */
import { draw as drawMarkdown } from "../markdown.js";
import { el, errorText, post, showNotice, urlFor } from "./page.js";

const TEXT_STATUS = {
  queued: "waiting…",
  cancelled: "stopped",
  interrupted: "interrupted — the server restarted",
};

export function drawTextBody(part, node) {
  const md = node.querySelector(".md");
  const oldCaret = md.querySelector(".caret");
  if (oldCaret) { oldCaret.remove(); }
  drawMarkdown(md, part.text); // keeps the finished blocks' DOM
  if (part.state === "streaming") {
    // The caret sits at the end of the text, inside its last paragraph, item or code block.
    const caret = el("span", { className: "caret", "aria-hidden": "true" });
    let last = md.lastElementChild;
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
  let words = TEXT_STATUS[part.state];
  if (!words && part.state === "succeeded" && part.finish_reason === "length") {
    words = "stopped at the length limit";
  }
  if (!words) { return null; }
  return el("p", { className: "part-status is-" + part.state, text: words });
}

function textPart(part) {
  const node = el("div", {
    className: "part part-text",
    "data-part-id": part.id,
    "data-kind": "text",
    "data-state": part.state,
  }, [el("div", { className: "md" })]);
  drawTextBody(part, node);
  const status = textStatus(part);
  if (status) { node.appendChild(status); }
  return node;
}

function progressBar(fraction, label) {
  const pct = Math.max(0, Math.min(100, Math.round((fraction || 0) * 100)));
  const bar = el("div", {
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

function picture(url, words) {
  const img = el("img", { alt: words, loading: "lazy" });
  img.src = url;
  return el("figure", { className: "image-frame" }, [
    el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, [img]),
  ]);
}

function attemptNote(part, tag, words) {
  return part.attempt > 1 ? el(tag, { className: "muted small", text: words + " " + part.attempt }) : null;
}

function imagePart(part) {
  const node = el("div", {
    className: "part part-image",
    "data-part-id": part.id,
    "data-kind": "image",
    "data-state": part.state,
    "data-attempt": part.attempt,
  });
  if (part.state === "succeeded" && safeImageUrl(part.image_url)) {
    node.appendChild(picture(part.image_url, "The generated image"));
    const again = el("button", { type: "button", className: "new-image", text: "New image" });
    again.addEventListener("click", function () { newImage(part.id, again); });
    node.appendChild(el("div", { className: "image-actions" }, [again, attemptNote(part, "span", "attempt")]));
    return node;
  }
  // "New image": the old picture stays on screen while the new one is drawn, and if it fails.
  const previous = safeImageUrl(part.previous_image_url) ? part.previous_image_url : null;
  if (previous) {
    node.dataset.previous = "true";
    node.appendChild(picture(previous, "The previous image"));
  }
  if (previous && (part.state === "queued" || part.state === "running")) {
    const done = Math.round((part.progress || 0) * 100);
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
    const pct = Math.round((part.progress || 0) * 100);
    const words = part.state === "queued"
      ? "Image waiting for a worker…"
      : "Drawing the image… " + pct + "%";
    node.appendChild(el("div", { className: "image-placeholder" }, [
      el("div", { className: "image-placeholder-art", "aria-hidden": "true" }),
      el("p", { className: "part-status is-" + part.state, text: words }),
      progressBar(part.progress, "Image progress"),
      attemptNote(part, "p", "Attempt"),
    ]));
    return node;
  }
  // failed, cancelled, interrupted: a card with the reason and a retry button.
  const title = {
    failed: previous ? "The new image failed" : "The image failed",
    cancelled: previous ? "The new image was stopped" : "The image was stopped",
    interrupted: "The image was interrupted",
  }[part.state] || "No image";
  const reason = part.error || (part.state === "cancelled" ? "You stopped it before it finished." : "");
  const retry = el("button", { type: "button", className: "retry-image", text: "Retry image" });
  retry.addEventListener("click", function () { retryImage(part.id, retry); });
  node.appendChild(el("div", { className: "failure-card", role: "group", "aria-label": title }, [
    el("p", { className: "failure-title", text: title }),
    reason ? el("p", { className: "failure-reason", text: reason }) : null,
    el("div", { className: "failure-actions" }, [retry, attemptNote(part, "span", "attempt")]),
    el("p", { className: "failure-notice", role: "status", hidden: "" }),
  ]));
  return node;
}

export function drawPart(part) {
  return part.kind === "image" ? imagePart(part) : textPart(part);
}

// -------------------------------------------------------------- the image's buttons

function newImage(partId, button) {
  button.disabled = true;
  button.textContent = "Starting…";
  post(urlFor("newImage", partId)).then(function (response) {
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
  const say = button.closest(".failure-card").querySelector(".failure-notice");
  button.disabled = true;
  button.textContent = "Retrying…";
  post(urlFor("retry", partId)).then(function (response) {
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
