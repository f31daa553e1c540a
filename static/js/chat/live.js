/* What the socket's events do to the page: a snapshot redraws the branch, text deltas are
 * applied in order (a gap starts over from a snapshot), part and message states redraw what
 * they change, and the conversation's own events (another branch, a new title or settings,
 * its deletion) go to the modules that show them. An event about a message the page has not
 * drawn yet waits for it: the answer to this page's own turn can arrive after its events.
 */
import { keepingScroll } from "./page.js";
import { listen, resync } from "./connection.js";
import { onDeleted, showTitle } from "./conversations.js";
import { redrawHead, redrawPart, setMessage, showOnly } from "./messages.js";
import { drawTextBody } from "./parts.js";
import { showSettings } from "./settings.js";
import { messages, parts } from "./state.js";

const pending = new Map(); // message id -> events that arrived before its 201 response
let awaitingTurn = false; // this page's own turn is being posted

export function applySnapshot(shown) {
  keepingScroll(function () {
    showOnly(shown);
    pending.forEach(function (events, messageId) {
      pending.delete(messageId);
      if (messages.has(messageId)) { events.forEach(handleEvent); }
    });
  });
}

// The composer is posting a turn: events for its messages are kept until showOwn() draws them.
export function awaitTurn() { awaitingTurn = true; }

export function turnAnswered() {
  awaitingTurn = false;
  if (pending.size) { resync("a reply created elsewhere"); }
}

// A message from this page's own answer, then the events that outran it.
export function showOwn(data) {
  if (!messages.has(data.id)) { setMessage(data); }
  const queued = pending.get(data.id);
  if (queued) { pending.delete(data.id); queued.forEach(handleEvent); }
}

function deferIfUnknown(messageId, event) {
  if (messages.has(messageId)) { return false; }
  // Events can outrun this page's own 201 answer: keep them until it has been drawn.
  const queue = pending.get(messageId) || [];
  if (queue.length < 5000) { queue.push(event); }
  pending.set(messageId, queue);
  if (!awaitingTurn) { resync("a reply created elsewhere"); }
  return true;
}

function onDelta(event) {
  if (deferIfUnknown(event.message_id, event)) { return; }
  const part = parts.get(event.part_id);
  // A delta carries pieces first..seq of its part (the server gathers a few at a time).
  const first = event.first === undefined ? event.seq : event.first;
  if (!part || event.seq <= part.seq) { return; } // already have it (snapshot or earlier)
  // The server mends gaps from the live tail; one that still shows means start over.
  if (first !== part.seq + 1) { resync("missed text pieces"); return; }
  part.text += event.text;
  part.seq = event.seq;
  const node = document.querySelector('[data-part-id="' + part.id + '"]');
  if (part.state === "queued") {
    part.state = "streaming";
    keepingScroll(function () { redrawPart(part); });
    return;
  }
  if (node) { drawOnNextFrame(part); }
}

// A streaming text is redrawn at most once per animation frame, however many pieces came.
const dirtyParts = new Set();
let frameAsked = false;

function drawOnNextFrame(part) {
  dirtyParts.add(part.id);
  if (frameAsked) { return; }
  frameAsked = true;
  requestAnimationFrame(function () {
    frameAsked = false;
    const ids = Array.from(dirtyParts);
    dirtyParts.clear();
    keepingScroll(function () {
      ids.forEach(function (id) {
        const current = parts.get(id);
        const node = document.querySelector('.part-text[data-part-id="' + id + '"]');
        if (current && node && current.state === node.dataset.state) { drawTextBody(current, node); }
      });
    });
  });
}

function onPartState(event) {
  const incoming = event.part;
  if (deferIfUnknown(incoming.message_id, event)) { return; }
  const owner = messages.get(incoming.message_id).data;
  if (owner.version !== undefined && incoming.version !== owner.version) { return; } // not shown
  let part = parts.get(incoming.id);
  if (!part) {
    part = incoming;
    parts.set(part.id, part);
    owner.parts.push(part);
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
  const entry = messages.get(event.message_id);
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

listen(handleEvent);
