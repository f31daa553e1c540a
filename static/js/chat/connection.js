/* The conversation's WebSocket: it connects (and reconnects with backoff) and hands every event
 * to the handler given to listen() (live.js). The first event of each connection is a
 * snapshot, so resync() — a fresh connection — is how the page starts over when it missed
 * something. The top bar's status says where the socket stands.
 */
import { conversation } from "./state.js";

const status = document.getElementById("connection");
let socket = null;
let attempts = 0;
let retryTimer = null;
let resyncTimer = null;
let lastResync = 0;
let deliver = null;

export function listen(handler) { deliver = handler; }

function setConnection(state, words) {
  status.dataset.connection = state;
  status.textContent = words;
}

function stopped(words) {
  socket = null;
  setConnection("closed", words);
}

function reconnectLater(words) {
  attempts += 1;
  const delay = Math.min(10000, 500 * Math.pow(2, attempts - 1)) * (0.8 + Math.random() * 0.4);
  setConnection("connecting", words || "connection lost — reconnecting…");
  retryTimer = setTimeout(connect, delay);
}

export function connect() {
  clearTimeout(retryTimer);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(scheme + "//" + location.host + "/ws/conversations/" + conversation.id + "/");
  let opened = false;
  socket = ws;
  setConnection("connecting", attempts ? "reconnecting…" : "connecting…");
  ws.onopen = function () { opened = true; setConnection("open", "live"); };
  ws.onmessage = function (message) {
    if (ws !== socket) { return; }
    attempts = 0;  // a snapshot came: the server can serve (a 4503 opens, then closes)
    let event;
    try { event = JSON.parse(message.data); } catch (e) { return; }
    deliver(event);
  };
  ws.onclose = function (close) {
    if (ws !== socket) { return; }
    socket = null;
    if (close.code === 4401) { stopped("signed out — reload the page to sign in"); return; }
    if (close.code === 4404) { stopped("this conversation is not available"); return; }
    if (close.code === 4503) { reconnectLater("the database is unavailable — reconnecting…"); return; }
    if (opened) { reconnectLater(); return; }
    // Refused before it opened: a browser cannot see why, so ask the page itself.
    fetch(location.pathname, { credentials: "same-origin", redirect: "follow" })
      .then(function (response) {
        if (response.status === 404) { stopped("this conversation is not available"); }
        else if (response.redirected && /\/accounts\/login\//.test(response.url)) {
          stopped("signed out — reload the page to sign in");
        } else { reconnectLater(); }
      }, function () { reconnectLater(); });
  };
}

export function resync(why) {
  // Missed text pieces, or a reply this page never saw created (another tab sent it):
  // start over from a fresh snapshot, at most once a second.
  if (resyncTimer) { return; }
  resyncTimer = setTimeout(function () {
    resyncTimer = null;
    lastResync = Date.now();
    const old = socket;
    socket = null;
    if (old) { try { old.close(4000, why); } catch (e) { /* already closing */ } }
    connect();
  }, Math.max(0, lastResync + 1000 - Date.now()));
}

// Closes the socket for good (the conversation was deleted), saying why.
export function disconnect(words) {
  const old = socket;
  socket = null;
  if (old) { try { old.close(); } catch (e) { /* already closing */ } }
  setConnection("closed", words);
}

window.addEventListener("online", function () {
  if (!socket && conversation.id && !conversation.deleted) { connect(); }
});
