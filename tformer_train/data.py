"""Generated data for the bundled didactic models: two toy languages and images of shapes.

Nothing here is downloaded: every sentence and image comes from a seeded generator, so a test
can draw a fresh held-out sample at any time and the training run can be repeated exactly.

Toy languages
-------------
The source ("English") is SVO with adjectives before the noun and prepositions:

    the big red dog chases a small cat quickly near the river

The target ("Tarish", invented) is SOV with case particles (`ga` subject, `wo` object), the
noun first, then its adjectives in mirrored order, then the determiner, and postpositions; the
place phrase moves before the object and the adverb sits just before the verb:

    varo rubi gros ta ga fluvo ta apu mise mik na wo rapide kasas

Every source word has exactly one translation, so the mapping is a function a model can learn
exactly, but almost no target word sits at the index of its source word: cross-attention has
to move. Each `Pair` also carries the gold alignment (target position -> source position).

The train / held-out split is a property of the sentence, not of the draw: a source sentence is
held out when a hash of its text falls in the held-out bucket (`is_held_out`). Training draws
reject held-out sentences, so none can ever be trained on, whatever the seed or step count.

Shape scenes
------------
32 x 32 RGB images, one shape of eight classes at a random position, size and colour on a
background of colour gradients, stripes and pixel noise. The exact foreground coverage of
every pixel is returned with the image, so attention on the shape can be measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tformer_core.bundled.tokenizer import SPECIAL_TOKENS, UNK  # ids 0, 1, 2, 3 in both vocabularies

__all__ = [
    "ADJECTIVES",
    "ADVERBS",
    "DETECTION_IMAGE_SIZE",
    "DETERMINERS",
    "DICTIONARY",
    "HELD_OUT_PERCENT",
    "IMAGE_SIZE",
    "INTRANSITIVE_VERBS",
    "MAX_OBJECTS",
    "MAX_SOURCE_WORDS",
    "MAX_TARGET_WORDS",
    "NOUNS",
    "OBJECT_PARTICLE",
    "PREPOSITIONS",
    "SCENE_PREPROCESSING",
    "SHAPE_CLASSES",
    "SOURCE_VOCAB",
    "SUBJECT_PARTICLE",
    "TARGET_VOCAB",
    "TRAIN_STREAM_OFFSET",
    "TRANSITIVE_VERBS",
    "DetectionScenes",
    "Pair",
    "Scenes",
    "Uniform",
    "is_held_out",
    "make_detection_scenes",
    "make_scenes",
    "patch_coverage",
    "random_pair",
    "sample_pairs",
]

# The training image stream is seeded far from the small seeds evaluation uses, so a training
# batch can never be an evaluation sample drawn with the same number.
TRAIN_STREAM_OFFSET = 2**40

# ---- lexicon: (source word, target word) -------------------------------------------------
DETERMINERS = (("the", "ta"), ("a", "na"), ("this", "ki"), ("that", "ko"), ("every", "sen"))
NOUNS = (
    ("dog", "varo"),
    ("cat", "mise"),
    ("bird", "piku"),
    ("horse", "tarno"),
    ("fish", "sulo"),
    ("child", "nemi"),
    ("teacher", "odra"),
    ("farmer", "kelto"),
    ("king", "rauko"),
    ("queen", "seli"),
    ("wolf", "gurno"),
    ("fox", "reva"),
    ("house", "domi"),
    ("tree", "arbo"),
    ("river", "fluvo"),
    ("stone", "peko"),
    ("apple", "malu"),
    ("book", "libu"),
    ("ball", "bolo"),
    ("garden", "hortu"),
)
ADJECTIVES = (
    ("big", "gros"),
    ("small", "mik"),
    ("red", "rubi"),
    ("blue", "ceru"),
    ("green", "verda"),
    ("old", "vetu"),
    ("young", "juna"),
    ("happy", "gaja"),
    ("sad", "trista"),
    ("tall", "alta"),
    ("dark", "nokta"),
    ("bright", "lumi"),
)
TRANSITIVE_VERBS = (
    ("sees", "vidas"),
    ("likes", "amas"),
    ("chases", "kasas"),
    ("finds", "trovas"),
    ("helps", "helpas"),
    ("watches", "rigas"),
    ("follows", "sekvas"),
    ("carries", "portas"),
    ("hears", "audas"),
    ("paints", "pentras"),
    ("feeds", "nutras"),
    ("calls", "vokas"),
)
INTRANSITIVE_VERBS = (
    ("sleeps", "dormas"),
    ("runs", "kuras"),
    ("sings", "kantas"),
    ("waits", "atendas"),
    ("laughs", "ridas"),
    ("swims", "nagas"),
)
ADVERBS = (
    ("quickly", "rapide"),
    ("slowly", "lante"),
    ("often", "ofte"),
    ("today", "hodie"),
    ("quietly", "kviete"),
    ("again", "denove"),
)
PREPOSITIONS = (("near", "apu"), ("behind", "malan"), ("under", "sub"), ("with", "kun"), ("in", "ena"))
SUBJECT_PARTICLE, OBJECT_PARTICLE = "ga", "wo"  # target-only words: no source word aligns to them
_AN = ("an", "na")  # "a" before a vowel; the target does not make the distinction

_LEXICON = DETERMINERS + (_AN,) + NOUNS + ADJECTIVES + TRANSITIVE_VERBS + INTRANSITIVE_VERBS + ADVERBS + PREPOSITIONS
SOURCE_VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(s for s, _ in _LEXICON)
TARGET_VOCAB: tuple[str, ...] = SPECIAL_TOKENS + tuple(
    dict.fromkeys([t for _, t in _LEXICON] + [SUBJECT_PARTICLE, OBJECT_PARTICLE])
)  # dict.fromkeys: "a" and "an" share "na", listed once
DICTIONARY: dict[str, str] = dict(_LEXICON)  # source word -> target word

HELD_OUT_PERCENT = 10  # share of all possible source sentences reserved for evaluation
MAX_SOURCE_WORDS = 15  # det adj adj noun verb det adj adj noun adv prep det adj adj noun
MAX_TARGET_WORDS = 17  # the same words plus the two particles

_UNK_LEXEME = (UNK, UNK)  # training only: an unknown word is translated as <unk>, in place


@dataclass(frozen=True)
class Pair:
    """One sentence pair. alignment[t] is the source index of target word t, or None (particles)."""

    source: tuple[str, ...]
    target: tuple[str, ...]
    alignment: tuple[int | None, ...]

    @property
    def source_text(self) -> str:
        return " ".join(self.source)

    @property
    def target_text(self) -> str:
        return " ".join(self.target)


def is_held_out(source_text: str) -> bool:
    """True when this source sentence belongs to the held-out split (fixed by its text alone)."""
    digest = hashlib.blake2b(source_text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 100 < HELD_OUT_PERCENT


# A phrase under construction: a list of (source word, target word) with source indices filled
# in when the source sentence is laid out.
_Lexeme = tuple[str, str]


def _pick(rng: np.random.Generator, words: tuple[_Lexeme, ...]) -> _Lexeme:
    return words[int(rng.integers(len(words)))]


def _noun_phrase(rng: np.random.Generator, unk_rate: float) -> tuple[_Lexeme, list[_Lexeme], _Lexeme]:
    """(determiner, adjectives in source order, noun); 0, 1 or 2 different adjectives."""
    n_adj = int(rng.choice(3, p=(0.4, 0.4, 0.2)))
    adjectives = [ADJECTIVES[i] for i in rng.choice(len(ADJECTIVES), size=n_adj, replace=False)]
    noun = _pick(rng, NOUNS)
    if unk_rate:
        # Teach "unknown word in, <unk> out, same place", so a typo in the app shows up visibly
        # instead of being silently translated as some other word.
        adjectives = [_UNK_LEXEME if rng.random() < unk_rate else a for a in adjectives]
        noun = _UNK_LEXEME if rng.random() < unk_rate else noun
    return _pick(rng, DETERMINERS), adjectives, noun


def random_pair(rng: np.random.Generator, unk_rate: float = 0.0) -> Pair:
    """One sentence pair drawn from the grammar (either split; see `sample_pairs`)."""
    subject = _noun_phrase(rng, unk_rate)
    transitive = rng.random() < 0.7
    verb = _pick(rng, TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS)
    obj = _noun_phrase(rng, unk_rate) if transitive else None
    adverb = _pick(rng, ADVERBS) if rng.random() < 0.4 else None
    place = (_pick(rng, PREPOSITIONS), _noun_phrase(rng, unk_rate)) if rng.random() < 0.4 else None

    source: list[str] = []
    target: list[tuple[str, int | None]] = []  # (word, source index)

    def say(lexeme: _Lexeme) -> int:
        source.append(lexeme[0])
        return len(source) - 1

    def np_source(phrase: tuple[_Lexeme, list[_Lexeme], _Lexeme]) -> list[tuple[str, int]]:
        """Lay the phrase out in source order; return it in target order: noun, adjectives mirrored, det."""
        det, adjectives, noun = phrase
        next_word = adjectives[0][0] if adjectives else noun[0]
        if det[0] == "a" and next_word[0] in "aeiou":
            det = _AN
        det_i = say(det)
        adj_i = [say(a) for a in adjectives]
        noun_i = say(noun)
        return (
            [(noun[1], noun_i)] + [(a[1], i) for a, i in zip(reversed(adjectives), reversed(adj_i))] + [(det[1], det_i)]
        )

    subject_t = np_source(subject)
    verb_t = (verb[1], say(verb))
    object_t = np_source(obj) if obj is not None else None
    adverb_t = (adverb[1], say(adverb)) if adverb is not None else None
    if place is not None:
        prep, phrase = place
        prep_i = say(prep)
        place_t = np_source(phrase) + [(prep[1], prep_i)]
    else:
        place_t = None

    target += subject_t + [(SUBJECT_PARTICLE, None)]
    if place_t is not None:
        target += place_t
    if object_t is not None:
        target += object_t + [(OBJECT_PARTICLE, None)]
    if adverb_t is not None:
        target.append(adverb_t)
    target.append(verb_t)
    return Pair(tuple(source), tuple(w for w, _ in target), tuple(i for _, i in target))


def sample_pairs(
    n: int, seed: int, split: str, unk_rate: float = 0.0, rng: np.random.Generator | None = None
) -> list[Pair]:
    """`n` sentence pairs of one split ("train" or "held-out"), reproducible from `seed`
    (or drawn from `rng` when given, for a training stream).

    Pairs may repeat within a sample (short sentences are few); the split never leaks.
    """
    if split not in ("train", "held-out"):
        raise ValueError(f"split must be 'train' or 'held-out', got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split == "held-out" and unk_rate:
        raise ValueError("held-out sentences use the lexicon only: unk_rate must be 0")
    rng = rng if rng is not None else np.random.default_rng(seed)
    want_held_out = split == "held-out"
    pairs: list[Pair] = []
    while len(pairs) < n:
        pair = random_pair(rng, unk_rate)
        if UNK in pair.source:
            # Sentences with <unk> are training material by construction (the held-out split
            # is defined over real sentences only).
            if not want_held_out:
                pairs.append(pair)
        elif is_held_out(pair.source_text) == want_held_out:
            pairs.append(pair)
    return pairs


# ---- shape scenes --------------------------------------------------------------------------
SHAPE_CLASSES = ("circle", "square", "triangle", "diamond", "plus", "cross", "ring", "frame")
IMAGE_SIZE = 32
# Channel mean / std of the generated scenes (measured on 20 000 of them, rounded): the normalisation the app
# applies before a model trained on them (vit-tiny, mae-tiny) sees an image; recorded in their config.json.
SCENE_PREPROCESSING = {
    "image_size": [IMAGE_SIZE, IMAGE_SIZE],
    "value_range": [0.0, 1.0],
    "mean": [0.5, 0.5, 0.5],
    "std": [0.3, 0.3, 0.3],
    "formula": "pixel = (value / 255 - mean) / std, per channel, RGB, (3, H, W)",
}
_SUPERSAMPLE = 4  # coverage is computed on a 4x finer grid, giving anti-aliased edges


@dataclass(frozen=True)
class Scenes:
    """A batch of generated scenes.

    images: (B, 3, H, W) float32 in [0, 1]; labels: (B,) long, indices into SHAPE_CLASSES;
    coverage: (B, H, W) float32 in [0, 1], the fraction of each pixel covered by the shape.
    """

    images: torch.Tensor
    labels: torch.Tensor
    coverage: torch.Tensor


def _inside(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Inside-the-shape test on sample points: dx, dy (b, n, n) offsets from the centre, r (b, 1, 1) half-size.

    Sizes are scaled per class so the areas are of the same order (a square of half-side r
    would otherwise dwarf a plus of the same r).
    """
    ax, ay = dx.abs(), dy.abs()
    half = torch.clamp(0.2 * r, min=1.0)  # half the stroke width of plus, cross, ring and frame
    if shape == "circle":
        return dx * dx + dy * dy <= r * r
    if shape == "square":
        return torch.maximum(ax, ay) <= 0.85 * r
    if shape == "triangle":  # apex up, base at the bottom
        return (dy >= -r) & (dy <= r) & (ax <= (dy + r) / 2)
    if shape == "diamond":
        return ax + ay <= 1.15 * r
    if shape == "plus":
        return ((ax <= half) & (ay <= r)) | ((ay <= half) & (ax <= r))
    if shape == "cross":  # the plus turned by 45 degrees
        u, v = (dx + dy).abs() / 2**0.5, (dx - dy).abs() / 2**0.5
        return ((u <= half) & (v <= r)) | ((v <= half) & (u <= r))
    if shape == "ring":
        d2 = dx * dx + dy * dy
        return (d2 <= r * r) & (d2 >= (r - 2 * half) ** 2)
    if shape == "frame":
        m = torch.maximum(ax, ay)
        return (m <= 0.85 * r) & (m >= 0.85 * r - 2 * half)
    raise ValueError(f"unknown shape {shape!r}: use one of {SHAPE_CLASSES}")


Uniform = Callable[..., torch.Tensor]


def _uniform(g: torch.Generator) -> Uniform:
    """uniform(*shape, low=, high=): numbers drawn from `g`, in the order the calls are made."""

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=g)

    return uniform


def _coverage(labels: torch.Tensor, r: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor, size: int) -> torch.Tensor:
    """(n, size, size) fraction of each pixel covered by shape `labels[i]` of half-size r[i] at (cx[i], cy[i]):
    the mean of k*k sub-pixel tests per pixel."""
    zero = torch.zeros(labels.shape[0], dtype=torch.long)
    return _window_coverage(labels, r, cx, cy, zero, zero, size)


def _window_coverage(
    labels: torch.Tensor,
    r: torch.Tensor,
    cx: torch.Tensor,
    cy: torch.Tensor,
    x0: torch.Tensor,
    y0: torch.Tensor,
    size: int,
) -> torch.Tensor:
    """Coverage (as `_coverage`) of the size x size window whose top-left pixel is (x0[i], y0[i]) (long, (n,))."""
    n, k = labels.shape[0], _SUPERSAMPLE
    fine = (torch.arange(size * k, dtype=torch.float32) + 0.5) / k  # sub-pixel centres, in pixels
    dx = fine.view(1, 1, -1) + x0.view(-1, 1, 1) - cx.view(-1, 1, 1)  # (n, 1, S*k)
    dy = fine.view(1, -1, 1) + y0.view(-1, 1, 1) - cy.view(-1, 1, 1)  # (n, S*k, 1)
    inside = torch.zeros(n, size * k, size * k)
    for c, shape in enumerate(SHAPE_CLASSES):
        idx = (labels == c).nonzero().flatten()
        if len(idx):
            inside[idx] = _inside(shape, dx[idx], dy[idx], r[idx].view(-1, 1, 1)).float()
    return torch.nn.functional.avg_pool2d(inside.unsqueeze(1), k).squeeze(1)  # (n, S, S)


def _background(n: int, size: int, uniform: Uniform, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(backgrounds (n, 3, S, S), their base colours (n, 3, 1, 1)): a base colour, a linear gradient, stripes
    at a random angle, pixel noise."""
    pix = torch.arange(size, dtype=torch.float32) / (size - 1)
    yy, xx = torch.meshgrid(pix, pix, indexing="ij")  # (S, S)
    base = uniform(n, 3, 1, 1)
    angle = uniform(n, 1, 1, 1, high=2 * torch.pi)
    ramp = (xx * torch.cos(angle) + yy * torch.sin(angle)) - 0.5  # (n, 1, S, S)
    gradient = ramp * uniform(n, 3, 1, 1, low=-0.3, high=0.3)
    stripe_angle = uniform(n, 1, 1, 1, high=torch.pi)
    freq = uniform(n, 1, 1, 1, low=4.0, high=12.0)
    phase = uniform(n, 1, 1, 1, high=2 * torch.pi)
    stripes = torch.sin(freq * 2 * torch.pi * (xx * torch.cos(stripe_angle) + yy * torch.sin(stripe_angle)) + phase)
    stripes = stripes * uniform(n, 3, 1, 1, low=0.0, high=0.12)
    return base + gradient + stripes + 0.04 * torch.randn(n, 3, size, size, generator=g), base


def _contrasting(base: torch.Tensor, uniform: Uniform) -> torch.Tensor:
    """(n, 3, 1, 1) colours at least 0.45 (RGB distance) from `base`: redrawn until far enough."""
    n = base.shape[0]
    fg = uniform(n, 3, 1, 1)
    for _ in range(100):
        close = (fg - base).flatten(1).norm(dim=1) < 0.45
        if not bool(close.any()):
            return fg
        fg = torch.where(close.view(-1, 1, 1, 1), uniform(n, 3, 1, 1), fg)
    raise RuntimeError("could not draw contrasting colours")  # pragma: no cover - probability ~ 0.5**100


def make_scenes(n: int, seed: int, generator: torch.Generator | None = None) -> Scenes:
    """`n` scenes, reproducible from `seed` (or drawn from `generator` when given, for training streams).

    Shape half-size 5..10 px, centred so the whole shape is inside the image; the foreground
    colour differs from the background's mean colour by at least 0.45 (RGB distance), so the
    class is always visible, but the background has stripes and gradients of its own.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    S = IMAGE_SIZE
    uniform = _uniform(g)

    labels = torch.randint(len(SHAPE_CLASSES), (n,), generator=g)
    r = uniform(n, low=5.0, high=10.0)
    cx = uniform(n) * (S - 2 * r - 2) + r + 1
    cy = uniform(n) * (S - 2 * r - 2) + r + 1
    coverage = _coverage(labels, r, cx, cy, S)
    background, base = _background(n, S, uniform, g)
    foreground = _contrasting(base, uniform) + 0.04 * torch.randn(n, 3, S, S, generator=g)

    alpha = coverage.unsqueeze(1)  # (n, 1, S, S)
    images = (background * (1 - alpha) + foreground * alpha).clamp(0.0, 1.0)
    return Scenes(images=images.contiguous(), labels=labels, coverage=coverage.contiguous())


def patch_coverage(coverage: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, H, W) pixel coverage -> (B, N) mean coverage of each patch, row-major like the ViT's patches."""
    pooled = torch.nn.functional.avg_pool2d(coverage.unsqueeze(1).float(), patch_size)  # (B, 1, rows, cols)
    return pooled.flatten(1)


# ---- detection scenes ------------------------------------------------------------------------
DETECTION_IMAGE_SIZE = 64
MAX_OBJECTS = 4
# The widest shape (the diamond) reaches 1.15 r from its centre; one more pixel for the anti-aliased edge.
_EXTENT_SCALE, _EXTENT_PAD = 1.15, 1.0
_GAP = 2.0  # px between two shapes' extents: no shape touches another, so each box can be checked by eye
_PLACEMENT_TRIES = 50
_BOX_COVERAGE = 0.25  # a pixel belongs to a shape's box when at least a quarter of it is covered
# Half-sizes a little smaller than make_scenes' 5..10, so that four shapes apart fit a 64-px picture nearly always.
_DETECTION_HALF_SIZE = (5.0, 8.0)
_WINDOW = 24  # px: 2 * (1.15 * 8 + 1) rounded up, plus a pixel either side for a centre between pixels


@dataclass(frozen=True)
class DetectionScenes:
    """A batch of scenes with several shapes, for detection.

    images: (B, 3, S, S) float32 in [0, 1]; counts: (B,) long, the shapes in each image (1..MAX_OBJECTS);
    labels: (B, MAX_OBJECTS) long, indices into SHAPE_CLASSES, -1 past counts; boxes: (B, MAX_OBJECTS, 4)
    float32 (x0, y0, x1, y1) in pixels, the tight box of the pixels each shape covers (zeros past counts).
    """

    images: torch.Tensor
    counts: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor

    def objects(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(labels (k,), boxes (k, 4) x0, y0, x1, y1 in pixels) of image i's k shapes."""
        k = int(self.counts[i])
        return self.labels[i, :k], self.boxes[i, :k]


def _boxes(coverage: torch.Tensor) -> torch.Tensor:
    """(n, S, S) coverage of one shape per image -> (n, 4) x0, y0, x1, y1 in pixels (x1, y1 exclusive)."""
    on = coverage >= _BOX_COVERAGE
    S = coverage.shape[-1]
    cols, rows = on.any(1).float(), on.any(2).float()  # (n, S): some pixel of that column / row is covered
    x0, y0 = cols.argmax(1).float(), rows.argmax(1).float()  # argmax: the first 1
    x1, y1 = S - cols.flip(1).argmax(1).float(), S - rows.flip(1).argmax(1).float()
    return torch.stack([x0, y0, x1, y1], dim=1)


def _place(
    wanted: torch.Tensor, extent: torch.Tensor, size: int, uniform: Uniform
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Centres (cx, cy (n, K)) for the first wanted[i] shapes of each picture, each shape's square of half-side
    extent (n, K) inside the picture and apart from the squares placed before it; placed (n, K) says which
    found room in _PLACEMENT_TRIES draws."""
    n, K = extent.shape
    cx, cy = torch.zeros(n, K), torch.zeros(n, K)
    placed = torch.zeros(n, K, dtype=torch.bool)
    for k in range(K):
        e, todo = extent[:, k], wanted > k
        for _ in range(_PLACEMENT_TRIES):
            x, y = uniform(n) * (size - 2 * e) + e, uniform(n) * (size - 2 * e) + e
            apart = ((x[:, None] - cx).abs() >= e[:, None] + extent + _GAP) | (
                (y[:, None] - cy).abs() >= e[:, None] + extent + _GAP
            )  # (n, K): this candidate's square and shape j's do not meet
            ok = todo & ~placed[:, k] & (apart | ~placed).all(1)
            cx[ok, k], cy[ok, k] = x[ok], y[ok]
            placed[ok, k] = True
            if bool((placed[:, k] | ~todo).all()):
                break
    return cx, cy, placed


def make_detection_scenes(n: int, seed: int, generator: torch.Generator | None = None) -> DetectionScenes:
    """`n` 64 x 64 scenes of 1 to 4 shapes each (reproducible from `seed`, or drawn from `generator`).

    The shapes of `make_scenes` (half-size 5..8 px, any of the eight classes, each its own colour at least
    0.45 from the background's base colour) on the same kind of background, placed apart: their extents
    never meet, so no shape hides another. A shape that finds no room in 50 tries is left out (rare: the
    count then is one less).
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    S, K = DETECTION_IMAGE_SIZE, MAX_OBJECTS
    uniform = _uniform(g)

    wanted = torch.randint(1, K + 1, (n,), generator=g)
    labels = torch.randint(len(SHAPE_CLASSES), (n, K), generator=g)
    r = uniform(n, K, low=_DETECTION_HALF_SIZE[0], high=_DETECTION_HALF_SIZE[1])
    extent = _EXTENT_SCALE * r + _EXTENT_PAD  # (n, K): half the side of a square holding the shape
    cx, cy, placed = _place(wanted, extent, S, uniform)
    background, base = _background(n, S, uniform, g)
    images = background
    boxes = torch.zeros(n, K, 4)
    batch = torch.arange(n).view(-1, 1, 1)
    span = torch.arange(_WINDOW)
    for k in range(K):
        # Sub-pixel tests in a window around the shape only (a 24-px square holds any shape of half-size 8 or
        # less): a sixth of the work of the whole picture, the same numbers.
        x0 = (cx[:, k] - _WINDOW / 2).floor().clamp(0, S - _WINDOW).long()
        y0 = (cy[:, k] - _WINDOW / 2).floor().clamp(0, S - _WINDOW).long()
        local = _window_coverage(labels[:, k], r[:, k], cx[:, k], cy[:, k], x0, y0, _WINDOW)
        coverage = torch.zeros(n, S, S)
        coverage[batch, (y0.view(-1, 1) + span).view(-1, _WINDOW, 1), (x0.view(-1, 1) + span).view(-1, 1, _WINDOW)] = (
            local * placed[:, k].view(-1, 1, 1)
        )
        foreground = _contrasting(base, uniform) + 0.04 * torch.randn(n, 3, S, S, generator=g)
        alpha = coverage.unsqueeze(1)  # (n, 1, S, S)
        images = images * (1 - alpha) + foreground * alpha
        boxes[:, k] = _boxes(coverage)

    # The placed shapes first, in the order they were placed; the rest is padding.
    order = torch.argsort((~placed).to(torch.int8), dim=1, stable=True)
    placed = torch.gather(placed, 1, order)
    labels = torch.where(placed, torch.gather(labels, 1, order), -1)
    boxes = torch.gather(boxes, 1, order[..., None].expand(-1, -1, 4)) * placed[..., None]
    return DetectionScenes(
        images=images.clamp(0.0, 1.0).contiguous(), counts=placed.sum(1), labels=labels, boxes=boxes.contiguous()
    )
