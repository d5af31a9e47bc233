# expect: KeyError: 'no placeholder on this slide with idx == 2'
# message: raised inside pptx/
"""Build a deck; the "Title and Content" layout has no placeholder with idx 2."""

from pptx import Presentation
from pptx.util import Pt

SLIDES = [
    ("Q3 results", ["Revenue up 12 %", "Costs flat", "Two new regions"]),
    ("Next steps", ["Hire two engineers", "Open the Lisbon office"]),
]


def add_bullet_slide(prs, title: str, bullets: list[str]) -> None:
    slide = prs.slides.add_slide(prs.slide_layouts[1])
    slide.shapes.title.text = title
    body = slide.placeholders[1].text_frame
    body.text = bullets[0]
    for bullet in bullets[1:]:
        body.add_paragraph().text = bullet
    notes = slide.placeholders[2]
    notes.text = "Speaker notes"
    notes.text_frame.paragraphs[0].runs[0].font.size = Pt(12)


def main() -> None:
    prs = Presentation()
    for title, bullets in SLIDES:
        add_bullet_slide(prs, title, bullets)
    prs.save("results.pptx")


if __name__ == "__main__":
    main()
