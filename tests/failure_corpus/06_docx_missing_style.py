# expect: KeyError: "no style with name 'Heading 10'"
# message: raised inside docx/
"""Render a folder tree as nested Word headings; level 10 asks for a "Heading 10" style, which is missing."""

from docx import Document

TREE = {
    "archive": {
        "2024": {"q1": {"jan": {"week1": {"mon": {"am": {"09h": {"raw": {"sensor-7": {}}}}}}}}},
    },
}


def add_headings(doc, tree: dict, level: int) -> None:
    for name, children in tree.items():
        doc.add_paragraph(name, style=f"Heading {level}")
        add_headings(doc, children, level + 1)


def main() -> None:
    doc = Document()
    doc.add_paragraph("Folder structure", style="Title")
    add_headings(doc, TREE, level=1)
    doc.save("folders.docx")


if __name__ == "__main__":
    main()
