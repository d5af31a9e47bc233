# expect: PackageNotFoundError: Package not found at 'letterhead_template.docx'
# message: raised inside docx/
"""Start a letter from a template that was never uploaded."""

from docx import Document


def make_letter(recipient: str) -> None:
    doc = Document("letterhead_template.docx")
    doc.add_paragraph(f"Dear {recipient},")
    doc.save(f"letter_{recipient.lower()}.docx")


if __name__ == "__main__":
    make_letter("Morgan")
