"""PNG of a chart with many straight lines (the head view's rules), in a second instead of half a minute.

vl-convert draws a PNG by rasterising the chart's SVG with resvg, whose anti-aliased filler pays for
every (4x supersampled) scanline a path crosses: the head view's 1,400 to 6,000 long diagonal lines took
4 s to several minutes (and far more while each line carried an `opacity`, which resvg draws through a
layer the size of the picture). Here resvg draws everything else, in the same SVG, and the lines are
drawn with numpy, in document order, with the same geometry, colours and opacities:

    picture = above + (1 - alpha_above) * (below + lines)

`below` is everything drawn before the lines (the white background, the frame), `above` everything drawn
after them (tokens, legend, title). resvg writes transparent pixels with wrong colours, so `above` is drawn
twice, on black and on white, which gives its colour and its opacity per channel exactly:
above on black = above, above on white - above on black = 255 * (1 - alpha_above).

Any SVG this cannot redraw exactly (transforms other than translations, clips, dashes, round caps, fewer
than MIN_LINES lines) goes to resvg unchanged.
"""

from __future__ import annotations

import copy
import io
import itertools
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_PIXELS", "MIN_LINES", "chart_png", "draw_lines", "svg_to_png"]

MIN_LINES = 200  # below this resvg is quick enough
_SVG = "{http://www.w3.org/2000/svg}"
_TRANSLATE = re.compile(r"^\s*translate\(\s*([-+\d.eE]+)(?:[\s,]+([-+\d.eE]+))?\s*\)\s*$")
_HEX = re.compile(r"^#[0-9a-fA-F]{6}$")
# Attributes that change nothing in how an element is drawn (Vega's accessibility and class names).
_INERT = {"class", "role", "aria-label", "aria-roledescription", "aria-hidden", "pointer-events"}
_LINE_ATTRS = _INERT | {"x1", "y1", "x2", "y2", "transform", "stroke", "stroke-width", "stroke-opacity", "opacity"}
# On the groups around the lines: fill and miter limit do not touch a line (no fill, no joins).
_GROUP_ATTRS = _INERT | {"transform", "fill", "stroke-miterlimit"}
_ROOT_ATTRS = _INERT | {"width", "height", "viewBox", "version"}
_CHUNK_STEPS = 50_000  # pixels walked along the lines whose pixels are found together (about 20 MB)
# A PNG larger than this (4000 x 3000) gets a smaller scale: the head view of 512 tokens at 2x would have
# 48 million pixels, and its drawing here takes about 20 bytes a pixel.
MAX_PIXELS = 12_000_000


@dataclass(frozen=True)
class _Lines:
    """Straight lines with butt caps, in SVG units: endpoints [n, 2] each, colour [n, 3] (0..255),
    alpha [n] (stroke-opacity x opacity), width [n]."""

    start: np.ndarray
    end: np.ndarray
    colour: np.ndarray
    alpha: np.ndarray
    width: np.ndarray


def chart_png(spec: dict, scale: float = 2.0, max_pixels: int = MAX_PIXELS) -> bytes:
    """A Vega-Lite chart (tformer_views.charts) as PNG bytes, `scale` times its size on screen (2: sharp on a
    projector or in slides), less where that would pass `max_pixels`. The picture export.to_png draws."""
    from .export import to_svg

    return svg_to_png(to_svg(spec), scale, max_pixels)


def svg_to_png(svg: str, scale: float = 2.0, max_pixels: int = MAX_PIXELS) -> bytes:
    """The SVG as PNG bytes, `scale` times its size (less where that would pass `max_pixels`): resvg's
    picture, with many lines drawn much faster."""
    import vl_convert

    split = _split(svg)
    if split is None:
        return vl_convert.svg_to_png(svg, scale=_capped(scale, _size(svg), max_pixels))
    below_svg, above_svg, lines, size = split
    scale = _capped(scale, size, max_pixels)
    below = _rgba(vl_convert.svg_to_png(below_svg, scale=scale))
    if below[..., 3].min() < 255:  # no opaque background: the sum above needs one
        return vl_convert.svg_to_png(svg, scale=scale)
    height, width, _ = below.shape
    margin = _margin(lines, scale)
    planes = np.zeros((3, height + 2 * margin, width + 2 * margin), np.float32)
    planes[:, margin : margin + height, margin : margin + width] = below[..., :3].transpose(2, 0, 1)
    del below
    draw_lines(planes, margin, lines, scale)
    on_black = _rgba(vl_convert.svg_to_png(_on_background(above_svg, "#000000"), scale=scale))
    on_white = _rgba(vl_convert.svg_to_png(_on_background(above_svg, "#ffffff"), scale=scale))
    picture = np.empty((height, width, 3), np.uint8)
    for top in range(0, height, 256):  # in strips: float copies of the whole picture would triple its memory
        rows = slice(top, top + 256)
        black, white = on_black[rows, :, :3].astype(np.float32), on_white[rows, :, :3].astype(np.float32)
        drawn = planes[:, margin + top : margin + min(top + 256, height), margin : margin + width].transpose(1, 2, 0)
        picture[rows] = np.clip(np.rint(black + (white - black) / np.float32(255) * drawn), 0, 255)
    return _png(picture)


def draw_lines(planes: np.ndarray, margin: int, lines: _Lines, scale: float) -> None:
    """Draw `lines` (SVG units, times `scale` in pixels) on `planes` [3, H, W] (float32 RGB, 0..255; the
    picture, with `margin` pixels around it for the pixels beside a line that fall off it: _margin), in order,
    each over what is already there (source-over), anti-aliased by each pixel's covered share.

    The share is the overlap of a 1-pixel box around the pixel centre with the stroke, across it and along
    it: exact for level and upright lines, within a few percent for slanted ones (resvg samples 4 x 4 points).
    """
    height, width = planes.shape[1] - 2 * margin, planes.shape[2] - 2 * margin
    channels = planes.reshape(3, -1)  # one plane per channel: 1-D gathers are twice as fast as [N, 3] rows
    half = lines.width * scale / 2
    steps = np.abs(lines.end - lines.start).max(axis=1) * scale + lines.width * scale + 4  # walk per line
    ends = np.searchsorted(np.cumsum(steps), np.arange(1, int(steps.sum() // _CHUNK_STEPS) + 2) * _CHUNK_STEPS)
    firsts = np.unique(np.concatenate([[0], np.minimum(ends + 1, len(steps))]))
    for first, last in itertools.pairwise(firsts):
        part = slice(first, last)
        pixels, shares, bounds = _coverage(
            lines.start[part] * scale, lines.end[part] * scale, half[part], height, width, margin
        )
        for i, (colour, alpha) in enumerate(zip(lines.colour[part], lines.alpha[part], strict=True)):
            a, b = bounds[i], bounds[i + 1]
            if a == b:
                continue
            where, share = pixels[a:b], shares[a:b] * alpha
            for channel, value in zip(channels, colour, strict=True):  # a line covers a pixel once
                under = channel.take(where)
                under += (value - under) * share
                channel.put(where, under)


def _margin(lines: _Lines, scale: float) -> int:
    return int(np.ceil(2 * _reach_across(lines.width * scale / 2).max(initial=0))) + 2


def _capped(scale: float, size: tuple[float, float], max_pixels: int) -> float:
    """`scale`, or less where the picture would have more than `max_pixels` pixels."""
    area = size[0] * size[1]
    return min(scale, (max_pixels / area) ** 0.5) if area > 0 else scale


def _size(svg: str) -> tuple[float, float]:
    """The SVG's width and height (its root's attributes), or (0, 0)."""
    m = re.search(r"<svg\b[^>]*>", svg)
    tag = m.group(0) if m else ""
    width, height = (re.search(rf'\s{name}="([\d.]+)"', tag) for name in ("width", "height"))
    return (float(width.group(1)), float(height.group(1))) if width and height else (0.0, 0.0)


def _reach_across(half: np.ndarray) -> np.ndarray:
    """How far from the centre line, across the walk, a pixel centre can be and still touch the stroke
    (cos >= 1/sqrt(2) on the walk's axis)."""
    return (half + 0.5) * np.sqrt(2) + 0.5


def _coverage(
    start: np.ndarray, end: np.ndarray, half: np.ndarray, height: int, width: int, margin: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pixels each line touches and its share of each: (flat index into the picture with `margin`,
    share, where each line's pixels start and the end [lines + 1]), grouped by line in order.

    Each line is walked along its longer axis, one pixel at a time; across it, the n pixels its stroke can
    reach there. A pixel's distance from the centre line is its offset across times cos; near the ends its
    share is also cut by its position along the line (butt caps).
    """
    d = end - start
    length = np.hypot(d[:, 0], d[:, 1])
    steep = np.abs(d[:, 1]) > np.abs(d[:, 0])
    lines = np.arange(len(d))
    axis = steep.astype(np.intp)
    a0, b0, da, db = start[lines, axis], start[lines, 1 - axis], d[lines, axis], d[lines, 1 - axis]
    safe = np.where(length > 0, length, 1.0)
    ua, ub = da / safe, db / safe  # the line's direction, along and across the walk
    cos = np.maximum(np.abs(ua), 0.5)
    slope = np.divide(db, da, out=np.zeros_like(da), where=da != 0)
    reach = half * np.abs(ub) + 1  # a slanted butt end sticks out this far along the walk
    size_along, size_side = np.where(steep, height, width), np.where(steep, width, height)
    lo = np.maximum(np.floor(np.minimum(a0, a0 + da) - reach), 0).astype(np.int64)
    hi = np.minimum(np.ceil(np.maximum(a0, a0 + da) + reach), size_along - 1).astype(np.int64)
    count = np.where(length > 0, np.maximum(hi - lo + 1, 0), 0)
    reach_side = _reach_across(half)
    n_side = int(np.ceil(2 * reach_side.max(initial=0))) + 1
    # One row per step along a line (its line: owner).
    owner = np.repeat(lines, count)
    along = lo[owner] + np.arange(len(owner)) - (np.cumsum(count) - count)[owner]
    from_start = along + 0.5 - a0[owner]
    centre = b0[owner] + from_start * slope[owner]
    first_side = np.floor(centre - reach_side[owner])
    first_side = np.clip(first_side, -margin, size_side[owner] + margin - n_side).astype(np.int64)
    offset = ((first_side + 0.5) - centre).astype(np.float32)[:, None] + np.arange(n_side, dtype=np.float32)
    share = np.abs(offset)
    share *= cos[owner].astype(np.float32)[:, None]  # distance from the centre line
    if half.min(initial=1) >= 0.5:  # the usual case: a pixel's box is never wider than the stroke
        np.subtract((half[owner] + 0.5).astype(np.float32)[:, None], share, out=share)
        np.clip(share, 0, 1, out=share)
    else:
        share = _overlap(share, half[owner].astype(np.float32)[:, None])
    s_centre = from_start * ua[owner] + (centre - b0[owner]) * ub[owner]  # along the line, at the centre line
    end_margin = n_side * np.abs(ub[owner]) + 1
    ends = np.nonzero((s_centre < end_margin) | (s_centre > length[owner] - end_margin))[0]
    if len(ends):
        s = s_centre[ends, None] + offset[ends] * ub[owner[ends], None]
        cut = np.minimum(s + 0.5, length[owner[ends], None]) - np.maximum(s - 0.5, 0)
        share[ends] *= np.clip(cut, 0, 1).astype(np.float32)
    row = width + 2 * margin
    step_side = np.where(steep[owner], 1, row)  # flat-index step of one pixel across the walk
    base = np.where(steep, (lo + margin) * row + margin, lo + margin + margin * row)[owner]
    base += (along - lo[owner]) * np.where(steep[owner], row, 1) + first_side * step_side
    index = base[:, None] + np.arange(n_side)[None, :] * step_side[:, None]
    touched = share > 0  # about two pixels in three
    kept = np.concatenate([[0], np.cumsum(touched.sum(axis=1))])
    return index[touched], share[touched], kept[np.concatenate([[0], np.cumsum(count)])]


def _overlap(t: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Length of [t - 1/2, t + 1/2] inside [-h, h], for t >= 0: a pixel's share of a stroke of width 2h."""
    return np.clip(np.minimum(t + 0.5, h) - np.maximum(t - 0.5, -h), 0, 1)


def _split(svg: str) -> tuple[str, str, _Lines, tuple[float, float]] | None:
    """(what is drawn below the lines, what is drawn above them, the lines, the SVG's width and height), or
    None when this SVG's lines
    cannot be redrawn exactly: fewer than MIN_LINES, not all in one group, or anything on them or their
    groups that changes how they look (clips, masks, group opacity, dashes, caps, transforms that are not
    translations)."""
    try:
        root = ET.fromstring(svg)
    except ET.ParseError:
        return None
    parent = {child: node for node in root.iter() for child in node}
    found = [e for e in root.iter() if e.tag == f"{_SVG}line"]
    if len(found) < MIN_LINES or set(root.attrib) - _ROOT_ATTRS:
        return None
    group = parent[found[0]]
    children = list(group)
    first = children.index(found[0])
    if children[first : first + len(found)] != found:  # one run of lines in one group
        return None
    w, h = root.get("width", ""), root.get("height", "")
    if root.get("viewBox", f"0 0 {w} {h}").split() != ["0", "0", w, h]:
        return None
    path = [group]
    while path[-1] is not root:
        path.append(parent[path[-1]])
    path.reverse()  # root ... group
    offset = np.zeros(2)
    for node in path[1:]:
        if set(node.attrib) - _GROUP_ATTRS:
            return None
        shift = _translation(node.get("transform"))
        if shift is None:
            return None
        offset += shift
    lines = _read_lines(found, offset)
    if lines is None:
        return None
    steps = [list(node).index(child) for node, child in itertools.pairwise(path)]
    below = _cut(root, steps, first, len(found), keep="below")
    above = _cut(root, steps, first, len(found), keep="above")
    return below, above, lines, (float(w), float(h))


def _read_lines(found: list[ET.Element], offset: np.ndarray) -> _Lines | None:
    n = len(found)
    start, end = np.zeros((n, 2)), np.zeros((n, 2))
    colour, alpha, width = np.zeros((n, 3), np.float32), np.ones(n), np.ones(n)
    try:
        for i, e in enumerate(found):
            stroke = e.get("stroke", "")
            shift = _translation(e.get("transform"))
            if set(e.attrib) - _LINE_ATTRS or not _HEX.match(stroke) or shift is None:
                return None
            base = offset + shift
            start[i] = base + (float(e.get("x1", 0)), float(e.get("y1", 0)))
            end[i] = base + (float(e.get("x2", 0)), float(e.get("y2", 0)))
            colour[i] = [int(stroke[k : k + 2], 16) for k in (1, 3, 5)]
            alpha[i] = float(e.get("stroke-opacity", 1)) * float(e.get("opacity", 1))
            width[i] = float(e.get("stroke-width", 1))
    except ValueError:
        return None
    return _Lines(start, end, colour, np.clip(alpha, 0, 1).astype(np.float32), width)


def _translation(transform: str | None) -> np.ndarray | None:
    if not transform:
        return np.zeros(2)
    m = _TRANSLATE.match(transform)
    return np.array([float(m.group(1)), float(m.group(2) or 0)]) if m else None


def _cut(root: ET.Element, steps: list[int], first: int, n_lines: int, keep: str) -> str:
    """The SVG with the lines taken out and only what is drawn below them (keep="below") or above them
    ("above"; definitions kept: what is above may use a clip path or gradient defined earlier)."""
    copy_root = copy.deepcopy(root)
    node = copy_root
    nodes = [node]
    for k in steps:
        node = list(node)[k]
        nodes.append(node)
    for node, k in zip(nodes[:-1], steps, strict=False):
        for j, child in enumerate(list(node)):
            if (keep == "below" and j > k) or (keep == "above" and j < k and child.tag != f"{_SVG}defs"):
                node.remove(child)
    group = nodes[-1]
    for j, child in enumerate(list(group)):
        before, after = j < first, j >= first + n_lines
        if not (before if keep == "below" else after) and not (keep == "above" and child.tag == f"{_SVG}defs"):
            group.remove(child)
    return ET.tostring(copy_root, encoding="unicode")


def _on_background(svg: str, colour: str) -> str:
    root = ET.fromstring(svg)
    background = ET.Element(f"{_SVG}rect", {"width": root.get("width", "0"), "height": root.get("height", "0")})
    background.set("fill", colour)
    root.insert(0, background)
    return ET.tostring(root, encoding="unicode")


def _rgba(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.uint8)


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="PNG", compress_level=3)
    return out.getvalue()
