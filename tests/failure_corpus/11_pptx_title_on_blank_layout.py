# expect: AttributeError: 'NoneType' object has no attribute 'text'
"""The blank layout (6) has no title placeholder, so ``shapes.title`` is None."""

from pptx import Presentation
from pptx.util import Inches


def main() -> None:
    prs = Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[6])
    box = slide.shapes.add_textbox(Inches(1), Inches(1), Inches(6), Inches(1))
    box.text_frame.text = "Appendix"
    slide.shapes.title.text = "Appendix: raw figures"
    prs.save("appendix.pptx")


if __name__ == "__main__":
    main()
