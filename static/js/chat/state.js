/* What the page holds: the conversation (a new one has no id, and no row, until its first
 * message is sent), its messages as drawn, and their parts: the live copies that the events
 * update.
 */
import { root } from "./page.js";

export const conversation = {
  id: Number(root.dataset.conversationId) || null,
  turnsUrl: root.dataset.turnsUrl,
  deleted: false,
};

export const messages = new Map(); // message id -> {data, el}
export const parts = new Map(); // part id -> part payload (the live copy)

// Exposed for tests and debugging: the raw text the page holds for each part.
window.tandem = {
  partText: function (id) { const p = parts.get(Number(id)); return p ? p.text : null; },
  partSeq: function (id) { const p = parts.get(Number(id)); return p ? p.seq : null; },
};
