"""Small real documents for the ingestion tests: PDFs written by hand (a valid xref, Helvetica text),
HTML pages with the boilerplate a real page has."""

from __future__ import annotations


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def make_pdf(pages: list[list[str]]) -> bytes:
    """A PDF whose page i shows the lines pages[i] (an empty list: a page with no text layer)."""
    n = len(pages)
    font = 3 + 2 * n
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(n))
               + b"] /Count %d >>" % n]
    for i, lines in enumerate(pages):
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                       b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (4 + 2 * i, font))
        ops = "".join(f"BT /F1 12 Tf 72 {720 - 16 * k} Td ({_escape(line)}) Tj ET\n"
                      for k, line in enumerate(lines)).encode("latin-1")
        objects.append(b"<< /Length %d >>\nstream\n" % len(ops) + ops + b"endstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


PAGE = """<!doctype html>
<html><head><title>Team wiki</title><style>body { color: red }</style>
<script>var tracking = "do not index this script";</script></head>
<body>
<nav><a href="/">Home</a> <a href="/about">Site navigation menu</a></nav>
<header>Company header banner</header>
<main>
<h1>Offsite planning</h1>
<p>The offsite is in <b>Lisbon</b> from the 3rd to the 5th of May.</p>
<ul><li>Book flights by Friday.</li><li>Hotel near the river.</li></ul>
<!-- a comment that is not text -->
<h2>Budget</h2>
<p>The budget is 12,000 euros for the whole team.</p>
</main>
<footer>Copyright footer text</footer>
</body></html>
"""
