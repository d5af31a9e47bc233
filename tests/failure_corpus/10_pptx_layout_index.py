# expect: IndexError: slide layout index out of range
# message: raised inside pptx/
"""Ask for a slide layout number the default template does not have."""

from pptx import Presentation

LAYOUT_COMPARISON = 4
LAYOUT_CUSTOM_CHART = 14


def main() -> None:
    prs = Presentation()
    prs.slides.add_slide(prs.slide_layouts[LAYOUT_COMPARISON]).shapes.title.text = "Plan A vs plan B"
    chart_slide = prs.slides.add_slide(prs.slide_layouts[LAYOUT_CUSTOM_CHART])
    chart_slide.shapes.title.text = "Monthly revenue"
    prs.save("plans.pptx")


if __name__ == "__main__":
    main()
