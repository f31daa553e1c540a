/* Tandem's Markdown, an ES module: render(text) -> safe HTML, draw(node, text).
 *
 * Kept libraries do the work (static/vendor/, loaded before this file): markdown-it parses
 * with raw HTML off, highlight.js colours fenced code, and DOMPurify sanitises the result
 * against a fixed list of tags and attributes, so neither a user nor the model can inject
 * markup. Links must be http(s) and open with rel="noopener noreferrer". The libraries are
 * classic scripts (window.markdownit, hljs, DOMPurify); window.TandemMarkdown is this module's
 * exports again, for the browser tests and the console.
 */
var hljs = window.hljs;
var DOMPurify = window.DOMPurify;
var LANGUAGE = /^[\w+#.-]{1,32}$/;

var md = window.markdownit({ html: false, linkify: true, breaks: true, typographer: false });
md.disable(["image"]); // a remote picture would be blocked by img-src 'self' anyway: keep it text
md.validateLink = function (url) { return /^https?:\/\//i.test(url); };

// A reply's "# Title" must not outrank the page's own h1: headings start at h3.
md.core.ruler.push("tandem_heading_levels", function (state) {
  state.tokens.forEach(function (token) {
    if (token.type === "heading_open" || token.type === "heading_close") {
      token.tag = "h" + Math.min(6, Number(token.tag.slice(1)) + 2);
    }
  });
});

// Column alignment as a class, not markdown-it's style="text-align: …", which the CSP
// (style-src 'self') refuses.
md.core.ruler.push("tandem_align_classes", function (state) {
  state.tokens.forEach(function (token) {
    if (token.type !== "th_open" && token.type !== "td_open") { return; }
    var style = token.attrGet("style");
    if (!style) { return; }
    token.attrs = token.attrs.filter(function (attr) { return attr[0] !== "style"; });
    var align = /text-align:\s*(left|center|right)/.exec(style);
    if (align) { token.attrSet("class", "align-" + align[1]); }
  });
});

function escapeHtml(text) {
  return md.utils.escapeHtml(String(text));
}

function highlighted(code, lang) {
  if (lang && hljs && hljs.getLanguage(lang)) {
    return hljs.highlight(code, { language: lang, ignoreIllegals: true }).value;
  }
  return escapeHtml(code);
}

// A fenced block: a head with its language and a copy button (static/js/copy.js handles the
// click), then the highlighted code. An unclosed fence (mid-stream) runs to the end.
md.renderer.rules.fence = function (tokens, idx) {
  var token = tokens[idx];
  var lang = token.info.trim().split(/\s+/)[0];
  lang = LANGUAGE.test(lang) ? lang.toLowerCase() : "";
  var code = token.content.replace(/\n$/, "");
  return '<div class="code-block"><div class="code-head"><span class="code-lang">' +
    escapeHtml(lang || "code") + '</span><button type="button" class="copy-code">Copy</button></div>' +
    '<pre><code class="hljs' + (lang ? " language-" + escapeHtml(lang) : "") + '">' +
    highlighted(code, lang) + "</code></pre></div>";
};

// Wide tables scroll inside their own box, not the page (a phone is 390 px wide).
md.renderer.rules.table_open = function () { return '<div class="table-wrap"><table>'; };
md.renderer.rules.table_close = function () { return "</table></div>"; };

var PURIFY = {
  ALLOWED_TAGS: [
    "p", "br", "strong", "em", "s", "code", "pre", "ul", "ol", "li", "a", "hr", "blockquote",
    "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "div", "span", "button",
  ],
  ALLOWED_ATTR: ["href", "rel", "target", "start", "class", "type"],
  ALLOW_DATA_ATTR: false,
};
DOMPurify.addHook("afterSanitizeAttributes", function (node) {
  if (node.tagName === "A") {
    if (!/^https?:\/\//i.test(node.getAttribute("href") || "")) { node.removeAttribute("href"); }
    node.setAttribute("rel", "noopener noreferrer");
    node.setAttribute("target", "_blank");
  }
});

function render(source) {
  return DOMPurify.sanitize(md.render(String(source == null ? "" : source)), PURIFY);
}

/* Draws `source` into `node`, keeping every leading block that did not change: while a
 * reply streams only its last block is rebuilt, so finished paragraphs and code blocks keep
 * their DOM (a selection or a focused copy button survives, nothing above jumps). */
function draw(node, source) {
  var box = document.createElement("div");
  box.innerHTML = render(source);
  var fresh = Array.prototype.slice.call(box.childNodes);
  var same = 0;
  while (same < fresh.length && same < node.childNodes.length && node.childNodes[same].isEqualNode(fresh[same])) {
    same += 1;
  }
  while (node.childNodes.length > same) { node.removeChild(node.lastChild); }
  fresh.slice(same).forEach(function (child) { node.appendChild(child); });
}

window.TandemMarkdown = { render: render, draw: draw, escape: escapeHtml };

export { render, draw, escapeHtml };
