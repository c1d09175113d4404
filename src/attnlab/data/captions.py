"""Captions of generated micrographs, written from their ground truth (``data/micrographs.py``).

Image i of ``generated:micrograph-captions`` is image i of the defect-count set (0..3 defects of any kind,
balanced over the counts); its caption names every defect and the quadrant of the image its centre lies in:

    caption = "no defects"                                          no defect
            = " and ".join("a(n) <kind> at the <quadrant>")         otherwise, sorted by kind then quadrant
    kind in pore, crack, inclusion;  quadrant in top left, top right, bottom left, bottom right
              (row < size / 2 is top, column < size / 2 is left)

e.g. "a pore at the top left and a pore at the bottom right and a crack at the top right". A caption
is right only if every defect is named with its quadrant (exact match), so counting, recognising and
locating are all needed.
"""

from __future__ import annotations

from attnlab.data.micrographs import KINDS, Defect

QUADRANTS = ("top left", "top right", "bottom left", "bottom right")
SOURCE = "generated:micrograph-captions"


def quadrant(d: Defect, size: int) -> int:
    """0..3: the quadrant (QUADRANTS) of the defect's centre in a size x size image."""
    row, col = d.centre
    return 2 * int(row >= size / 2) + int(col >= size / 2)


def caption(defects: tuple[Defect, ...] | list[Defect], size: int) -> str:
    """The caption of an image holding ``defects`` (see the module)."""
    if not defects:
        return "no defects"
    named = sorted((KINDS.index(d.kind), quadrant(d, size)) for d in defects)
    return " and ".join(f"{'an' if KINDS[k][0] in 'aeiou' else 'a'} {KINDS[k]} at the {QUADRANTS[q]}"
                        for k, q in named)
