"""The page's Markdown (markdown-it, highlight.js, DOMPurify), run in Chromium: what it
draws, and that nothing else gets through."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

STATIC = Path(__file__).resolve().parents[2] / "static"
# The page's order: the vendored libraries, then the module that wires them together.
SCRIPTS = [
    STATIC / "vendor" / "markdown-it-15.0.3" / "markdown-it.umd.min.js",
    STATIC / "vendor" / "dompurify-3.5.0" / "purify.min.js",
    STATIC / "vendor" / "highlight.js-11.12.0" / "highlight.min.js",
    STATIC / "js" / "markdown.js",
]
LINK = 'rel="noopener noreferrer" target="_blank"'

CASES = [
    (
        "**bold** and *italic* and _also_ and `co<de>`",
        "<p><strong>bold</strong> and <em>italic</em> and <em>also</em> and "
        "<code>co&lt;de&gt;</code></p>",
    ),
    ("one\ntwo\n\nthree", "<p>one<br>\ntwo</p>\n<p>three</p>\n"),
    (
        "- a\n  - nested\n- **b**",
        "<ul>\n<li>a\n<ul>\n<li>nested</li>\n</ul>\n</li>\n<li><strong>b</strong></li>\n</ul>\n",
    ),
    ("3. c\n4. d", '<ol start="3">\n<li>c</li>\n<li>d</li>\n</ol>\n'),
    (
        "| a | b |\n|---|--:|\n| 1 | 2 |",
        '<div class="table-wrap"><table><thead>\n<tr>\n<th>a</th>\n'
        '<th class="align-right">b</th>\n</tr>\n'
        '</thead>\n<tbody>\n<tr>\n<td>1</td>\n<td class="align-right">2</td>\n</tr>\n</tbody>\n'
        "</table></div>",
    ),
    (
        "```python\nif a < b:\n    print('no')\n```",
        '<div class="code-block"><div class="code-head"><span class="code-lang">python</span>'
        '<button type="button" class="copy-code">Copy</button></div>'
        '<pre><code class="hljs language-python"><span class="hljs-keyword">if</span> a &lt; b:\n'
        '    <span class="hljs-built_in">print</span>(<span class="hljs-string">\'no\'</span>)'
        "</code></pre></div>",
    ),
    (
        "```\nunclosed <b> while streaming",
        '<div class="code-block"><div class="code-head"><span class="code-lang">code</span>'
        '<button type="button" class="copy-code">Copy</button></div>'
        '<pre><code class="hljs">unclosed &lt;b&gt; while streaming</code></pre></div>',
    ),
    (
        "[docs](https://example.com/a_b?x=1&y=2)",
        f'<p><a href="https://example.com/a_b?x=1&amp;y=2" {LINK}>docs</a></p>\n',
    ),
    (
        "see http://example.com.",
        f'<p>see <a href="http://example.com" {LINK}>http://example.com</a>.</p>\n',
    ),
    ("# Title", "<h3>Title</h3>\n"),
    ("[bad](javascript:alert(1))", "<p>[bad](javascript:alert(1))</p>\n"),
    (  # no remote pictures: the image syntax is off, and what is left is a link
        "![pic](https://example.com/x.png)",
        f'<p>!<a href="https://example.com/x.png" {LINK}>pic</a></p>',
    ),
    ("<b>not bold</b>", "<p>&lt;b&gt;not bold&lt;/b&gt;</p>\n"),
    ("snake_case_name and 2 * 3", "<p>snake_case_name and 2 * 3</p>"),
]

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "<svg onload=alert(1)>",
    "<iframe src=javascript:alert(1)>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html,<script>alert(1)</script>)",
    '[x](http://a.example/" onmouseover="alert(1))',
    'http://a.example/"><img src=x onerror=alert(1)>',
    "`<img src=x onerror=alert(1)>`",
    "```\n</code></pre><img src=x onerror=alert(1)>\n```",
    "**<img src=x onerror=alert(1)>**",
    "- <script>alert(1)</script>\n1. <img src=x onerror=alert(1)>",
    "# <img src=x onerror=alert(1)>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "\u0000<script>alert(1)</script>\u00001\u0000",
    "[<img src=x onerror=alert(1)>](https://a.example)",
    '```js" onmouseover="alert(1)\nx\n```',
    "```<img src=x onerror=alert(1)>\nx\n```",
    "| <img src=x onerror=alert(1)> | b |\n|---|---|\n| <script>alert(1)</script> | 2 |",
    "> <iframe src=javascript:alert(1)>",
    "[x](vbscript:msgbox(1)) [y](file:///etc/passwd) <javascript:alert(1)>",
    "www.example.com and mail@example.com",
]


@pytest.fixture(scope="module")
def renderer(chromium):
    context = chromium.new_context()
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.set_content("<div id=out></div>")
    for script in SCRIPTS:
        module = script.name == "markdown.js"  # an ES module, as on the page
        page.add_script_tag(path=str(script), type="module" if module else None)
    # A module runs when the page gets to it, not when its tag is added: on a loaded machine
    # the first case once ran before it had.
    page.wait_for_function("() => window.TandemMarkdown !== undefined", timeout=30_000)
    yield page, dialogs
    context.close()


@pytest.mark.parametrize(("source", "html"), CASES)
def test_the_safe_subset(renderer, source, html):
    page, _ = renderer
    assert page.evaluate("s => window.TandemMarkdown.render(s)", source).strip() == html.strip()


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_text_stays_text(renderer, source):
    page, dialogs = renderer
    found = page.evaluate(
        """s => {
            const out = document.getElementById("out");
            out.innerHTML = window.TandemMarkdown.render(s);
            const all = [...out.querySelectorAll("*")];
            return {
                tags: [...new Set(all.map(e => e.tagName.toLowerCase()))],
                attributes: all.flatMap(e => [...e.attributes].map(a => a.name)),
                hrefs: [...out.querySelectorAll("a")].map(a => a.getAttribute("href")),
                rels: [...out.querySelectorAll("a")].map(a => a.rel),
            };
        }""",
        source,
    )
    allowed = {"p", "br", "strong", "em", "s", "code", "pre", "ul", "ol", "li", "a", "hr"}
    allowed |= {"blockquote", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th"}
    allowed |= {"td", "div", "span", "button"}
    assert set(found["tags"]) <= allowed, found
    assert set(found["attributes"]) <= {"href", "rel", "target", "class", "type", "start"}, found
    assert all(href.startswith(("http://", "https://")) for href in found["hrefs"]), found
    assert all(rel == "noopener noreferrer" for rel in found["rels"]), found
    assert dialogs == []


def test_streaming_redraws_keep_finished_blocks(renderer):
    """draw() rebuilds only what changed: a finished paragraph and code block keep their
    nodes while the text after them grows, and the result is what render() makes."""
    page, _ = renderer
    kept = page.evaluate(
        """() => {
            const out = document.getElementById("out");
            const first = "Intro.\\n\\n```js\\nlet a = 1;\\n```\\n\\nMore";
            window.TandemMarkdown.draw(out, first);
            const para = out.children[0], code = out.children[1];
            const grown = first + " words and a table\\n\\n| a |\\n|---|\\n| 1 |";
            window.TandemMarkdown.draw(out, grown);
            const box = document.createElement("div");
            box.innerHTML = window.TandemMarkdown.render(grown);
            return {
                para: out.children[0] === para,
                code: out.children[1] === code,
                same: out.innerHTML === box.innerHTML,
                table: !!out.querySelector(".table-wrap table"),
            };
        }"""
    )
    assert kept == {"para": True, "code": True, "same": True, "table": True}
