"""Turning a photo into a model's input tensor, exactly as the checkpoint's own image processor does."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .image_file import check_aspect

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImagePreprocessing"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImagePreprocessing:
    """Resize, centre-crop, rescale to [0, 1], normalise per channel.

    resize: ("shortest_edge", n) keeps the aspect ratio and makes the shorter side n pixels;
        ("exact", (H, W)) resizes to H x W; None keeps the size.
    crop: (H, W) of the centre crop, or None.
    resample: a PIL resampling filter number (2 bilinear, 3 bicubic).
    """

    resize: tuple | None = ("exact", (224, 224))
    crop: tuple[int, int] | None = None
    resample: int = 2
    rescale: float = 1 / 255
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD

    @classmethod
    def from_hf(cls, cfg: dict, default_size: int) -> ImagePreprocessing:
        """From a Hugging Face preprocessor_config.json."""
        resize: tuple[str, int | tuple[int, int]] | None = None
        if cfg.get("do_resize", True):
            size = cfg.get("size", default_size)
            if isinstance(size, int):
                resize = ("exact", (size, size))
            elif "shortest_edge" in size:
                resize = ("shortest_edge", int(size["shortest_edge"]))
            else:
                resize = ("exact", (int(size["height"]), int(size["width"])))
        crop = None
        if cfg.get("do_center_crop", False):
            c = cfg.get("crop_size", default_size)
            crop = (c, c) if isinstance(c, int) else (int(c["height"]), int(c["width"]))
        return cls(
            resize=resize,
            crop=crop,
            resample=int(cfg.get("resample", 2)),
            rescale=float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else 1.0,
            mean=tuple(cfg.get("image_mean", IMAGENET_MEAN)) if cfg.get("do_normalize", True) else (0.0, 0.0, 0.0),
            std=tuple(cfg.get("image_std", IMAGENET_STD)) if cfg.get("do_normalize", True) else (1.0, 1.0, 1.0),
        )

    def resized(self, image: Image.Image) -> Image.Image:
        """The image as the model sees it, before normalisation: resized and cropped, RGB. ImageError for a
        picture more elongated than image_file.MAX_ASPECT (its longer side would be resized to thousands of
        times the shorter's new size before the crop)."""
        check_aspect(*image.size)
        image = image.convert("RGB")
        if self.resize is not None:
            kind, size = self.resize
            if kind == "shortest_edge":
                w, h = image.size
                short, long = (w, h) if w <= h else (h, w)
                new_long = int(size * long / short)
                new_size = (size, new_long) if w <= h else (new_long, size)
            else:
                new_size = (size[1], size[0])
            if new_size != image.size:
                image = image.resize(new_size, resample=self.resample)
        if self.crop is not None:
            ch, cw = self.crop
            w, h = image.size
            top, left = int((h - ch) / 2), int((w - cw) / 2)
            image = image.crop((left, top, left + cw, top + ch))
        return image

    def normalise(self, pixels: torch.Tensor) -> torch.Tensor:
        """(pixels - mean) / std per channel: pixels (..., C, H, W), already rescaled (e.g. to [0, 1])."""
        shape = (len(self.mean), 1, 1)
        mean = torch.tensor(self.mean, dtype=pixels.dtype, device=pixels.device).view(shape)
        std = torch.tensor(self.std, dtype=pixels.dtype, device=pixels.device).view(shape)
        return (pixels - mean) / std

    def to_tensor(self, seen: Image.Image) -> torch.Tensor:
        """An image already resized and cropped (`resized`'s) -> float32 tensor (C, H, W): rescaled, normalised.
        A page holding the picture the model saw rebuilds the model's input from it (resizing it again would not
        give it back where the resize keeps the aspect ratio and the crop cuts)."""
        pixels = np.asarray(seen.convert("RGB"), dtype=np.float32) * np.float32(self.rescale)  # (H, W, C)
        return self.normalise(torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))))

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """PIL image -> float32 tensor (C, H, W): resized, cropped, rescaled, normalised."""
        return self.to_tensor(self.resized(image))
