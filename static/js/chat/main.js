/* Tandem's conversation page starts here: it draws the messages the page came with, opens the
 * socket of a saved conversation and puts the cursor in the composer.
 *
 * The modules, each for one thing (docs/chat.md, "The page's modules"):
 *   page.js          the page's elements and URLs; el(), post(), the notice line, scrolling
 *   state.js         the conversation, its messages and their parts as the page holds them
 *   connection.js    the WebSocket: connect, reconnect, resync from a snapshot
 *   live.js          what each event does to the page
 *   messages.js      the message list: draw, place, redraw, replace a branch
 *   heads.js         a message's head: badges, steppers, Stop and Copy
 *   parts.js         a reply's text and image parts, and the image's buttons
 *   versions.js      Regenerate and versions, Edit and branches
 *   composer.js      sending a message
 *   conversations.js title, the first message creating the conversation, Rename, Delete
 *   settings.js      the conversation's settings panel
 * Markdown is static/js/markdown.js (a module; the libraries it wires are classic scripts
 * loaded before), copy buttons static/js/copy.js's (a classic script the keys page shares,
 * read through window.TandemCopy); Esc is static/js/shortcuts.js's.
 */
import "./composer.js";
import "./versions.js";
import { connect } from "./connection.js";
import { applySnapshot } from "./live.js";
import { textarea, toBottom } from "./page.js";
import { conversation } from "./state.js";

applySnapshot(JSON.parse(document.getElementById("initial-messages").textContent || "[]"));
toBottom();
if (conversation.id) { connect(); }
textarea.focus();
