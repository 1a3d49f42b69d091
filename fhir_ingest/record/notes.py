"""Clinical note text: decode attachments and split them into sections.

Attachments come as base64 `data` (or, from a live EHR, as a `Binary` URL fetched by the client)
in text/plain, text/html, text/rtf or application/pdf.
"""
from __future__ import annotations

import base64
import binascii
import html
import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser


class NoteDecodeError(ValueError):
    pass


HTML_TYPES = ("text/html", "application/xhtml+xml", "application/xhtml")
# CDA documents (C-CDA discharge summaries, progress notes) arrive under any of these.
XML_TYPES = ("application/xml", "text/xml", "application/hl7-v3+xml", "application/cda+xml", "application/hl7-cda+xml")


def decode_attachment(attachment: dict) -> str:
    """Plain text of an attachment with inline base64 `data`."""
    data = attachment.get("data")
    if not data:
        raise NoteDecodeError("attachment has no inline data")
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise NoteDecodeError(f"attachment data is not base64: {exc}") from exc
    return bytes_to_text(raw, attachment.get("contentType", "text/plain"))


def bytes_to_text(raw: bytes, content_type: str) -> str:
    mime, _, params = (content_type or "text/plain").partition(";")
    mime = mime.strip().lower()
    charset = "utf-8"
    match = re.search(r"charset=([\w-]+)", params)
    if match:
        charset = match.group(1)
    if mime == "application/pdf":
        return pdf_to_text(raw)
    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    if mime in HTML_TYPES:
        return html_to_text(text)
    if mime in XML_TYPES:
        return xml_to_text(text)
    if mime in ("text/rtf", "application/rtf"):
        return rtf_to_text(text)
    if mime.startswith("text/"):
        return text
    raise NoteDecodeError(f"unsupported note content type {mime!r}")


class _HTMLText(HTMLParser):
    # HTML's blocks and CDA narrative's (paragraph, list item, table row).
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "table", "paragraph",
             "item", "list"}
    HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag in self.BLOCK:
            self.parts.append("\n")
        if tag in self.HEADINGS:
            self.parts.append("# ")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(text: str) -> str:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    out = html.unescape("".join(parser.parts))
    return re.sub(r"\n{3,}", "\n\n", out)


DOCTYPE = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def xml_to_text(text: str) -> str:
    """A CDA document's readable part: each section's title as a heading and its narrative text.
    Other XML: all of its text.

    A document type declaration is refused outright: a CDA document never needs one, and it is
    where entity expansion (the "billion laughs") and external entities live, whatever a given
    expat release happens to cap."""
    import xml.etree.ElementTree as ET

    if DOCTYPE.search(text):
        raise NoteDecodeError("XML with a document type declaration (<!DOCTYPE or <!ENTITY) is refused; "
                              "CDA documents carry none")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NoteDecodeError(f"unreadable XML: {exc}") from None
    for element in root.iter():
        if isinstance(element.tag, str):
            element.tag = element.tag.rsplit("}", 1)[-1]
    sections = [element for element in root.iter("section")]
    if not sections:
        return "\n".join(part.strip() for part in root.itertext() if part.strip())
    out = []
    for section in sections:
        title, narrative = section.find("title"), section.find("text")
        if title is not None and "".join(title.itertext()).strip():
            out.append("# " + " ".join("".join(title.itertext()).split()))
        if narrative is not None:
            out.append(html_to_text(ET.tostring(narrative, encoding="unicode")))
    return "\n".join(out)


def rtf_to_text(text: str) -> str:
    from striprtf.striprtf import rtf_to_text as strip

    return strip(text)


def pdf_to_text(raw: bytes) -> str:
    try:
        from pypdf import PdfReader
    except ImportError as exc:  # pragma: no cover - pypdf is a declared dependency
        raise NoteDecodeError("PDF notes need the pypdf package") from exc
    # pypdf logs every quirk of a damaged file at WARNING; the outcome is reported per note instead.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(raw))
        return "\n".join(page.extract_text() or "" for page in reader.pages)
    except Exception as exc:  # pypdf raises many error types for broken files
        raise NoteDecodeError(f"unreadable PDF: {exc}") from exc


@dataclass
class Section:
    heading: str
    text: str


_HEADING = re.compile(
    r"^\s*(?:#{1,6}\s*(?P<md>[^\n#].*?)|(?P<caps>[A-Z][A-Z /&\-]{2,60}):?)\s*$"
)


def split_sections(text: str) -> list[Section]:
    """Split a note on its headings (markdown `# Heading` or ALL-CAPS `HEADING:` lines).

    Subheadings ("## Plan") stay inside their parent section so "Assessment and Plan" keeps its plan.
    """
    sections: list[Section] = []
    heading, lines = "", []
    for line in text.splitlines():
        match = _HEADING.match(line)
        is_sub = line.lstrip().startswith("##")
        if match and not is_sub:
            if any(l.strip() for l in lines) or heading:
                sections.append(Section(heading, _tidy("\n".join(lines))))
            heading = (match.group("md") or match.group("caps") or "").strip().rstrip(":")
            lines = []
        else:
            lines.append(line.lstrip("#").strip() if is_sub else line)
    if any(l.strip() for l in lines) or heading:
        sections.append(Section(heading, _tidy("\n".join(lines))))
    return [s for s in sections if s.text or s.heading]


def _tidy(text: str) -> str:
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n", text)
    return text.strip()
